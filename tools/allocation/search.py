"""The backtracking search for one claim on one node, as the scheduler does it.

Semantics follow the stable allocator (k8s.io/dynamic-resource-allocation
structured/internal/stable/allocator_stable.go, ``allocateOne`` and
``allocateDevice``): requests in order, ``firstAvailable`` alternatives in
order, devices in pool/slice order; a device is skipped when already taken (by
another claim unless admin access, or by this claim), when a selector is false,
when it has a NoSchedule/NoExecute taint no toleration matches, or when adding
it breaks a constraint, or when the counters it consumes (KEP-4815 partitionable
devices) are not left in its pool after what other claims' devices and this claim's
earlier picks consume; the first complete solution wins. Devices of a slice with
per-device node selection that sit on another node are skipped only after the
selectors ran on them (incubating allocator, ``isSelectable``). A CEL runtime error
on a device the search reaches stops allocation on the node, as Allocate
returns that error.

Two prunings keep it fast without changing the answer. Each request's devices
are picked in increasing position: the scheduler tries every order, but since
constraints judge a set, the first solution in its order is the same set in
increasing order. And a request whose candidates cannot reach its count (or
whose constraint values cannot) fails without search.

Consumable capacity (incubating allocator): every device's capacities are checked
against what a request needs (:mod:`tools.allocation.capacity`); a device with
``allowMultipleAllocations`` is never taken whole, so other claims' shares and this
claim's other requests may use it as long as its capacity lasts.
"""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from driver.common.quantity import Quantity
from tools.allocation.capacity import Shortfall, Use, consumption, shortfall
from tools.allocation.claims import (
    MAX_RESULTS,
    Constraint,
    ParsedClaim,
    Request,
    RequestGroup,
)
from tools.allocation.pools import Cluster, Counters, Device, DeviceKey, Pool
from tools.allocation.selectors import Selectors

DEFAULT_BUDGET = 100_000
_ZERO = Quantity.parse("0")


class SearchAborted(Exception):
    """The scheduler's Allocate would return this error for the node."""


class BudgetExceeded(Exception):
    """The search took more steps than allowed; the answer is unknown."""


@dataclass(slots=True)
class Candidate:
    device: Device
    # Set when a selector errs on this device: reaching it stops allocation.
    poison: str | None = None


def _stopped(rejection: str, device: str) -> str:
    # As Allocate returns the error: the scheduler gives up on the node.
    return f"allocation stopped on this node at device {device}: {rejection}"


def device_label(device: Device, node: str | None) -> str:
    """A device's name in a reason: bare when its pool is the node's own pool."""
    return device.name if device.pool == node else f"{device.pool}/{device.name}"


