"""Kubernetes' CEL environment for DRA device selectors, compiled to Python closures.

``compile_selector`` parses and type-checks once (rejecting what the API server rejects, with
``line:column`` positions); ``CelSelector.matches`` then evaluates a device in microseconds.
"""

from functools import lru_cache

from tools.cel._compile import Compiler
from tools.cel._conjuncts import split_conjuncts
from tools.cel._device import CelDevice
from tools.cel._errors import CelCompileError, CelError, CelEvalError, CelUnsupportedError
from tools.cel._eval import Ctx
from tools.cel._lint import Lint, Schema, lint_ast, suggest
from tools.cel._parser import parse
from tools.cel._reads import Read, Reads, reads, selector_reads
from tools.cel._runtime import type_name
from tools.cel._types import BOOL, DYN

__all__ = [
    "CelCompileError",
    "CelDevice",
    "CelError",
    "CelEvalError",
    "CelSelector",
    "CelUnsupportedError",
    "Lint",
    "Read",
    "Reads",
    "Schema",
    "compile_selector",
    "lint_selector",
    "reads",
    "selector_reads",
    "split_conjuncts",
    "suggest",
]

_SAFETY_NET = (ArithmeticError, ValueError, TypeError, LookupError, RecursionError)


class CelSelector:
    """A compiled selector expression; immutable and reusable across devices."""

    __slots__ = ("_fn", "expression")

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            code = Compiler(expression).compile(parse(expression))
        except RecursionError:
            # A long operator chain (1 + 1 + ... + 1) nests as deep as it is long.
            raise CelCompileError(
                "1:1: expression nests too deeply for this tool", expression, 0
            ) from None
        if code.ty not in (BOOL, DYN):
            raise CelCompileError(
                f"1:1: must evaluate to bool or the unknown type, not {code.ty}", expression, 0
            )
        self._fn = code.fn

    def matches(self, device: CelDevice) -> bool:
        """Whether the device is selected; CelEvalError when the expression fails on it."""
        try:
            result = self._fn(Ctx(device))
        except CelEvalError:
            raise
        except RecursionError as err:
            raise CelEvalError("expression too deeply nested to evaluate") from err
        except _SAFETY_NET as err:
            raise CelEvalError(f"evaluation failed: {err}") from err
        if result is True or result is False:
            return result
        raise CelEvalError(f"expression evaluated to {type_name(result)}, not bool")

    def __repr__(self) -> str:
        return f"CelSelector({self.expression!r})"


def compile_selector(expression: str) -> CelSelector:
    """Compile a selector; CelCompileError if invalid, CelUnsupportedError if beyond this tool.

    Compiled selectors are immutable, so the same expression returns the same object.
    """
    if not isinstance(expression, str):
        raise CelCompileError(f"1:1: expression must be a string, not {type(expression).__name__}")
    return _compile_cached(expression)


@lru_cache(maxsize=4096)
def _compile_cached(expression: str) -> CelSelector:
    return CelSelector(expression)


def lint_selector(expression: str, schema: Schema) -> list[Lint]:
    """What in a selector can never select a device of the drivers ``schema`` describes.

    Only for an expression that parses; a parse error is :func:`compile_selector`'s to report.
    """
    try:
        tree = parse(expression)
    except (CelError, RecursionError):
        return []
    try:
        return lint_ast(expression, tree, schema)
    except RecursionError:
        return []
