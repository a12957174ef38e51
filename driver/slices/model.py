"""The ResourceSlice model: pure functions from a node's devices to its pool.

The devices come from a driver's device kinds in ``resource.k8s.io/v1`` JSON form
(camelCase, attribute values as ``{"string": ...}``, ``{"int": ...}``,
``{"version": ...}``), in publishing order, with the shared counter sets they consume.
The pool is named after the node. Pools larger than one slice holds are split
deterministically; the generation is the caller's (the controller's) business, passed
through. Nothing here knows a GPU: the GPU driver's devices are built by
``drivers.gpu.resourceslice``, the ComputeDomain driver's by its kinds.
"""

import re
from collections.abc import Sequence
from typing import Any

from driver.common.limits import MAX_COUNTER_SETS, max_devices

API_VERSION = "resource.k8s.io/v1"


def split_devices(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive chunks of at most :func:`~driver.common.limits.max_devices`;
    one empty for none."""
    limit = max_devices(devices)
    chunks = [list(devices[i : i + limit]) for i in range(0, len(devices), limit)]
    return chunks or [[]]


INDEX_MIN_LENGTH = 5
_MAX_NAME_LENGTH = 253  # a DNS subdomain, as every object name


def index_length(slice_count: int) -> int:
    """Hex digits of the name prefix: enough for ``slice_count - 1``, at least five."""
    return max(INDEX_MIN_LENGTH, len(f"{max(slice_count - 1, 0):x}"))


def generate_name(index: int, slice_count: int, driver_name: str, node_name: str) -> str:
    """Upstream's ``generateName`` prefix for slice ``index`` of a pool of ``slice_count``."""
    return f"{index:0{index_length(slice_count)}x}-{driver_name}-{node_name}-"


def slice_name(index: int, slice_count: int, driver_name: str, node_name: str) -> str | None:
    """The one naming rule: the fixed name of slice ``index``, as the controller writes it
    and ``gpu-dra discover`` prints it; None when it would exceed 253 characters (the
    object then gets :func:`generate_name` and the server's random suffix)."""
    name = generate_name(index, slice_count, driver_name, node_name)[:-1]
    return name if len(name) <= _MAX_NAME_LENGTH else None


def slice_metadata(
    index: int, slice_count: int, driver_name: str, node_name: str
) -> dict[str, str]:
    """``{"name": ...}``, or ``{"generateName": ...}`` when no fixed name fits."""
    name = slice_name(index, slice_count, driver_name, node_name)
    if name is not None:
        return {"name": name}
    return {"generateName": generate_name(index, slice_count, driver_name, node_name)}


def counters_apart_for(server_version: str) -> bool:
    """Whether shared counters go in slices of their own: Kubernetes 1.35 and later
    (``Only one of Devices and SharedCounters can be set``); 1.34 wants them in the slice
    of the devices that consume them. An unreadable version is taken as a current one."""
    found = re.match(r"v?(\d+)\.(\d+)", server_version)
    return found is None or (int(found.group(1)), int(found.group(2))) >= (1, 35)


def layout(
    devices: Sequence[dict[str, Any]],
    counter_sets: Sequence[dict[str, Any]] = (),
    *,
    counters_apart: bool = True,
) -> list[dict[str, Any]]:
    """The slice specs' ``devices``/``sharedCounters`` parts, in publishing order.

    1.35+ (``counters_apart``): slices of at most 8 counter sets, then the devices in
    chunks (64 a slice once any consumes counters). 1.34: each counter set in one slice
    with every device that consumes it (at most 32 counters a slice, so one set of
    dynamic MIG's 15), then the devices that consume none.
    """
    if not counter_sets:
        return [{"devices": chunk} for chunk in split_devices(devices)]
    if counters_apart:
        sets = list(counter_sets)
        parts: list[dict[str, Any]] = [
            {"sharedCounters": sets[i : i + MAX_COUNTER_SETS]}
            for i in range(0, len(sets), MAX_COUNTER_SETS)
        ]
        if devices:
            parts.extend({"devices": chunk} for chunk in split_devices(devices))
        return parts
    by_set: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in counter_sets}
    plain: list[dict[str, Any]] = []
    for device in devices:
        consumed = device.get("consumesCounters") or ()
        if consumed:
            by_set[consumed[0]["counterSet"]].append(device)
        else:
            plain.append(device)
    parts = [{"sharedCounters": [s], "devices": by_set[s["name"]]} for s in counter_sets]
    if plain:
        parts.extend({"devices": chunk} for chunk in split_devices(plain))
    return parts


def build_slices(
    devices: Sequence[dict[str, Any]],
    *,
    driver_name: str,
    node_name: str,
    generation: int = 1,
    counter_sets: Sequence[dict[str, Any]] = (),
    counters_apart: bool = True,
) -> list[dict[str, Any]]:
    """The pool of ``devices`` (in publishing order) and the counter sets they consume,
    split into as many slices as it needs (:func:`layout`)."""
    parts = layout(devices, counter_sets, counters_apart=counters_apart)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": slice_metadata(i, len(parts), driver_name, node_name),
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(parts),
                },
                **part,
            },
        }
        for i, part in enumerate(parts)
    ]
