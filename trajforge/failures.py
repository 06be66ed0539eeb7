"""Failure classes: what kind of failure an errors.jsonl line records, and what a --resume does about it.

- endpoint: the server refused this request for good (400, 404, 422 and other 4xx, a context overflow):
  sending it again gets the same answer, so a resume sends it only with --retry_failed=endpoint.
- transient: 5xx, 429, connections, timeouts (after the client's retries), a bad reply, a crash of the
  runner or of a worker: a resume tries it again, up to --max_attempts tries in all.
- environment: the sandbox, the image, the task's setup, a tool server: retried like transient.
- budget: --max_cost (or a cost limit that met a reply without a cost) stopped it before its end: pending,
  not a try, retried by a resume with room in the budget.
- interrupted: Ctrl-C or SIGTERM stopped it: pending, no errors.jsonl line, not a try.
"""

from __future__ import annotations

ENDPOINT, TRANSIENT, ENVIRONMENT, BUDGET, INTERRUPTED = "endpoint", "transient", "environment", "budget", "interrupted"
CLASSES = (ENDPOINT, TRANSIENT, ENVIRONMENT, BUDGET)  # the classes of errors.jsonl lines
RETRYABLE = (ENDPOINT,)  # what --retry_failed may name: the classes a resume does not send again by itself
RETRIED_STATUSES = ("408", "409", "429")  # 4xx answers worth another try (model/retry.py retries them too)
ENVIRONMENT_TYPES = ("environment", "setup_failed", "tool_server")
BUDGET_TYPES = ("budget", "cost_unknown", "no_token_ids")  # SpendStop reasons: money/errors.py, model/tokens.py


def failure_class(error_type: str) -> str:
    """The class of an errors.jsonl line's `error_type` (api_http_400, context_length, environment,
    crash_KeyError, worker_died, ...); lines written before classes existed are classed the same way."""
    if error_type == "context_length":
        return ENDPOINT
    status = error_type.removeprefix("api_http_")
    if status != error_type and status.startswith("4") and status not in RETRIED_STATUSES:
        return ENDPOINT
    if error_type in ENVIRONMENT_TYPES:
        return ENVIRONMENT
    if error_type in BUDGET_TYPES:
        return BUDGET
    return TRANSIENT


def counts_as_try(error_class: str) -> bool:
    """Whether a sample that ended so used one of its --max_attempts (a budget stop did not)."""
    return error_class in (ENDPOINT, TRANSIENT, ENVIRONMENT)
