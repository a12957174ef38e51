"""What compiled selectors run on: the evaluation context, the budget, and the macros.

The runtime budget approximates cel-go's cost model: every comprehension iteration costs the
number of AST nodes in its body (cel-go charges about one unit per evaluated node); nothing
else is charged, so a selector without loops is never stopped.
"""

from collections.abc import Callable
from typing import Any

from tools.cel import _runtime as rt
from tools.cel._device import CelDevice
from tools.cel._errors import CelEvalError

# Kubernetes' CELSelectorExpressionMaxCost (pkg/apis/resource/types.go).
MAX_COST = 1_000_000

Fn = Callable[["Ctx"], Any]


class CostLimitError(CelEvalError):
    """The runtime budget ran out; never absorbed by ``&&``/``||``/``all``/``exists``."""


class Ctx:
    """Per-evaluation state: the device, bound variables and the cost spent."""

    __slots__ = ("cost", "device", "vars")

    def __init__(self, device: CelDevice) -> None:
        self.device = device
        self.vars: dict[str, Any] = {}
        self.cost = 0


# What ``&&``, ``||``, ``all`` and ``exists`` absorb: CEL errors, and the Python errors the
# runtime lets through by oversight (they are errors of the expression all the same).
LOGIC_ERRORS = (CelEvalError, ArithmeticError, ValueError, TypeError, LookupError, RecursionError)

UNSET = object()


class Thunk:
    """A cel.bind value not computed yet, with the variables in scope where it was bound."""

    __slots__ = ("fn", "scope")

    def __init__(self, fn: Fn, scope: dict[str, Any]) -> None:
        self.fn = fn
        self.scope = scope


def force(c: Ctx, name: str) -> Any:
    value = c.vars[name]
    if type(value) is not Thunk:
        return value
    current = c.vars
    c.vars = value.scope
    try:
        result = value.fn(c)
    finally:
        c.vars = current
    c.vars[name] = result
    return result


def restore(c: Ctx, name: str, saved: Any) -> None:
    if saved is UNSET:
        c.vars.pop(name, None)
    else:
        c.vars[name] = saved


def _charge(c: Ctx, cost: int) -> None:
    c.cost += cost
    if c.cost > MAX_COST:
        raise CostLimitError(
            f"operation cancelled: actual cost limit exceeded ({MAX_COST}, Kubernetes' "
            "CELSelectorExpressionMaxCost; this tool approximates the cost model)"
        )


def quantifier(var: str, fr: Fn, body: Fn, cost: int, want: bool) -> Fn:
    def quantifier(c: Ctx) -> bool:
        items = rt.iterate(fr(c))
        saved = c.vars.get(var, UNSET)
        error: Exception | None = None
        try:
            for item in items:
                _charge(c, cost)
                c.vars[var] = item
                try:
                    value = body(c)
                except CostLimitError:
                    raise
                except LOGIC_ERRORS as err:
                    error = error or err
                    continue
                if value is want:
                    return bool(want)
                if type(value) is not bool:
                    error = error or rt.no_overload("exists" if want else "all", value)
        finally:
            restore(c, var, saved)
        if error is not None:
            raise error
        return not want

    return quantifier


def exists_one(var: str, fr: Fn, body: Fn, cost: int) -> Fn:
    def exists_one(c: Ctx) -> bool:
        items = rt.iterate(fr(c))
        saved = c.vars.get(var, UNSET)
        count = 0
        try:
            for item in items:
                _charge(c, cost)
                c.vars[var] = item
                value = body(c)
                if type(value) is not bool:
                    raise rt.no_overload("exists_one", value)
                count += value
        finally:
            restore(c, var, saved)
        return count == 1

    return exists_one


def filter(var: str, fr: Fn, body: Fn, cost: int) -> Fn:
    def filter_(c: Ctx) -> list[Any]:
        items = rt.iterate(fr(c))
        saved = c.vars.get(var, UNSET)
        out = []
        try:
            for item in items:
                _charge(c, cost)
                c.vars[var] = item
                value = body(c)
                if type(value) is not bool:
                    raise rt.no_overload("filter", value)
                if value:
                    out.append(item)
        finally:
            restore(c, var, saved)
        return out

    return filter_


def map_macro(var: str, fr: Fn, fns: list[Fn], cost: int) -> Fn:
    transform = fns[-1]
    predicate = fns[0] if len(fns) == 2 else None

    def map_(c: Ctx) -> list[Any]:
        items = rt.iterate(fr(c))
        saved = c.vars.get(var, UNSET)
        out = []
        try:
            for item in items:
                _charge(c, cost)
                c.vars[var] = item
                if predicate is not None:
                    keep = predicate(c)
                    if type(keep) is not bool:
                        raise rt.no_overload("map", keep)
                    if not keep:
                        continue
                out.append(transform(c))
        finally:
            restore(c, var, saved)
        return out

    return map_
