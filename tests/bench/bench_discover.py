"""Discovery plus the ResourceSlice model for the largest simulated profile.

Measured: the median of N runs of ``discover`` (simulated NVML, ~36 link queries
per GPU, sysfs reads) followed by ``build_resource_slices`` and the limits check,
on ``synthetic-200gpu`` (200 GPUs, 100 NVLink pairs, two slices).

The floor is the least any implementation must do with the result: build the
same number of plain device dicts with the same attribute count, from values
already in memory. The ratio measured / floor says how much discovery and the
model cost on top of merely producing the objects (lower is better).
"""

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from driver.common.limits import validate_resource_slice
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices

PROFILE = "synthetic-200gpu"
RUNS = 15


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        node = SimulatedNode(PROFILE, "bench-node", Path(root))
        count = node.profile.count

        def measured() -> list[dict[str, Any]]:
            inventory = discover(node.nvml, sysfs_root=node.sysfs_root)
            slices = build_resource_slices(
                inventory, driver_name="gpu.nvidia.com", node_name="bench-node"
            )
            assert all(not validate_resource_slice(s) for s in slices)
            return slices

        slices = measured()
        devices = [d for s in slices for d in s["spec"]["devices"]]
        assert len(devices) == count
        width = len(devices[0]["attributes"])

        def floor() -> object:
            return [
                {
                    "name": f"gpu-{i}",
                    "attributes": {f"a{k}": {"string": "v"} for k in range(width)},
                    "capacity": {"memory": {"value": "1"}},
                }
                for i in range(count)
            ]

        discover_ms = _median_ms(lambda: discover(node.nvml, sysfs_root=node.sysfs_root), RUNS)
        total_ms = _median_ms(measured, RUNS)
        floor_ms = _median_ms(floor, RUNS * 4)
    print(f"profile {PROFILE}: {count} GPUs, {len(slices)} slices, {width} attributes per device")
    print(f"discover only           median {discover_ms:8.2f} ms  ({RUNS} runs)")
    print(f"discover + model + check median {total_ms:8.2f} ms  ({RUNS} runs)")
    print(f"floor: {count} plain dicts  median {floor_ms:8.3f} ms")
    print(f"ratio measured / floor: {total_ms / floor_ms:.1f}x")


if __name__ == "__main__":
    main()
