"""What the slice controllers of a fleet cost the API server.

(a) N node controllers (``SliceController``, asyncio tasks in this process, through the
real ``kubernetes.aio`` client) against one local API server running on its own event
loop in a thread: requests and writes per node for the initial publish and for a quiet
period afterwards (every controller rediscovers several times), and wall time. The
floor, measured in the same run: the same N slices created directly, one POST each, at
the same concurrency, then deleted again. Targets: 1 slice write per node, then 0.

(b) One GPU disappears on one node: the requests that change causes (target: 1 write).

Usage: bench_publish.py [NODES] (default 1000).
"""

import asyncio
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes.aio import client

from driver.kube.rest import Client
from driver.kube.session import Session
from driver.nvml.simulated import SimulatedNode
from driver.slices import SliceController, plan
from drivers.gpu.kinds import gpu_kinds, node_devices
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.resourceslice import build_resource_slices
from sandbox.apiserver import RequestRecord, ThreadedApiServer

DRIVER = "gpu.nvidia.com"
NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
QUIET_RESYNCS = 3
TIMEOUT = 300.0


def summary(records: list[RequestRecord], nodes: int) -> str:
    kinds = Counter(f"{r.verb} {r.resource.rsplit('/', 1)[-1]}" for r in records)
    writes = sum(
        n for k, n in kinds.items() if k.split()[0] in {"create", "update", "patch", "delete"}
    )
    detail = ", ".join(f"{k}={n / nodes:g}" for k, n in sorted(kinds.items()))
    return f"requests/node={len(records) / nodes:.2f} writes/node={writes / nodes:.2f}  [{detail}]"


def slice_writes(records: list[RequestRecord]) -> int:
    return sum(
        1
        for r in records
        if r.resource.endswith("resourceslices") and r.verb in {"create", "update", "delete"}
    )


async def floor(api: Session, inventory: Inventory, server: ThreadedApiServer) -> float:
    """N slice creates straight from one client, concurrently; then removed again."""
    raw = Client(api, request_timeout=60)
    bodies = [
        plan(
            build_resource_slices(inventory, driver_name=DRIVER, node_name=f"node-{i}"),
            [],
            driver_name=DRIVER,
            node_name=f"node-{i}",
            node_uid="00000000-0000-0000-0000-000000000000",
        ).creates[0]
        for i in range(NODES)
    ]
    for body in bodies:
        body["metadata"].pop("ownerReferences")
    start = time.perf_counter()
    created = await asyncio.gather(
        *(
            raw.request(
                "POST",
                "/apis/resource.k8s.io/v1/resourceslices",
                verb="create",
                resource="resourceslices",
                body=b,
            )
            for b in bodies
        )
    )
    elapsed = time.perf_counter() - start
    for obj in created:
        server.delete("resourceslices", obj["metadata"]["name"])
    return elapsed


async def main() -> None:
    # Quiet: 1000 controllers stopping at once make the lease releases time out in the
    # thread-hosted server, and each says so.
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNode("p5.48xlarge", "template", Path(tmp))
        inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    fewer = Inventory(inventory.driver_version, inventory.cuda_driver_version, inventory.gpus[:-1])
    hardware: dict[str, Inventory] = {f"node-{i}": inventory for i in range(NODES)}

    server = ThreadedApiServer(bookmark_interval=30.0).start()
    try:
        server.seed(
            *({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}} for name in hardware)
        )
        configuration = client.Configuration(host=server.url)
        # One watch per node stays open: the pool must hold them all.
        configuration.connection_pool_maxsize = 2 * NODES + 50
        async with Session(configuration) as api:
            floor_s = await floor(api, inventory, server)

            def discoverer(name: str) -> Any:
                async def discover_node() -> Inventory:
                    return hardware[name]

                return discover_node

            controllers = {
                name: SliceController(
                    api,
                    node_name=name,
                    driver_name=DRIVER,
                    devices=node_devices(
                        discoverer(name), node_name=name, kinds=gpu_kinds()
                    ).published,
                    resync_period=3600,
                    request_timeout=60,
                    identity=name,
                )
                for name in hardware
            }
            server.requests.clear()
            start = time.perf_counter()
            tasks = [asyncio.create_task(c.run()) for c in controllers.values()]
            await asyncio.wait_for(
                asyncio.gather(*(c.published.wait() for c in controllers.values())), TIMEOUT
            )
            publish_s = time.perf_counter() - start
            initial = server.requests.snapshot()

            server.requests.clear()
            start = time.perf_counter()
            for _ in range(QUIET_RESYNCS):
                await asyncio.gather(*(c.resync() for c in controllers.values()))
            quiet_s = time.perf_counter() - start
            quiet = server.requests.snapshot()

            server.requests.clear()
            hardware["node-0"] = fewer
            await controllers["node-0"].resync()
            changed = server.requests.snapshot()
            slices = server.objects("resourceslices")

            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        server.stop()

    print(f"nodes={NODES} gpus/node={len(inventory.gpus)} slices={len(slices)}")
    print(
        f"(a) initial publish: wall={publish_s:.2f}s  "
        f"floor (bare creates)={floor_s:.2f}s  ratio={publish_s / floor_s:.2f}"
    )
    print(f"    {summary(initial, NODES)}")
    print(f"    slice writes/node={slice_writes(initial) / NODES:.2f} (target 1)")
    print(f"(a) quiet period: {QUIET_RESYNCS} resyncs of every node in {quiet_s:.2f}s")
    print(f"    {summary(quiet, NODES)}")
    print(f"    slice writes={slice_writes(quiet)} (target 0)")
    print(f"(b) one GPU gone on one node: {summary(changed, 1)}")
    print(f"    slice writes={slice_writes(changed)} (target 1)")
    ok = (
        slice_writes(initial) == NODES
        and slice_writes(quiet) == 0
        and slice_writes(changed) == 1
        and len(slices) == NODES
    )
    print("targets met" if ok else "TARGETS MISSED")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
