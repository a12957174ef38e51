"""The errors of the CEL environment, classed for callers by whether a retry can help."""

from driver.common.errors import PermanentError


def position(text: str, offset: int) -> str:
    """``line:column`` (both 1-based, columns in code points) of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{line}:{column}"


class CelError(PermanentError):
    """Base of every CEL error: the same expression on the same device fails again."""


class _PositionedError(CelError):
    def __init__(self, message: str, expression: str = "", offset: int = 0) -> None:
        super().__init__(message)
        self.expression = expression
        self.offset = offset


class CelCompileError(_PositionedError):
    """The expression is not valid Kubernetes CEL; the message starts with ``line:column``."""


class CelUnsupportedError(_PositionedError):
    """Valid Kubernetes CEL that this tool cannot evaluate: a limit of ours, not of the input.

    Deliberately not a :class:`CelCompileError`, so nobody reports it as invalid by accident.
    """


class CelEvalError(CelError):
    """Evaluation failed (no such key, overflow, no matching overload, cost limit, ...)."""
