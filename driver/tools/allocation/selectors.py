"""CEL selectors compiled once and evaluated at most once per device.

A selector's verdict on a device does not depend on what else is allocated, so
the scheduler caches it per device and request; here the cache is keyed by
expression, so a class used by several requests, or a node retried, costs no
second evaluation.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from driver.tools.allocation.pools import Device
from driver.tools.cel import CelCompileError, CelError, CelUnsupportedError, compile_selector


class _Compiled(Protocol):
    def matches(self, device: Any, /) -> bool: ...


# A verdict: True/False, or the text of the CEL evaluation error.
Verdict = bool | str

_SHOWN_EXPRESSION = 80


def short(expression: str) -> str:
    """An expression as it appears in a reason: one line, at most 80 characters."""
    text = " ".join(expression.split())
    return text if len(text) <= _SHOWN_EXPRESSION else text[: _SHOWN_EXPRESSION - 3] + "..."


@dataclass(frozen=True, slots=True)
class SelectorRef:
    """One selector of a class or request, and how to name it in a reason."""

    owner: str  # "class gpu.nvidia.com" or "request gpus"
    position: int
    expression: str

    def describe(self) -> str:
        return f"{self.owner} selector #{self.position} ({short(self.expression)})"


@dataclass(frozen=True, slots=True)
class Rejection:
    """The selector that decided against a device, and what it returned."""

    selector: SelectorRef
    verdict: Verdict  # False, or the CEL error text

    @property
    def is_error(self) -> bool:
        return isinstance(self.verdict, str)

    def describe(self) -> str:
        outcome = f"CEL runtime error: {self.verdict}" if isinstance(self.verdict, str) else "false"
        return f"{self.selector.describe()}: {outcome}"


class SelectorProblem(Exception):
    """A selector that cannot be compiled (invalid, or not supported by this tool)."""


class Selectors:
    """Compiles each distinct expression once and remembers its verdict per device."""

    def __init__(self) -> None:
        self._compiled: dict[str, _Compiled | SelectorProblem] = {}
        self._verdicts: dict[str, dict[int, Verdict]] = {}

    def check(self, ref: SelectorRef) -> None:
        """Compile now; raise SelectorProblem naming the selector if it does not compile."""
        compiled = self._compile(ref.expression)
        if isinstance(compiled, SelectorProblem):
            raise SelectorProblem(f"{ref.describe()}: {compiled}")

    def _compile(self, expression: str) -> _Compiled | SelectorProblem:
        compiled = self._compiled.get(expression)
        if compiled is None:
            try:
                compiled = compile_selector(expression)
            except CelUnsupportedError as exc:
                compiled = SelectorProblem(f"not supported by this tool: {exc}")
            except CelCompileError as exc:
                compiled = SelectorProblem(f"CEL compile error: {exc}")
            self._compiled[expression] = compiled
            self._verdicts[expression] = {}
        return compiled

    def verdict(self, expression: str, device: Device) -> Verdict:
        cache = self._verdicts.get(expression)
        if cache is not None:
            cached = cache.get(device.index)
            if cached is not None:
                return cached
        compiled = self._compile(expression)
        if isinstance(compiled, SelectorProblem):
            raise compiled
        result: Verdict
        try:
            result = bool(compiled.matches(device.cel()))
        except CelError as exc:
            result = str(exc) or type(exc).__name__
        self._verdicts[expression][device.index] = result
        return result

    def first_rejection(self, refs: Sequence[SelectorRef], device: Device) -> Rejection | None:
        """The first selector (in order) that does not return true, as the scheduler stops there."""
        for ref in refs:
            result = self.verdict(ref.expression, device)
            if result is not True:
                return Rejection(ref, result)
        return None

    def rejections(self, refs: Sequence[SelectorRef], device: Device) -> list[Rejection]:
        """Every selector that does not return true: what a person fixing the claim needs,
        where the scheduler stops at the first."""
        found = []
        for ref in refs:
            result = self.verdict(ref.expression, device)
            if result is not True:
                found.append(Rejection(ref, result))
        return found


def selector_refs(owner: str, selectors: Sequence[Mapping[str, Any]] | None) -> list[SelectorRef]:
    """The CEL selectors of a class or request; a selector without ``cel`` is a problem."""
    refs: list[SelectorRef] = []
    for position, selector in enumerate(selectors or ()):
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expression, str) or not expression:
            raise SelectorProblem(
                f"{owner} selector #{position}: CEL expression empty (unsupported selector type?)"
            )
        refs.append(SelectorRef(owner, position, expression))
    return refs
