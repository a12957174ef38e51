"""The demo's cluster: the local API server, Node objects, plugin processes, their slices."""

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from driver.common.errors import RetryableError
from sandbox.demo._nodes import NodePlugin, NodeSpec

_POLL_S = 0.1


def node_object(spec: NodeSpec) -> dict[str, Any]:
    """The Node a kubelet would register (the plugin's slices name it as their owner)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "node.kubernetes.io/instance-type": spec.profile,
                "nvidia.com/gpu.present": "true",
            },
        },
    }


def complete_pools(slices: Sequence[Mapping[str, Any]], driver: str) -> dict[str, int]:
    """Node -> device count, for nodes whose newest pool generation has all its slices (pure)."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") == driver and spec.get("nodeName"):
            by_node.setdefault(spec["nodeName"], []).append(spec)
    complete: dict[str, int] = {}
    for node, specs in by_node.items():
        newest = max(int(s["pool"].get("generation") or 0) for s in specs)
        current = [s for s in specs if int(s["pool"].get("generation") or 0) == newest]
        expected = int(current[0]["pool"].get("resourceSliceCount") or 1)
        devices = sum(len(s.get("devices") or ()) for s in current)
        if len(current) == expected and devices:
            complete[node] = devices
    return complete


async def list_slices(api: Any) -> list[dict[str, Any]]:
    from kubernetes.aio import client

    listed = await client.ResourceV1Api(api).list_resource_slice()
    items: list[dict[str, Any]] = api.sanitize_for_serialization(listed)["items"]
    return items


async def wait_for_slices(
    api: Any, plugins: Sequence[NodePlugin], driver: str, timeout_s: float
) -> list[dict[str, Any]]:
    """Until every node's pool is published in full; the slices then."""
    deadline = time.monotonic() + timeout_s
    while True:
        slices = await list_slices(api)
        complete = complete_pools(slices, driver)
        missing = [p for p in plugins if p.name not in complete]
        if not missing:
            return slices
        for plugin in missing:
            plugin.check_alive("publishing its ResourceSlices")
        if time.monotonic() > deadline:
            names = ", ".join(p.name for p in missing)
            raise RetryableError(
                f"no complete ResourceSlice pool for {names} after {timeout_s:g}s; the log of "
                f"{missing[0].name}'s plugin ends with:\n{missing[0].log_tail()}"
            )
        await asyncio.sleep(_POLL_S)


def slice_rows(slices: Sequence[Mapping[str, Any]], driver: str) -> list[list[object]]:
    """One table row per slice: name, node, pool, generation, devices, models, NVLink."""
    rows: list[list[object]] = []
    for obj in sorted(slices, key=lambda s: str(s["metadata"]["name"])):
        spec = obj["spec"]
        devices = spec.get("devices") or ()
        models = sorted(
            {
                str(d.get("attributes", {}).get("productName", {}).get("string", "?"))
                for d in devices
            }
        )
        nvlinked = sum(1 for d in devices if "nvlinkDomain" in (d.get("attributes") or {}))
        rows.append(
            [
                obj["metadata"]["name"],
                spec.get("nodeName", "-"),
                spec["pool"]["name"],
                spec["pool"].get("generation", 0),
                len(devices),
                ", ".join(models),
                f"{nvlinked}/{len(devices)} in an NVLink domain"
                if spec["driver"] == driver
                else "",
            ]
        )
    return rows
