"""``gpu-dra demo`` as a real subprocess (its report, ``--keep``, SIGINT) and its pure parts.

The subprocess tests read the demo's output line by line and wait on lines with a
deadline; the demo prints its work directory and its plugins' PIDs, so a test can
check that nothing of a run is left behind.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import main as cli_main
from driver.kube import client as kubeclient
from driver.nvml.profile import profile_names
from sandbox.demo import DemoError, NodeSpec, parse_nodes
from sandbox.demo._cdi import defining, resolve
from sandbox.demo._cluster import complete_pools
from sandbox.demo._manifests import claim_base_name, claim_from_template
from sandbox.demo._report import table
from sandbox.demo._scheduler import allocated_node, free_share, rank

REPO = Path(__file__).resolve().parent.parent
_WAIT_S = 60.0


# A test run started in the background (`make test &`) inherits SIGINT ignored, and so would
# the demo: these tests are about a user's Ctrl-C, so the child's first statement undoes that
# (not a preexec_fn: in a test worker that loaded gRPC, gRPC's fork handlers run there).
_CTRL_C_ON = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'gpu-dra'; runpy.run_module('cli', run_name='__main__', alter_sys=True)"
)


class DemoRun:
    """``gpu-dra demo`` in a subprocess; output collected by a thread as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CTRL_C_ON, "demo", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self._lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self._lines)

    def wait_line(self, pattern: str, wait_s: float = _WAIT_S) -> re.Match[str]:
        """The first output line matching ``pattern``, waiting for it up to ``wait_s``."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                for line in self._lines:
                    match = compiled.search(line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern!r} in:\n{self.output}")
                self._changed.wait(min(left, 0.5))

    def wait_exit(self, wait_s: float = _WAIT_S) -> int:
        code = self.proc.wait(timeout=wait_s)
        self._reader.join(timeout=wait_s)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def run_demo() -> Iterator[list[DemoRun]]:
    runs: list[DemoRun] = []
    yield runs
    for run in runs:
        run.kill()


def _plugin_pids(run: DemoRun) -> list[int]:
    line = run.wait_line(r"^plugins up: (.+)$").group(1)
    return [int(item.split("=")[1]) for item in line.split()]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _assert_nothing_left(run: DemoRun, pids: list[int]) -> None:
    workdir = run.wait_line(r"^work directory (/tmp/gdra-\S+)").group(1)
    assert not Path(workdir).exists(), f"{workdir} left behind"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"plugin pid {pid} still running"
    assert _processes_mentioning(workdir) == [], "a process of the run is still alive"


def test_demo_report(run_demo: list[DemoRun]) -> None:
    run = DemoRun()
    run_demo.append(run)
    code = run.wait_exit()
    out = run.output
    assert code == 0, out
    pids = _plugin_pids(run)
    assert len(pids) == 2

    # Both nodes published their pool: eight H100 on NVLink, four L40S without.
    assert re.search(r"node-a\s+node-a\s+1\s+8\s+NVIDIA H100 80GB HBM3\s+8/8", out), out
    assert re.search(r"node-b\s+node-b\s+1\s+4\s+NVIDIA L40S\s+0/4", out), out

    # Allocations, with reservedFor naming the pods (the shared claim: both pods).
    allocations = out.split("allocations written to status.allocation")[1].split("== 5.")[0]
    assert re.search(
        r"tensor-parallel\s+default/tensor-parallel-gpus-\w{5}\s+node-a\s+"
        r"gpu-\d, gpu-\d, gpu-\d, gpu-\d\s+tensor-parallel",
        allocations,
    ), allocations
    assert re.search(r"single-gpu\s+default/single-gpu-gpu-\w{5}\s+node-\w\s+gpu-\d", allocations)
    assert re.search(
        r"shared-claim-pod-b\s+default/shared-gpu\s+node-b\s+gpu-\d\s+"
        r"shared-claim-pod-a, shared-claim-pod-b",
        allocations,
    ), allocations
    assert "(unschedulable)" not in allocations

    # The tensor-parallel claim does not fit the PCIe-only node, and the reason says why.
    misfits = out.split("where claims do not fit, and why")[1].split("allocations written")[0]
    reason = re.search(r"default/tensor-parallel-gpus-\w{5}\s+node-b\s+(.+)", misfits)
    assert reason is not None, misfits
    assert "lack attribute gpu.nvidia.com/nvlinkDomain" in reason.group(1)

    # CDI device IDs came back for every allocated device (1 + 4 + 1 + 1 + 1).
    ids = re.findall(r"k8s\.gpu\.nvidia\.com/claim=[0-9a-f-]{36}-gpu-\d", out)
    assert len(ids) == 8, out
    # What a container gets, from the spec on disk: its own GPU node, and `void`.
    assert re.search(r"tensor-parallel/trainer on node-a", out)
    assert out.count("env: NVIDIA_VISIBLE_DEVICES=void") == 7  # seven containers

    # Unprepare removed every spec.
    unprepare = out.split("== 6.")[1].split("== 7.")[0]
    assert len(re.findall(r"\sok\s+removed$", unprepare, re.MULTILINE)) == 5, unprepare
    assert "CDI specs left on node-a: 0" in unprepare
    assert "CDI specs left on node-b: 0" in unprepare
    assert "problems: 0" in out
    seconds = float(run.wait_line(r"^total time: ([\d.]+) s").group(1))
    assert seconds < 60
    assert len(re.findall(r"stopped, exit code 0$", out, re.MULTILINE)) == 2
    _assert_nothing_left(run, pids)


async def test_demo_keep_serves_the_cluster_until_sigint(run_demo: list[DemoRun]) -> None:
    from kubernetes.aio import client

    run = DemoRun("--keep")
    run_demo.append(run)
    kubeconfig = run.wait_line(r"kubectl --kubeconfig (\S+) get resourceslices").group(1)
    run.wait_line("press Ctrl-C")
    pids = _plugin_pids(run)

    async with await kubeclient.api_client(kubeconfig, component="test") as api:
        resource: Any = client.ResourceV1Api(api)
        plain: Any = api.sanitize_for_serialization  # the package leaves it untyped
        claims = plain(await resource.list_namespaced_resource_claim("default"))["items"]
        slices = plain(await resource.list_resource_slice())["items"]
    by_name = {c["metadata"]["name"]: c for c in claims}
    assert len(claims) == 5, sorted(by_name)
    for claim in claims:
        status = claim.get("status") or {}
        assert status.get("allocation"), claim
        assert status.get("reservedFor"), claim
    shared = by_name["shared-gpu"]["status"]
    assert sorted(r["name"] for r in shared["reservedFor"]) == [
        "shared-claim-pod-a",
        "shared-claim-pod-b",
    ]
    # The tensor-parallel claim got four GPUs of one NVLink domain, as its constraint says.
    (tp,) = [c for c in claims if c["metadata"]["name"].startswith("tensor-parallel-gpus-")]
    results = tp["status"]["allocation"]["devices"]["results"]
    attributes = {
        (s["spec"]["pool"]["name"], d["name"]): d["attributes"]
        for s in slices
        for d in s["spec"]["devices"]
    }
    domains = {attributes[(r["pool"], r["device"])]["nvlinkDomain"]["string"] for r in results}
    assert len(results) == 4 and len(domains) == 1, results
    assert tp["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    assert tp["status"]["reservedFor"] == [
        {
            "resource": "pods",
            "name": "tensor-parallel",
            "uid": tp["status"]["reservedFor"][0]["uid"],
        }
    ]

    run.proc.send_signal(signal.SIGINT)
    assert run.wait_exit() == 130, run.output
    _assert_nothing_left(run, pids)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_demo_signal_mid_run_leaves_nothing(
    run_demo: list[DemoRun], signum: signal.Signals, code: int
) -> None:
    run = DemoRun()
    run_demo.append(run)
    pids = _plugin_pids(run)  # the plugins are up; slices may not be published yet
    run.proc.send_signal(signum)
    assert run.wait_exit() == code, run.output
    assert "total time" not in run.output  # it was stopped mid-run, not at the end
    assert len(re.findall(r"stopped, exit code 0$", run.output, re.MULTILINE)) == 2, run.output
    _assert_nothing_left(run, pids)


def test_bad_nodes_spec_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--nodes", "node-a=p9.huge"]) == 1
    err = capsys.readouterr().err
    assert "unknown profile 'p9.huge'" in err and "p5.48xlarge" in err


# ---- pure parts ------------------------------------------------------------------------------


def test_parse_nodes() -> None:
    known = profile_names()
    assert parse_nodes("a=p5.48xlarge, b=g6e.12xlarge", known) == [
        NodeSpec("a", "p5.48xlarge"),
        NodeSpec("b", "g6e.12xlarge"),
    ]
    for bad, message in (
        ("a", "is not NAME=PROFILE"),
        ("A=p5.48xlarge", "DNS label"),
        ("a=p5.48xlarge,a=g6e.12xlarge", "appears twice"),
        ("a=nope", "unknown profile"),
    ):
        with pytest.raises(DemoError, match=message):
            parse_nodes(bad, known)


def test_claim_from_template_follows_the_resource_claim_controller() -> None:
    pod = {"metadata": {"name": "trainer", "namespace": "ml", "uid": "u-1"}}
    template = {
        "spec": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {"devices": {"requests": [{"name": "gpus"}]}},
        }
    }
    claim = claim_from_template(pod, "gpus", template)
    assert claim["metadata"]["generateName"] == "trainer-gpus-"
    assert claim["metadata"]["namespace"] == "ml"
    assert claim["metadata"]["labels"] == {"team": "a"}
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpus"}
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Pod", "u-1", True)
    assert claim["spec"] == template["spec"]["spec"]
    assert claim["spec"] is not template["spec"]["spec"]
    long = claim_base_name("p" * 40, "c" * 40)
    assert long == "p" * 28 + "-" + "c" * 28 + "-"


def _spec(uid: str, devices: dict[str, int]) -> dict[str, Any]:
    return {
        "kind": "k8s.gpu.nvidia.com/claim",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
        },
        "devices": [
            {
                "name": f"{uid}-{name}",
                "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]},
            }
            for name, minor in devices.items()
        ],
    }


def test_resolve_merges_spec_and_device_edits_as_a_runtime() -> None:
    specs = [
        (Path("a.json"), _spec("u1", {"gpu-3": 3, "gpu-10": 10})),
        (Path("b.json"), _spec("u2", {"gpu-0": 0})),
    ]
    edits = resolve(
        ["k8s.gpu.nvidia.com/claim=u1-gpu-10", "k8s.gpu.nvidia.com/claim=u1-gpu-3"], specs
    )
    assert edits.device_nodes == ("/dev/nvidia3", "/dev/nvidia10", "/dev/nvidiactl")
    assert edits.env == ("NVIDIA_VISIBLE_DEVICES=void",)
    assert edits.spec_files == ("a.json",)
    assert defining(["k8s.gpu.nvidia.com/claim=u2-gpu-0", "x/y=u9"], specs) == ["b.json"]
    assert defining(["k8s.gpu.nvidia.com/claim=u3-gpu-0"], specs) == []
    with pytest.raises(DemoError, match="no CDI spec defines"):
        resolve(["k8s.gpu.nvidia.com/claim=u3-gpu-0"], specs)
    with pytest.raises(DemoError, match="not a fully qualified"):
        resolve(["u1-gpu-3"], specs)


def _slice(node: str, devices: int, generation: int = 1, count: int = 1) -> dict[str, Any]:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        }
    }


def test_complete_pools_waits_for_every_slice_of_the_newest_generation() -> None:
    slices = [_slice("a", 8), _slice("b", 2, generation=2, count=2), _slice("b", 4)]
    assert complete_pools(slices, "gpu.nvidia.com") == {"a": 8}
    slices.append(_slice("b", 2, generation=2, count=2))
    assert complete_pools(slices, "gpu.nvidia.com") == {"a": 8, "b": 4}
    assert complete_pools(slices, "other.example.com") == {}


def test_scheduler_prefers_the_node_with_the_most_free_share() -> None:
    slices = [_slice("a", 8), _slice("b", 4)]
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "gpu.nvidia.com", "pool": "b", "device": "gpu-0"},
                        {"driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-1"},
                        {"driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-2"},
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["a"]}
                            ]
                        }
                    ]
                },
            }
        }
    }
    free = free_share(slices, [claim])
    assert free == {"a": 0.75, "b": 0.75}
    assert rank(["b", "a"], free) == ["a", "b"]  # a tie goes by name
    assert rank(["a", "b"], free_share(slices, [])) == ["a", "b"]
    assert allocated_node(claim) == "a"
    assert allocated_node({"status": {}}) is None


def test_table_aligns_columns() -> None:
    assert table(["A", "LONG"], [["xyz", 1], ["q", "last"]]).splitlines() == [
        "A    LONG",
        "xyz  1",
        "q    last",
    ]


_GPU_CLASS_NAME = "gpu.nvidia.com"


def _gpu_claim(name: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {"deviceClassName": _GPU_CLASS_NAME, "count": count},
                    }
                ]
            }
        },
    }


def test_place_moves_on_when_a_pods_claims_do_not_fit_together(tmp_path: Path) -> None:
    from driver.nvml.simulated import SimulatedNode
    from drivers.gpu.model.discovery import discover
    from drivers.gpu.resourceslice import build_resource_slices
    from sandbox.demo._scheduler import place
    from tools.allocation.inputs import Inputs
    from tools.validation import chart_device_classes

    slices = []
    for profile, node in (("g6e.12xlarge", "a"), ("p5.48xlarge", "b")):
        sim = SimulatedNode(profile, node, tmp_path / node)
        inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
        slices += build_resource_slices(inventory, driver_name=_GPU_CLASS_NAME, node_name=node)
    inputs = Inputs(slices=slices, classes=chart_device_classes(), claims=[], node_labels=None)
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"}}
    claims = [_gpu_claim("one", 3), _gpu_claim("two", 3)]

    # Each claim alone fits both nodes, and "a" ranks first (a tie, by name); together they
    # need six GPUs, which only "b" has.
    outcome = place(pod, claims, inputs)
    assert outcome.node == "b"
    first, second = outcome.claims
    assert len(first.devices) == len(second.devices) == 3
    assert not set(first.devices) & set(second.devices)
    assert first.explanation is not None and first.explanation.allocatable_nodes == ["a", "b"]
    assert claims[0].get("status") is None  # place() writes nothing into its inputs

    # Too much for any node: unschedulable, with every node's reason kept.
    outcome = place(pod, [_gpu_claim("big", 9)], inputs)
    assert outcome.node is None and outcome.reason == "no node fits all of its claims"
    explanation = outcome.claims[0].explanation
    assert explanation is not None and explanation.allocatable_nodes == []
    assert all(n.reasons for n in explanation.nodes)
