"""NVIDIA's GPU kubelet plugin on the real kubelet, and ours after it on the same node (issue #40).

By hand, not in ``make e2e`` (it needs NVIDIA's plugin, which ``make nvidia-plugin`` builds
from a mirror of its repository)::

    GPU_DRA_E2E_RUN=/tmp/nk flock /tmp/gpu-dra-e2e.lock .venv/bin/python -m tests.e2e.netns \\
        .venv/bin/python -m pytest -o addopts="-q -ra" -p no:cacheprovider \\
        tests/e2e/test_level3_nvidia.py

The kubelet registers NVIDIA's plugin, a pod whose claim names NVIDIA's chart's DeviceClass
runs with the GPU device node NVIDIA's CDI spec gives it, and the kubelet unprepares the claim
when the pod is gone; then ours replaces it under the same driver name and the same pod runs.
How the plugins run: :mod:`tests.e2e.side_by_side`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.e2e import side_by_side
from tests.e2e.installed import LEVEL3
from tests.e2e.kube import await_until
from tests.e2e.side_by_side import GPUS, NS, SideBySide

pytestmark = [
    *LEVEL3,
    pytest.mark.timeout(900),
    pytest.mark.skipif(side_by_side.missing() is not None, reason=str(side_by_side.missing())),
]

# What the pod prints: the GPU device nodes it got and NVIDIA_VISIBLE_DEVICES.
REPORT = "ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ' '; echo; exec sleep 3600"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def side() -> AsyncIterator[SideBySide]:
    async with side_by_side.side_by_side("l3nv") as node:
        yield node


async def _one_gpu_pod(side: SideBySide, name: str) -> list[str]:
    """The pod runs; the GPU device nodes it lists; gone again, its claim unprepared."""
    body = side.pod_body(name, REPORT)
    side.cp.call("POST", f"/api/v1/namespaces/{NS}/pods", body)
    try:
        await await_until(f"{name} Running", lambda: side.phase(name) == "Running", 120)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {side.describe(name)}") from exc
    assert len(side.specs()) == 1  # one claim prepared: its CDI spec on the node
    listed = await await_until(f"{name}'s report", lambda: side.pod_log(name), 30)
    await side.delete_pod(name)
    return str(listed).split()


async def test_nvidias_plugin_runs_a_pod_through_the_real_kubelet(side: SideBySide) -> None:
    seconds = await side.switch(side.nvidia())
    print(f"\nNVIDIA's plugin: pool of {len(side.devices())} devices in {seconds:.2f} s")
    assert len(side.devices()) == GPUS
    nodes = await _one_gpu_pod(side, "nv-pod")
    assert len(nodes) == 1 and nodes[0].startswith("nvidia"), nodes
    assert side.current is not None
    # Its own word that it, not a leftover of ours, prepared the claim.
    assert "Returning newly prepared devices for claim 'bench/nv-pod-" in side.current.log()


async def test_ours_then_runs_the_same_pod_on_the_same_node(side: SideBySide) -> None:
    seconds = await side.switch(side.ours())
    print(f"\nours: pool of {len(side.devices())} devices in {seconds:.2f} s")
    assert len(side.devices()) == GPUS
    nodes = await _one_gpu_pod(side, "our-pod")
    assert len(nodes) == 1 and nodes[0].startswith("nvidia"), nodes
    await side.stop()
