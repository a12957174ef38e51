"""CEL selectors compiled once and evaluated at most once per kind of device.

A selector's verdict on a device does not depend on what else is allocated, so
the scheduler caches it per device and request; here the cache is keyed by
expression, so a class used by several requests, or a node retried, costs no
second evaluation. Beyond that, a selector reads only the entries of a device it
names (:func:`tools.cel.selector_reads`): devices that agree on those share
one verdict, so the GPUs of a thousand nodes of one instance type, which differ in
their UUIDs and NVLink domains, cost one evaluation for a selector reading neither.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tools.allocation.pools import Device
from tools.cel import (
    CelCompileError,
    CelError,
    CelUnsupportedError,
    Read,
    compile_selector,
    selector_reads,
)


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


_MISSING = object()
_SCALARS = (str, int, float, bool)


def _frozen(value: object) -> object:
    # Device JSON: repr is one-to-one on str, numbers, bools, None, lists and dicts.
    return value if value is None or value is _MISSING or type(value) in _SCALARS else repr(value)


class _Lookup:
    """Reads one selector's entries of a device: the key its verdict depends on alone."""

    __slots__ = ("_by_driver", "_reads")

    def __init__(self, reads: frozenset[Read]) -> None:
        self._reads = sorted(reads)
        # Per driver: (capacity table?, the bare name if the domain is the driver's, the
        # qualified name), as CelDevice looks an entry up.
        self._by_driver: dict[str, list[tuple[bool, str | None, str]]] = {}

    def key(self, device: Device) -> tuple[object, ...] | None:
        data = device.data
        attributes = data.get("attributes") or {}
        capacity = data.get("capacity") or {}
        if not isinstance(attributes, Mapping) or not isinstance(capacity, Mapping):
            return None  # malformed: judged on its own
        driver = device.driver
        entries = self._by_driver.get(driver)
        if entries is None:
            entries = [
                (field == "capacity", name if domain == driver else None, f"{domain}/{name}")
                for field, domain, name in self._reads
            ]
            self._by_driver[driver] = entries
        parts: list[object] = [driver, bool(data.get("allowMultipleAllocations", False))]
        for of_capacity, bare, qualified in entries:
            table = capacity if of_capacity else attributes
            if bare is not None:
                parts.append(_frozen(table.get(bare, _MISSING)))
            parts.append(_frozen(table.get(qualified, _MISSING)))
        return tuple(parts)


class Selectors:
    """Compiles each distinct expression once and remembers its verdict per device, and
    per kind of device where the expression's reads are known."""

    def __init__(self) -> None:
        self._compiled: dict[str, _Compiled | SelectorProblem] = {}
        self._verdicts: dict[str, dict[int, Verdict]] = {}
        self._lookups: dict[str, _Lookup | None] = {}
        self._shared: dict[str, dict[tuple[object, ...], Verdict]] = {}

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
            reads = None if isinstance(compiled, SelectorProblem) else selector_reads(expression)
            self._lookups[expression] = None if reads is None else _Lookup(reads)
            self._shared[expression] = {}
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
        lookup = self._lookups[expression]
        key = None if lookup is None else lookup.key(device)
        shared = self._shared[expression]
        result: Verdict | None = None if key is None else shared.get(key)
        if result is None:
            try:
                result = bool(compiled.matches(device.cel()))
            except CelError as exc:
                result = str(exc) or type(exc).__name__
            if key is not None:
                shared[key] = result
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