class NodeSearch:
    """Everything known about allocating one claim on one node, and the search itself."""

    def __init__(
        self,
        node: str | None,
        cluster: Cluster,
        claim: ParsedClaim,
        selectors: Selectors,
        in_use: Mapping[DeviceKey, str],  # taken devices -> the claim holding each
        budget: int,
        shared: Mapping[DeviceKey, Use] | None = None,  # shares other claims hold
        *,
        pools: list[Pool] | None = None,  # cluster.pools(node), when already gathered
    ) -> None:
        self.node = node
        self.pools: list[Pool] = cluster.pools(node) if pools is None else pools
        labels = cluster.labels(node)
        self.every: list[Device] = []
        # Devices of complete, valid pools: the only ones ExactCount requests draw from.
        self.usable: list[Device] = []
        # The same two with the devices of per-device slices that are on other nodes, in
        # the scheduler's order: it evaluates selectors on them before checking the node.
        self._every_evaluated: list[Device] = []
        self._usable_evaluated: list[Device] = []
        self._elsewhere: set[int] = set()
        for pool in self.pools:
            devices = list(pool.devices(node, labels))
            evaluated = list(pool.evaluated())
            here = {d.index for d in devices}
            self._elsewhere.update(d.index for d in evaluated if d.index not in here)
            self.every += devices
            self._every_evaluated += evaluated
            if pool.usable:
                self.usable += devices
                self._usable_evaluated += evaluated
        self.claim = claim
        self.selectors = selectors
        self.in_use = in_use
        self.shared: Mapping[DeviceKey, Use] = shared or {}
        self.budget = budget
        self.steps = 0
        self.too_many = False
        self.results: list[tuple[Request, Device]] = []
        # Per result, what its share consumes; None for a device taken whole.
        self.shares: list[dict[str, Quantity] | None] = []
        self._held: dict[int, Use] = {}  # shares this search took, by device index
        self._share_counts: dict[int, int] = {}  # how many, by device index
        self._reserved: list[bool] = []  # per result: whether it took its device's counters
        self.chosen: dict[str, Request] = {}
        self._allocating: set[int] = set()
        self._candidates: dict[int, list[Candidate]] = {}
        self._feasible: dict[int, bool] = {}
        self._all: dict[int, list[Device]] = {}
        self._covering: dict[int, list[Constraint]] = {}
        # Counters left per pool once other claims' devices took theirs.
        self.counters_left: dict[tuple[str, str], Counters] = {}
        for pool in self.pools:
            if not pool.counters:
                continue
            left = dict(pool.counters)
            for device in pool.evaluated():
                # A device others hold whole or in shares took its counters once.
                if device.key in in_use or device.key in self.shared:
                    for key, amount in device.consumes().items():
                        if key in left:
                            left[key] = left[key] - amount
            self.counters_left[(pool.driver, pool.name)] = left

    def counters_fit(self, device: Device) -> bool:
        """Whether its pool's counters stay non-negative with ``device`` added.

        As the scheduler checks it: every counter of the pool, not only the device's, so a
        pool that other claims over-consume (a negative counter) gives no more devices that
        consume counters. A device that consumes none is not checked.
        """
        consumes = device.consumes()
        left = self.counters_left.get((device.driver, device.pool))
        if not consumes or left is None or self._counters_taken(device):
            return True
        zero = _ZERO
        return all(not (amount < consumes.get(key, zero)) for key, amount in left.items())

    def _counters_taken(self, device: Device) -> bool:
        """A shared device some share already uses has its counters (upstream skips the
        check: the first share took them, the others take none)."""
        return device.shared and (
            device.key in self.shared or self._share_counts.get(device.index, 0) > 0
        )

    def _take_counters(self, device: Device, sign: int) -> None:
        left = self.counters_left.get((device.driver, device.pool))
        if left is None:
            return
        for key, amount in device.consumes().items():
            if key in left:  # a counter the pool lacks is not counted, as upstream
                left[key] = left[key] - amount if sign > 0 else left[key] + amount

    def capacity_shortfall(
        self, request: Request, device: Device, *, allocating: bool = False
    ) -> Shortfall | None:
        """Why a share for ``request`` does not fit ``device`` (None: it fits), next to
        other claims' shares and, with ``allocating``, this search's."""
        mine = self._held.get(device.index) if allocating else None
        use = self.shared.get(device.key)
        if not request.capacity and use is None and mine is None:
            # Nothing asked, nothing held: a share at the defaults always fits (the API
            # server keeps every default within the capacity), so skip the arithmetic.
            return None
        held: list[Mapping[str, Quantity]] = []
        if use is not None:
            held.append(use.amounts)
        if mine is not None:
            held.append(mine.amounts)
        return shortfall(request.capacity, device.capacities(), held)

    def covering(self, request: Request) -> list[Constraint]:
        cached = self._covering.get(id(request))
        if cached is None:
            cached = [c for c in self.claim.constraints if c.covers(request)]
            self._covering[id(request)] = cached
        return cached

    def candidates(self, request: Request) -> list[Candidate]:
        """Devices the search may try for an ExactCount request, in order."""
        cached = self._candidates.get(id(request))
        if cached is not None:
            return cached
        covering = self.covering(request)
        out: list[Candidate] = []
        for device in self._usable_evaluated:
            if not request.admin and device.key in self.in_use:
                continue  # checked first by the scheduler: a taken device is never evaluated
            rejection = self.selectors.first_rejection(request.selectors, device)
            if rejection is not None:
                if rejection.is_error:
                    label = device_label(device, self.node)
                    out.append(Candidate(device, _stopped(rejection.describe(), label)))
                continue
            if device.index in self._elsewhere:
                continue
            if request.blocking_taint(device) is not None:
                continue
            if any(device.attribute(c.attribute) is None for c in covering):
                continue  # can never join a constraint it lacks the attribute of
            if self.capacity_shortfall(request, device) is not None:
                continue
            out.append(Candidate(device))
        self._candidates[id(request)] = out
        return out

    def feasible(self, request: Request) -> bool:
        """False only when the request cannot succeed whatever else is chosen."""
        known = self._feasible.get(id(request))
        if known is not None:
            return known
        cands = self.candidates(request)
        result = True
        if not any(c.poison for c in cands):
            devices = [c.device for c in cands]
            result = len(devices) >= request.count
            for constraint in self.covering(request):
                values = Counter(d.attribute(constraint.attribute) for d in devices)
                if constraint.kind == "matchAttribute":
                    result = result and max(values.values(), default=0) >= request.count
                else:
                    result = result and len(values) >= request.count
        self._feasible[id(request)] = result
        return result

    def all_devices(self, request: Request) -> list[Device]:
        """What ``All`` means on this node: every device the selectors accept."""
        cached = self._all.get(id(request))
        if cached is not None:
            return cached
        for pool in self.pools:
            if pool.incomplete:
                raise SearchAborted(
                    f"request {request.name} asks for all devices, but resource pool "
                    f"{pool.describe()} is incomplete ({len(pool.slices)} of "
                    f"{pool.expected_slices} slices present)"
                )
            if pool.invalid is not None:
                raise SearchAborted(
                    f"request {request.name} asks for all devices, but resource pool "
                    f"{pool.describe()} is invalid ({pool.invalid})"
                )
        out: list[Device] = []
        for device in self._every_evaluated:
            rejection = self.selectors.first_rejection(request.selectors, device)
            if rejection is None:
                if (
                    device.index not in self._elsewhere
                    and self.capacity_shortfall(request, device) is None
                ):
                    out.append(device)
            elif rejection.is_error:
                label = device_label(device, self.node)
                raise SearchAborted(_stopped(rejection.describe(), label))
        self._all[id(request)] = out
        return out

    def run(self) -> bool:
        """Search; True with ``results`` and ``chosen`` filled, or False.

        Raises SearchAborted or BudgetExceeded.
        """
        try:
            # The scheduler works out every "All" request before searching, and counts
            # the devices the claim needs at least with them.
            minimum = 0
            for group in self.claim.groups:
                minimum += min(
                    len(self.all_devices(r)) if r.all_mode else r.count for r in group.alternatives
                )
            if minimum > MAX_RESULTS:
                raise SearchAborted(
                    f"number of requested devices {minimum} exceeds the claim limit of "
                    f"{MAX_RESULTS}"
                )
            return self._group(0)
        finally:
            for constraint in self.claim.constraints:
                constraint.reset()

    def _group(self, index: int) -> bool:
        groups: list[RequestGroup] = self.claim.groups
        if index == len(groups):
            return True
        group = groups[index]
        for request in group.alternatives:
            if self._slot(index, request, 0, 0):
                self.chosen[group.name] = request
                return True
        return False

    def _step(self) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise BudgetExceeded(f"search budget exceeded ({self.budget} steps)")

    def _slot(self, group: int, request: Request, taken: int, start: int) -> bool:
        self._step()
        if request.all_mode:
            return self._take_all(group, request)
        if taken == request.count:
            return self._group(group + 1)
        if taken == 0:
            if len(self.results) + request.count > MAX_RESULTS:
                self.too_many = True
                return False
            if not self.feasible(request):
                return False
        cands = self.candidates(request)
        for position in range(start, len(cands)):
            cand = cands[position]
            device = cand.device
            if device.index in self._allocating:
                continue
            if cand.poison is not None:
                raise SearchAborted(cand.poison)
            if self._push(request, device) is not None:
                continue
            if self._slot(group, request, taken + 1, position + 1):
                return True
            self._pop(request, device)
        return False

    def _take_all(self, group: int, request: Request) -> bool:
        devices = self.all_devices(request)
        if not devices:
            return False  # All needs at least one device
        if len(self.results) + len(devices) > MAX_RESULTS:
            self.too_many = True
            return False
        taken: list[Device] = []
        complete = True
        for device in devices:
            if (
                device.index in self._allocating
                or (not request.admin and device.key in self.in_use)
                or request.blocking_taint(device) is not None
                or not self.counters_fit(device)
            ):
                complete = False  # the order does not matter: one missing device ends it
                break
            failed = self._push(request, device)
            if failed == "capacity":
                complete = False
                break
            if failed is not None:
                label = device_label(device, self.node)
                raise SearchAborted(
                    f"request {request.name}: cannot add device {label} because a claim "
                    "constraint would not be satisfied"
                )
            taken.append(device)
        if complete and self._group(group + 1):
            return True
        for device in reversed(taken):
            self._pop(request, device)
        return False

    def _push(self, request: Request, device: Device) -> str | None:
        """Take ``device`` for ``request``; None, or what refused it: "constraint" or
        "capacity" (checked in the scheduler's order, constraints first)."""
        reserve = bool(device.consumes()) and not self._counters_taken(device)
        if reserve and not self.counters_fit(device):
            return "counters"
        added: list[Constraint] = []
        for constraint in self.covering(request):
            if not constraint.add(device.attribute(constraint.attribute)):
                for done in added:
                    done.remove()
                return "constraint"
            added.append(constraint)
        share: dict[str, Quantity] | None = None
        if device.shared:
            if self.capacity_shortfall(request, device, allocating=True) is not None:
                for done in added:
                    done.remove()
                return "capacity"
            share = consumption(request.capacity, device.capacities())
            self._held.setdefault(device.index, Use()).add(share)
            self._share_counts[device.index] = self._share_counts.get(device.index, 0) + 1
        else:
            self._allocating.add(device.index)
        if reserve:
            self._take_counters(device, +1)
        self.results.append((request, device))
        self.shares.append(share)
        self._reserved.append(reserve)
        return None

    def _pop(self, request: Request, device: Device) -> None:
        for constraint in self.covering(request):
            constraint.remove()
        share = self.shares.pop()
        if share is not None:
            self._held[device.index].subtract(share)
            self._share_counts[device.index] -= 1
        else:
            self._allocating.discard(device.index)
        if self._reserved.pop():
            self._take_counters(device, -1)
        self.results.pop()
