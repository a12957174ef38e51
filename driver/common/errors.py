"""Error classes, split by whether retrying can help.

Callers decide what to do from the class alone: a ``RetryableError`` is worth
another try after a backoff, a ``PermanentError`` is not until something
(configuration, hardware, an object in the API server) changes.
"""


class DriverError(Exception):
    """Base of every error this project raises on purpose."""


class RetryableError(DriverError):
    """A transient condition: the same call may succeed later."""


class PermanentError(DriverError):
    """The input or the environment is wrong: retrying the same call will fail again."""
