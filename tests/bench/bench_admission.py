"""The cost of the chart's GpuConfig admission policy on the real kube-apiserver.

A burst of claim creates (each with a GpuConfig the policy checks), interleaved between two
namespaces of one control plane: one the policy applies to (its namespaceSelector), one it
does not. Same server, same moment, same client, so the ratio is the policy's cost, not the
machine's noise. Reported: p50 and p99 per side and on / off. Needs the e2e tier's binaries
(``make e2e-build``).
"""

import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.chart_render import render
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, run_root

CLAIMS = 500  # per side
CONCURRENCY = 16
MINOR = str(build.VERSIONS["default"])
PARAMS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": PARAMS},
                    }
                ],
            }
        },
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    if not (build.cache_root() / f"kubernetes-{build.k8s_version(MINOR)}" / "bin").exists():
        print("skipped: no Kubernetes binaries (make e2e-build)")
        return 0
    async with ControlPlane(run_root() / f"gpu-dra-bench-admission-{MINOR}", MINOR) as cp:
        sets = ("configAdmission.namespaceSelector.matchLabels.gpu-admission=on",)
        for obj in render((), sets):
            if obj["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                cp.create(obj)
        for ns, applies in (("policy-on", True), ("policy-off", False)):
            labels = {"gpu-admission": "on"} if applies else {}
            cp.create({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "labels": labels}})  # fmt: skip

        def refused(ns: str) -> bool:
            bad = claim("probe")
            bad["spec"]["devices"]["config"][0]["opaque"]["parameters"] = {"kind": "GpuConfig"}
            path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims?dryRun=All"
            return cp.raw("POST", path, bad)[0] == 422

        await cp.wait_for("the policy enforced", lambda: refused("policy-on"), 60)
        assert not refused("policy-off"), "the policy applies to the namespace it must not"

        def create(ns: str, i: int) -> float:
            path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
            start = time.perf_counter()
            code, body = cp.raw("POST", path, claim(f"c{i}"))
            took = time.perf_counter() - start
            assert code == 201, body[:300]
            return took

        jobs = [(ns, i) for i in range(CLAIMS) for ns in ("policy-on", "policy-off")]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            took = list(pool.map(lambda job: create(*job), jobs))
        on_ms = [t * 1000 for (ns, _), t in zip(jobs, took, strict=True) if ns == "policy-on"]
        off_ms = [t * 1000 for (ns, _), t in zip(jobs, took, strict=True) if ns == "policy-off"]
    print(f"{CLAIMS} claim creates per side, {CONCURRENCY} at once, kube-apiserver {MINOR}")
    for name, values in (("policy on", on_ms), ("policy off", off_ms)):
        print(f"  {name:10}  p50 {statistics.median(values):6.2f} ms  "
              f"p99 {percentile(values, 0.99):6.2f} ms")  # fmt: skip
    p50 = statistics.median(on_ms) / statistics.median(off_ms)
    p99 = percentile(on_ms, 0.99) / percentile(off_ms, 0.99)
    print(f"  on / off    p50 {p50:.2f}  p99 {p99:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
