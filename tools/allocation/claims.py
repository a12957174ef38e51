"""A claim's device requests and constraints, parsed once and checked against the classes.

The checks mirror what makes the scheduler's ``Allocate`` fail for every node
(stable allocator ``validateDeviceRequest`` and the constraint setup): a
request without a class, a class that does not exist, a selector without CEL,
an unknown constraint type, more devices than a claim can hold.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.common.quantity import Quantity
from tools.allocation.capacity import CapacityProblem, quantity
from tools.allocation.pools import AttributeValue, Device
from tools.allocation.selectors import SelectorProblem, SelectorRef, selector_refs

# resourceapi.AllocationResultsMaxSize: a claim's allocation holds at most 32 devices.
MAX_RESULTS = 32


class ClaimProblem(Exception):
    """Something about the claim (or a class it names) that fails allocation on every node."""


@dataclass(slots=True, eq=False)
class Request:
    """A request with ``exactly``, or one ``firstAvailable`` subrequest."""

    name: str  # as allocation results name it: "gpus" or "gpus/big"
    base: str
    sub: str | None
    class_name: str
    device_class: Mapping[str, Any]
    all_mode: bool
    count: int
    selectors: list[SelectorRef]  # the class's first, then the request's: the scheduler's order
    admin: bool
    tolerations: list[Mapping[str, Any]]
    # capacity.requests: what one share of a device must hold (consumable capacity).
    capacity: dict[str, Quantity] = field(default_factory=dict)

    def blocking_taint(self, device: Device) -> Mapping[str, Any] | None:
        """The first NoSchedule/NoExecute taint no toleration matches.

        Taints with effect None (or an unknown effect) never block allocation.
        """
        for taint in device.taints:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(_tolerates(t, taint) for t in self.tolerations):
                return taint
        return None


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    # k8s.io/dynamic-resource-allocation/resourceclaim ToleratesTaint.
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


@dataclass(slots=True)
class RequestGroup:
    """One entry of spec.devices.requests: a single request or its ordered alternatives."""

    name: str
    alternatives: list[Request]
    first_available: bool


@dataclass(slots=True, eq=False)
class Constraint:
    """matchAttribute or distinctAttribute over some requests (all when none are named)."""

    position: int
    kind: str  # "matchAttribute" or "distinctAttribute"
    attribute: str
    requests: frozenset[str]
    _values: list[AttributeValue] = field(default_factory=list)

    def covers(self, request: Request) -> bool:
        # A constraint naming a request covers all its subrequests (stable allocator, matches()).
        if not self.requests:
            return True
        return request.base in self.requests or request.name in self.requests

    def add(self, value: AttributeValue | None) -> bool:
        """Track one more device; False (and nothing tracked) if it breaks the constraint."""
        if value is None:
            return False  # a device without the attribute cannot satisfy either kind
        if self.kind == "matchAttribute":
            if self._values and value != self._values[0]:
                return False
        elif value in self._values:
            return False
        self._values.append(value)
        return True

    def remove(self) -> None:
        self._values.pop()

    def reset(self) -> None:
        self._values.clear()

    def describe(self) -> str:
        scope = ", ".join(sorted(self.requests)) if self.requests else "all requests"
        return f"constraint #{self.position} {self.kind} {self.attribute} (requests: {scope})"


@dataclass(slots=True)
class ParsedClaim:
    groups: list[RequestGroup]
    constraints: list[Constraint]
    config: list[Mapping[str, Any]]


def claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ResourceClaimSpec of a ResourceClaim, a ResourceClaimTemplate or a bare spec."""
    kind = obj.get("kind")
    if kind == "ResourceClaimTemplate":
        spec = (obj.get("spec") or {}).get("spec")
    elif kind == "ResourceClaim":
        spec = obj.get("spec")
    elif kind is None and "devices" in obj:
        spec = obj
    else:
        raise ClaimProblem(f"expected a ResourceClaim or ResourceClaimTemplate, got kind {kind!r}")
    if not isinstance(spec, Mapping):
        raise ClaimProblem(f"{kind}: no claim spec")
    return spec


