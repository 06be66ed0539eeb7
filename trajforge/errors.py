"""The exceptions every layer raises and the run's edge catches: bad input (exit 2, nothing sent) and
an environment that could not be set up."""


class UsageError(Exception):
    """Bad arguments or dataset: printed as one message, exit status 2, no request sent."""


class BadReply(Exception):
    """A 200 answer without a usable choice (OpenRouter sends upstream errors this way), a stream cut
    off or carrying data that is not JSON, a reply too large to keep: tried again, never cached.
    Here, below the model client, because the money wrapper reads replies too (money/metered.py)."""


class SetupError(Exception):
    """An environment could not be set up: the prompt fails and is retried on --resume."""


class SetupFailed(Exception):
    """The task's own setup failed (its `setup` command, its image's build): the sample fails as
    `setup_failed`, no model call made."""
