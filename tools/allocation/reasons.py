"""Why a claim cannot be allocated on a node, in sentences a person can act on.

Reasons are aggregated per request: which class or request selector rejected
how many devices and with what CEL result or error, devices taken by other
claims, untolerated taints, devices lacking a constraint's attribute, and the
shortfall (needed N, found M). When every request could be met on its own, the
reason is the combination: the constraints across requests.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable

from tools.allocation.capacity import Shortfall, format_quantity
from tools.allocation.claims import MAX_RESULTS, Constraint, Request
from tools.allocation.pools import AttributeValue, Device
from tools.allocation.search import NodeSearch, SearchAborted, device_label
from tools.allocation.selectors import Rejection
from tools.allocation.taintrules import taint_text

_LISTED = 4


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _names(items: Iterable[str]) -> str:
    listed = list(items)
    shown = ", ".join(listed[:_LISTED])
    if len(listed) > _LISTED:
        shown += f", ... (+{len(listed) - _LISTED} more)"
    return shown


def _value(value: AttributeValue | None) -> str:
    return "<missing>" if value is None else str(value[1])


def failure_reasons(search: NodeSearch, problem: str | None) -> list[str]:
    reasons: list[str] = [problem] if problem else []
    for pool in search.pools:
        if pool.incomplete:
            reasons.append(
                f"pool {pool.describe()} skipped: incomplete, {len(pool.slices)} of "
                f"{pool.expected_slices} slices of generation {pool.generation} present"
            )
        if pool.invalid is not None:
            reasons.append(f"pool {pool.describe()} skipped: invalid ({pool.invalid})")
    if not search.every:
        reasons.append("no devices are published for this node")
    per_group: list[tuple[list[str], bool]] = []
    for group in search.claim.groups:
        lines: list[str] = []
        short = True
        for request in group.alternatives:
            request_lines, request_short = _request_reasons(search, request)
            lines.extend(request_lines)
            short = short and request_short
        per_group.append((lines, short))
    explained = any(short for _, short in per_group)
    for lines, short in per_group:
        if short or not explained:
            reasons.extend(lines)
    if search.too_many:
        reasons.append(f"the allocation would exceed {MAX_RESULTS} devices, the limit per claim")
    elif not explained and problem is None:
        reasons.append(
            "no combination of devices satisfies all requests and constraints together "
            f"(searched {search.steps} steps)"
        )
        reasons.extend(_constraint_values(search))
    return reasons


def _counter_reason(search: NodeSearch, prefix: str, blocked: list[Device]) -> str:
    """Which shared counters the first blocked device lacks, and who consumes them."""
    device = blocked[0]
    left = search.counters_left[(device.driver, device.pool)]
    consumes = device.consumes()
    short = sorted(k for k, amount in left.items() if amount < consumes.get(k, amount - amount))
    holders = [
        f"{device_label(d, search.node)} (claim {search.in_use[d.key]})"
        for pool in search.pools
        if (pool.driver, pool.name) == (device.driver, device.pool)
        for d in pool.evaluated()
        if d.key in search.in_use and any(k in d.consumes() for k in short)
    ]
    counters = _names(f"{name} of {counter_set}" for counter_set, name in short)
    labels = _names(device_label(d, search.node) for d in blocked)
    return (
        f"{prefix}: {_plural(len(blocked), 'device')} without the shared counters they "
        f"consume [{labels}]: {device_label(device, search.node)} needs {counters}, held by "
        f"{_names(holders) or 'no other claim (more than the pool has)'}"
    )


def _request_reasons(search: NodeSearch, request: Request) -> tuple[list[str], bool]:
    """Lines about one request or subrequest, and whether it cannot be met on its own."""
    prefix = f"request {request.name}"
    devices = search.every if request.all_mode else search.usable
    rejected: dict[tuple[str, bool | str], list[Device]] = defaultdict(list)
    first: dict[tuple[str, bool | str], Rejection] = {}
    taken: list[Device] = []
    tainted: list[str] = []
    short_counters: list[Device] = []
    lacking: dict[int, list[Device]] = defaultdict(list)
    short_of: list[str] = []
    matching: list[Device] = []
    covering = search.covering(request)
    for device in devices:
        label = device_label(device, search.node)
        if not request.all_mode and not request.admin and device.key in search.in_use:
            taken.append(device)
            continue
        rejections = search.selectors.rejections(request.selectors, device)
        if rejections:
            for rejection in rejections:
                key = (rejection.selector.describe(), rejection.verdict)
                rejected[key].append(device)
                first.setdefault(key, rejection)
            continue
        if request.all_mode and not request.admin and device.key in search.in_use:
            taken.append(device)
            continue
        taint = request.blocking_taint(device)
        if taint is not None:
            tainted.append(f"{label} ({taint_text(taint)})")
            continue
        if not request.all_mode and not search.counters_fit(device):
            short_counters.append(device)
            continue
        missing = [c for c in covering if device.attribute(c.attribute) is None]
        if missing and not request.all_mode:
            for constraint in missing:
                lacking[constraint.position].append(device)
            continue
        lack = search.capacity_shortfall(request, device)
        if lack is not None:
            short_of.append(_short_of(search, device, lack))
            continue
        matching.append(device)

    lines: list[str] = []
    for key, group in rejected.items():
        rejection = first[key]
        line = f"{prefix}: {_plural(len(group), 'device')} rejected by {rejection.describe()}"
        if rejection.is_error:
            line += f" [{_names(device_label(d, search.node) for d in group)}]"
        lines.append(line)
    if taken:
        labels = (device_label(d, search.node) for d in taken)
        count = _plural(len(taken), "device")
        held = Counter(search.in_use[d.key] for d in taken)
        holders = _names(f"{claim} ({n})" for claim, n in held.most_common())
        lines.append(
            f"{prefix}: {count} allocated to other claims [{_names(labels)}], held by {holders}"
        )
    if tainted:
        lines.append(
            f"{prefix}: {_plural(len(tainted), 'device')} tainted without a matching "
            f"toleration [{_names(tainted)}]"
        )
    if short_of:
        lines.extend(f"{prefix}: {line}" for line in short_of[:_LISTED])
        if len(short_of) > _LISTED:
            lines.append(
                f"{prefix}: ... and {len(short_of) - _LISTED} more devices without the capacity"
            )
    if short_counters:
        lines.append(_counter_reason(search, prefix, short_counters))
    for constraint in covering:
        missing_devices = lacking.get(constraint.position)
        if missing_devices:
            labels = (device_label(d, search.node) for d in missing_devices)
            lines.append(
                f"{constraint.describe()}: {_plural(len(missing_devices), 'device')} for "
                f"{prefix} lack attribute {constraint.attribute} [{_names(labels)}]"
            )

    if request.all_mode:
        return lines + _all_reasons(search, request, prefix, taken, tainted), _all_short(
            search, request, taken, tainted
        )
    if len(matching) < request.count:
        lines.append(f"{prefix}: needed {request.count}, found {len(matching)} matching")
        return lines, True
    short = False
    for constraint in covering:
        values = Counter(d.attribute(constraint.attribute) for d in matching)
        if constraint.kind == "matchAttribute":
            value, most = values.most_common(1)[0]
            if most < request.count:
                lines.append(
                    f"{constraint.describe()}: no value is shared by {request.count} devices "
                    f"for {prefix} (largest group: {most} with {constraint.attribute}="
                    f"{_value(value)})"
                )
                short = True
        elif len(values) < request.count:
            lines.append(
                f"{constraint.describe()}: only {_plural(len(values), 'distinct value')} among "
                f"devices for {prefix}, needed {request.count}"
            )
            short = True
    return lines, short


def _short_of(search: NodeSearch, device: Device, lack: Shortfall) -> str:
    label = device_label(device, search.node)
    if lack.needed is None:
        return f"device {label} has no capacity {lack.capacity}"
    needs = f"needs {format_quantity(lack.needed)} of {lack.capacity}"
    if lack.over_policy:
        return f"{needs}, more than the request policy of {label} allows"
    free = format_quantity(lack.free) if lack.free is not None else "none"
    line = f"{needs}, {free} free on {label}"
    use = search.shared.get(device.key)
    if use is not None and use.holders:
        line += f", used by claims {_names(use.holders)}"
    return line


def _all_devices(search: NodeSearch, request: Request) -> list[Device] | None:
    try:
        return search.all_devices(request)
    except SearchAborted:
        return None  # already the node's first reason


def _all_short(
    search: NodeSearch, request: Request, taken: list[Device], tainted: list[str]
) -> bool:
    selected = _all_devices(search, request)
    return selected is None or not selected or bool(taken) or bool(tainted)


def _all_reasons(
    search: NodeSearch, request: Request, prefix: str, taken: list[Device], tainted: list[str]
) -> list[str]:
    selected = _all_devices(search, request)
    if selected is None:
        return []
    if not selected:
        return [f"{prefix}: allocationMode All needs at least one matching device, found none"]
    if taken or tainted:
        return [
            f"{prefix}: allocationMode All needs every matching device ({len(selected)}), "
            f"but {len(taken) + len(tainted)} cannot be allocated"
        ]
    return []


def _constraint_values(search: NodeSearch) -> list[str]:
    """For constraints over several requests: the values each request could offer."""
    lines: list[str] = []
    for constraint in search.claim.constraints:
        covered = [
            r
            for g in search.claim.groups
            for r in g.alternatives
            if constraint.covers(r) and not r.all_mode
        ]
        if len(covered) < 2:
            continue
        parts = [f"{r.name}: {_offered(search, constraint, r)}" for r in covered]
        lines.append(f"{constraint.describe()}: values per request: " + "; ".join(parts))
    return lines


def _offered(search: NodeSearch, constraint: Constraint, request: Request) -> str:
    values = Counter(
        c.device.attribute(constraint.attribute)
        for c in search.candidates(request)
        if c.poison is None
    )
    if not values:
        return "none"
    shown = [f"{_value(v)} (x{n})" for v, n in values.most_common(_LISTED)]
    return _names(shown) if len(values) <= _LISTED else ", ".join(shown) + ", ..."


# (what a reason says, the advice), most specific first: the first that the most
# unallocatable nodes share is the one line `explain` ends with.
_ADVICE = (
    (
        "no devices are published",
        "the node publishes no devices: is the plugin pod there ready (kubectl -n "
        "gpu-dra-driver get pods -o wide), and does `kubectl get resourceslices` list it?",
    ),
    (
        "CEL runtime error",
        "a selector fails on the devices: guard optional attributes with `in` "
        '("numaNode" in device.attributes["gpu.nvidia.com"]) and run `gpu-dra validate`',
    ),
    (
        "allocated to other claims",
        "the devices that fit are taken: delete or wait for the claims holding them "
        "(kubectl get resourceclaims -A), or add nodes",
    ),
    (
        "by DeviceTaintRule",
        "the devices that fit are drained by a DeviceTaintRule: delete it when the work on "
        "them is done (kubectl delete devicetaintrule <name>), or tolerate its taint",
    ),
    (
        "tainted without a matching toleration",
        "the devices that fit are tainted: add a toleration to the request or fix the device",
    ),
    (
        "no value is shared by",
        "no node has that many devices sharing the constraint's attribute: ask for fewer "
        "devices, or use nodes whose devices share it (NVLink, NUMA node, PCIe root)",
    ),
    (
        "lack attribute",
        "some devices lack the constraint's attribute: select only devices that have it",
    ),
    (
        "rejected by",
        "no device passes the selectors: compare them with what the nodes publish "
        "(gpu-dra discover -o table, kubectl get resourceslices -o yaml)",
    ),
    (
        " free on ",
        "the devices that fit have too little capacity left: ask for less, or wait for the "
        "claims sharing them to end",
    ),
    (
        "needed",
        "not enough devices on any one node: ask for fewer, or add larger nodes",
    ),
)


def advice(reasons_per_node: Iterable[Iterable[str]]) -> str | None:
    """One line for the most common cause among nodes that cannot take the claim."""
    counts: Counter[int] = Counter()
    for reasons in reasons_per_node:
        text = "\n".join(reasons)
        for index, (marker, _) in enumerate(_ADVICE):
            if marker in text:
                counts[index] += 1
                break
    if not counts:
        return None
    best = max(counts, key=lambda i: (counts[i], -i))
    return _ADVICE[best][1]