def parse_claim(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> ParsedClaim:
    try:
        return _parse_claim(spec, classes)
    except (AttributeError, TypeError, ValueError) as exc:
        # A field of the wrong type (count: "four", requests: {}): say so, do not crash.
        raise ClaimProblem(f"malformed claim spec: {exc}") from exc


def _parse_claim(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> ParsedClaim:
    devices = spec.get("devices") or {}
    groups = [_group(r, classes) for r in devices.get("requests") or ()]
    minimum = sum(min(_minimum(a) for a in g.alternatives) for g in groups)
    if minimum > MAX_RESULTS:
        raise ClaimProblem(
            f"number of requested devices {minimum} exceeds the claim limit of {MAX_RESULTS}"
        )
    constraints: list[Constraint] = []
    for position, raw in enumerate(devices.get("constraints") or ()):
        names = frozenset(str(n) for n in raw.get("requests") or ())
        if raw.get("matchAttribute"):
            kind, attribute = "matchAttribute", str(raw["matchAttribute"])
        elif raw.get("distinctAttribute"):
            kind, attribute = "distinctAttribute", str(raw["distinctAttribute"])
        else:
            raise ClaimProblem(f"constraint #{position}: empty constraint (unsupported type?)")
        constraints.append(Constraint(position, kind, attribute, names))
    return ParsedClaim(groups, constraints, list(devices.get("config") or ()))


def _minimum(request: Request) -> int:
    return 1 if request.all_mode else request.count


def _group(raw: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> RequestGroup:
    name = str(raw.get("name") or "")
    if raw.get("firstAvailable"):
        subs = [
            _request(s, classes, base=name, sub=str(s.get("name") or ""), admin_allowed=False)
            for s in raw["firstAvailable"]
        ]
        return RequestGroup(name, subs, first_available=True)
    exactly = raw.get("exactly")
    if not isinstance(exactly, Mapping):
        raise ClaimProblem(f"request {name}: neither exactly nor firstAvailable")
    return RequestGroup(
        name,
        [_request(exactly, classes, base=name, sub=None, admin_allowed=True)],
        first_available=False,
    )


def _request(
    raw: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    *,
    base: str,
    sub: str | None,
    admin_allowed: bool,
) -> Request:
    name = f"{base}/{sub}" if sub is not None else base
    class_name = str(raw.get("deviceClassName") or "")
    if not class_name:
        raise ClaimProblem(f"request {name}: missing device class name")
    device_class = classes.get(class_name)
    if device_class is None:
        raise ClaimProblem(f"request {name}: device class {class_name} not found")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimProblem(f"request {name}: unsupported allocation mode {mode}")
    try:
        refs = selector_refs(
            f"class {class_name}", (device_class.get("spec") or {}).get("selectors")
        ) + selector_refs(f"request {name}", raw.get("selectors"))
    except SelectorProblem as exc:
        raise ClaimProblem(str(exc)) from exc
    count = int(raw.get("count") or 1)
    if mode == "ExactCount" and count < 1:
        raise ClaimProblem(f"request {name}: count must be at least 1, got {count}")
    tolerations: Sequence[Mapping[str, Any]] = raw.get("tolerations") or ()
    capacity: dict[str, Quantity] = {}
    for key, value in ((raw.get("capacity") or {}).get("requests") or {}).items():
        try:
            capacity[str(key)] = quantity(value, f"request {name}: capacity.requests.{key}")
        except CapacityProblem as exc:
            raise ClaimProblem(str(exc)) from exc
    return Request(
        name=name,
        base=base,
        sub=sub,
        class_name=class_name,
        device_class=device_class,
        all_mode=mode == "All",
        count=count,
        selectors=refs,
        admin=admin_allowed and bool(raw.get("adminAccess")),
        tolerations=list(tolerations),
        capacity=capacity,
    )
