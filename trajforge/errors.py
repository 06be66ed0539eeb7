"""The exceptions every layer raises and the run's edge catches: bad input (exit 2, nothing sent) and
an environment that could not be set up."""


class UsageError(Exception):
    """Bad arguments or dataset: printed as one message, exit status 2, no request sent."""


class SetupError(Exception):
    """An environment could not be set up: the prompt fails and is retried on --resume."""
