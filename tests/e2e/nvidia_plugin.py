"""NVIDIA's own GPU kubelet plugin on a simulated node, by hand (issue #40): never run by
``make test`` or ``make e2e``.

``python -m tests.e2e.nvidia_plugin build`` builds ``cmd/gpu-kubelet-plugin`` of
kubernetes-sigs/dra-driver-nvidia-gpu at :data:`TAG` from a mirror of the repository (its
module is not on the Go module proxy; ``--mirror`` names the git directory), with its vendored
modules (``go build -mod=vendor``), into ``<e2e cache>/nvidia-plugin-<tag>/`` (about 2 to 6
minutes; once per machine).

``python -m tests.e2e.nvidia_plugin record`` runs that binary on each simulated profile of
:data:`PROFILES` against a real kube-apiserver (``tests.e2e.cluster``, level 1), waits for its
complete pool of ResourceSlices, and writes to ``tests/data/nvidia-plugin/``:

- ``slices-<profile>.json``: its slices, with what the server assigns per run dropped
  (``slices-<profile>-<gate>.json`` with an alpha gate of :data:`GATED` on);
- ``containers-<profile>.json``: its container view of the claims of :data:`CLAIMS`
  (``containers-<profile>-mps.json``: of :data:`MPS_CLAIMS`, with the stand-in kubelet for
  the MPS control daemon's pod; ``record --only-mps`` records it alone);
- ``nvml-calls.json``: every NVML call it made on each profile, with what the simulated
  library answered and how often (the library's call trace, ``$GPU_DRA_SIM_NVML_TRACE``).

Run it under ``flock /tmp/gpu-dra-e2e.lock`` with ``GPU_DRA_E2E_RUN`` set, as any run that
starts cluster components. The plugin runs in a mount namespace of its own whose ``/sys`` is
the simulated node's sysfs tree (NVIDIA's plugin reads the PCIe root from ``/sys`` with no
flag to move it; ours reads the same tree through ``--sysfs-root``), with the flags its Helm
chart sets and the chart's default feature gates unless a record says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.e2e import build, cluster

TAG = "v0.4.1"  # the newest release tag the mirror holds (v0.5.x are not in it)
COMMIT = "764900e7833798a1528bd52a2af3e1b2d5f7a616"
REPOSITORY = "kubernetes-sigs/dra-driver-nvidia-gpu"
DEFAULT_MIRROR = Path("/work/.mirror/kubernetes-sigs+dra-driver-nvidia-gpu/repo")
DRIVER = "gpu.nvidia.com"
PROFILES = ("p5e.48xlarge", "p4d.24xlarge-mig")
# Runs with an alpha gate of NVIDIA's on: (profile, gates, the record's suffix, every GPU put
# in MIG mode first). No ConsumableShares: v0.4.1 has no such gate (it came after;
# tests/data/nvidia-plugin/README.md). DynamicMIG twice: on the p5e as it is (MIG mode off),
# and in MIG mode with no instance, as our --dynamic-mig needs it (a GPU whose MIG mode is
# set before the plugin starts), to compare like with like.
GATED = (
    ("p5e.48xlarge", "DynamicMIG=true", "dynamic-mig", False),
    ("p5e.48xlarge", "DynamicMIG=true", "mig-mode-dynamic-mig", True),
)
DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-plugin"
K8S_MINOR = "1.37"
# The chart's image for the tag (the plugin only names it in objects it creates).
IMAGE = f"registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:{TAG}"
NAMESPACE = "nvidia-dra-driver-gpu"  # the chart's
SERVICE_ACCOUNT = "nvidia-dra-driver-gpu-service-account-kubeletplugin"


def binary() -> Path:
    return build.cache_root() / f"nvidia-plugin-{TAG}" / "gpu-kubelet-plugin"


def build_plugin(mirror: Path = DEFAULT_MIRROR) -> Path:
    """The plugin at :data:`TAG`, built once from ``mirror`` (checked to be :data:`COMMIT`)."""
    out = binary()
    if out.exists():
        return out
    commit = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", f"{TAG}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if commit != COMMIT:
        raise SystemExit(f"{TAG} is {commit} in {mirror}, not {COMMIT}: check the mirror")
    src = out.parent / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(mirror), "archive", COMMIT], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    started = time.monotonic()
    tmp = out.with_suffix(".tmp")
    # go.mod says go 1.26.0: the local toolchain must be at least that; cgo for go-nvml, which
    # dlopens libnvidia-ml.so.1; the version as NVIDIA's Makefile stamps it.
    version_pkg = "sigs.k8s.io/dra-driver-nvidia-gpu/internal/info"
    ldflags = f"-s -w -X {version_pkg}.version={TAG} -X {version_pkg}.gitCommit={COMMIT}"
    env = {**os.environ, "CGO_ENABLED": "1", "GOFLAGS": "-mod=vendor", "GOTOOLCHAIN": "local"}
    subprocess.run(
        ["go", "build", "-mod=vendor", "-trimpath", "-ldflags", ldflags, "-o", str(tmp),
         "./cmd/gpu-kubelet-plugin"],
        cwd=src, env=env, check=True,
    )  # fmt: skip
    tmp.rename(out)
    print(f"built {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return out


_VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def normalize_slice(obj: dict[str, Any]) -> dict[str, Any]:
    """A published slice without what the server assigns per run: its generated name's
    suffix, UIDs, versions, timestamps, the owner's UID."""
    meta = dict(obj["metadata"])
    for key in _VOLATILE:
        meta.pop(key, None)
    if "generateName" in meta:
        meta["name"] = meta["generateName"] + "<suffix>"
    meta["ownerReferences"] = [
        {k: v for k, v in ref.items() if k != "uid"} for ref in meta.get("ownerReferences", [])
    ]
    return {**obj, "metadata": meta}


def sim_node(root: Path, profile: str, node_name: str, mig_mode: bool = False) -> tuple[Path, Path]:
    """The simulated node's driver root (library, device nodes, sysfs, driver files) and its
    hardware file; with ``mig_mode``, every GPU of ``profile`` in MIG mode, no instance."""
    from driver.nvml.simulated import SimulatedNode
    from tests.simroot import ctk_binary, install_driver_files

    spec: str | Path = profile
    if mig_mode:
        spec = root.with_name("profile.yaml")
        spec.write_text(f"extends: {profile}\nmig: {{enabled: all}}\n")
    node = SimulatedNode(spec, node_name, root)
    ctk = ctk_binary()
    if ctk is not None:
        install_driver_files(root, node.profile.driver_version, ctk)
    else:  # NVIDIA's plugin needs an nvidia-smi under the driver root to start
        (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
        smi = root / "usr" / "bin" / "nvidia-smi"
        smi.write_text("#!/bin/sh\n")
        smi.chmod(0o755)
    return root, node.nvml.render()


During = Callable[[Path, str], Awaitable[None]]


async def run_plugin(
    plane: cluster.ControlPlane,
    profile: str,
    work: Path,
    wait_s: float = 120,
    *,
    gates: str = "",
    during: During | None = None,
    templates: Path | None = None,
    mig_mode: bool = False,
) -> tuple[list[dict[str, Any]], list[str], str]:
    """NVIDIA's plugin on ``profile`` until its pool is complete: its slices (normalized),
    the NVML call trace, and its log. ``gates``: its --feature-gates; ``during(work,
    node_name)`` runs once the pool is complete, before the plugin is stopped;
    ``templates``: a directory the plugin sees at ``/templates``, as its image has it;
    ``mig_mode``: :func:`sim_node`'s."""
    node_name = f"sim-{profile}"
    plane.call("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name,
        "labels": {"kubernetes.io/hostname": node_name}},
    }, ok=(201, 409))  # fmt: skip
    root, _ = sim_node(work / "root", profile, node_name, mig_mode)
    trace = work / "nvml-trace"
    trace.unlink(missing_ok=True)
    plugins, registry, cdi = work / "plugins", work / "registry", work / "cdi"
    for d in (plugins, registry, cdi):
        d.mkdir(parents=True, exist_ok=True)
    # The chart's DaemonSet: --node-name, the namespace, the CDI root, the driver roots (the
    # host's root at /driver-root in the container; here one directory for both), the
    # kubelet's directories, the cdi hook path (copied from the image; any path here).
    argv = [
        str(binary()), f"--node-name={node_name}", f"--namespace={NAMESPACE}",
        f"--cdi-root={cdi}", f"--nvidia-driver-root={root}", f"--container-driver-root={root}",
        f"--nvidia-cdi-hook-path={root / 'usr' / 'bin' / 'nvidia-cdi-hook'}",
        f"--kubelet-registrar-directory-path={registry}",
        f"--kubelet-plugins-directory-path={plugins}",
        f"--kubeconfig={plane.admin_kubeconfig}", f"--image-name={IMAGE}",
        f"--service-account-name={SERVICE_ACCOUNT}", "-v=6",
    ]  # fmt: skip
    if gates:
        argv.append(f"--feature-gates={gates}")
    # /proc/driver (MIG capabilities) and /proc/devices (the nvidia-caps major) too: NVIDIA's
    # toolkit library reads the host's, as on a node.
    shell = (
        'mount --bind "$0/sys" /sys && mount --bind "$0/proc/devices" /proc/devices && '
        'mount --bind "$0/proc/driver" /proc/driver && exec "$@"'
    )
    if templates is not None:
        # Its MPS prepare reads /templates/mps-control-daemon.tmpl.yaml, a path no flag
        # moves (cmd/gpu-kubelet-plugin/sharing.go:55). The host has no /templates and gets
        # none: the plugin runs chrooted into a tmpfs that holds every entry of / (bound,
        # the simulated /sys and /proc parts included) and the tag's templates directory.
        (work / "newroot").mkdir(exist_ok=True)
        argv = ["sh", "-c", _CHROOT, str(templates), str(work / "newroot"), *argv]
    path = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node_name}"
    plane.call("DELETE", path)  # an earlier run's pool would look complete at once
    proc = await plane.spawn(
        f"nvidia-plugin-{profile}",
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, str(root), *argv],
    )

    def complete() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = plane.call("GET", path)["items"]
        ours = [s for s in items if s["spec"]["driver"] == DRIVER]
        if not ours:
            return None
        top = max(s["spec"]["pool"]["generation"] for s in ours)
        latest = [s for s in ours if s["spec"]["pool"]["generation"] == top]
        return latest if len(latest) == latest[0]["spec"]["pool"]["resourceSliceCount"] else None

    slices: list[dict[str, Any]] = []

    def ready() -> bool:
        nonlocal slices
        slices = complete() or []
        # and registered: its DRA socket serves once the registration socket is there
        return bool(slices) and (registry / f"{DRIVER}-reg.sock").exists()

    try:
        await plane.wait_for(f"NVIDIA's plugin's pool on {profile}", ready, wait_s)
        if during is not None:
            await during(work, node_name)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.proc.pid, signal.SIGTERM)
        await proc.proc.wait()
        plane.processes.remove(proc)
    log = proc.log.read_text(errors="replace")
    calls = trace.read_text().splitlines() if trace.exists() else []
    slices.sort(key=lambda s: (s["spec"]["pool"]["name"], s["metadata"]["name"]))
    for s in slices:  # Go map order, another each run: by name, so records diff by content
        s["spec"].get("devices", []).sort(key=lambda d: d["name"])
    return [normalize_slice(s) for s in slices], calls, log


_CHROOT = (
    'T=$0; N=$1; shift; mount -t tmpfs tmpfs "$N" && for e in /*; do b=${e#/}; '
    'if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$N/$b"; '
    'elif [ -d "$e" ]; then mkdir "$N/$b" && mount --rbind "$e" "$N/$b" || exit 1; fi; done && '
    'mkdir "$N/templates" && mount --bind "$T" "$N/templates" && exec chroot "$N" "$@"'
)


def _gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }


# The container view's claims, per profile: name -> (devices, allocation config). A claim
# shared by two pods, or one GPU shared by two containers, is one prepare of one claim (the
# kubelet prepares a claim once per node): "one-gpu". MPS has a run of its own (MPS_CLAIMS).
CLAIMS: dict[str, dict[str, tuple[list[str], list[dict[str, Any]]]]] = {
    "p5e.48xlarge": {
        "one-gpu": (["gpu-0"], []),
        "four-gpus": (["gpu-0", "gpu-1", "gpu-2", "gpu-3"], []),
        "time-slicing": (
            ["gpu-5"],
            [_gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})],
        ),
    },
    # Static MIG: instances made before the plugin started (the profile's).
    "p4d.24xlarge-mig": {
        "one-mig": (["gpu-0-mig-1g10gb-15-6"], []),
        "two-migs-one-gpu": (["gpu-1-mig-3g20gb-9-0", "gpu-1-mig-2g10gb-14-4"], []),
        "mig-and-gpu": (["gpu-2-mig-1g10gb-15-6", "gpu-4"], []),
    },
}
CONTAINER_GATES = "TimeSlicingSettings=true"  # NVIDIA's alpha gate for time-slicing configs

# MPS, with NVIDIA's alpha MPSSupport gate: its example's settings (gpu-test-mps.yaml).
# Its prepare starts the claim's control daemon as a Deployment through the API server and
# waits (AssertReady, cmd/gpu-kubelet-plugin/sharing.go:324-378: 4 tries over about 15 s)
# until the Deployment's status says readyReplicas 1 and its one pod's one container is
# ready: what a kubelet reports once the daemon's container runs. No kubelet runs here, so
# the recorder stands in for it (_daemon_pods_ready): it reports the pod running and ready
# through the API server, and the controller-manager carries that to the Deployment's status
# as for any pod. No daemon runs; what is recorded is what the plugin wrote and answered.
MPS_GATES = "MPSSupport=true"
MPS_CLAIMS: dict[str, dict[str, tuple[list[str], list[dict[str, Any]]]]] = {
    "p5e.48xlarge": {
        "mps": (
            ["gpu-6"],
            [_gpu_config({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi",
            }})],
        ),
    },
}  # fmt: skip
MPS_DAEMON_PREFIX = "mps-control-daemon-"  # sharing.go:56


def normalize_text(text: str, subs: dict[str, str]) -> str:
    """``text`` with each key of ``subs`` (longest first) replaced by its placeholder."""
    for old in sorted(subs, key=len, reverse=True):
        text = text.replace(old, subs[old])
    return text


AfterPrepare = Callable[[dict[str, str]], Awaitable[dict[str, Any]]]


def container_view(
    plane: cluster.ControlPlane,
    claims: dict[str, tuple[list[str], list[dict[str, Any]]]],
    out: dict[str, Any],
    after_prepare: AfterPrepare | None = None,
) -> During:
    """What NVIDIA's plugin prepares for each of ``claims``, into ``out``: the CDI device
    IDs it answers, the CDI spec files it writes (paths and claim UIDs normalized), and the
    files left after unprepare; with what ``after_prepare(subs)`` returns, before unprepare."""

    async def run(work: Path, node_name: str) -> None:
        import yaml
        from google.protobuf.json_format import MessageToDict

        from sandbox.kubeletsim import KubeletSim
        from tests.pluginharness import api_client, create_claim

        cdi, root, plugins = work / "cdi", work / "root", work / "plugins"
        api = await api_client(plane.admin_kubeconfig)
        kubelet = await KubeletSim.register(work / "registry" / f"{DRIVER}-reg.sock")
        try:
            for name, (devices, config) in claims.items():
                before = {p.name for p in cdi.iterdir()}
                ref = await create_claim(api, name, node=node_name, devices=devices, config=config)
                subs = {ref.uid: "<claim-uid>", str(root): "<driver-root>", str(cdi): "<cdi-root>",
                        str(plugins): "<plugins>"}  # fmt: skip
                answer = MessageToDict(await kubelet.prepare([ref]))
                written = {
                    normalize_text(f.name, subs):
                        yaml.safe_load(normalize_text(f.read_text(), subs))
                    for f in sorted(cdi.iterdir())
                    if f.name not in before
                }  # fmt: skip
                extra = await after_prepare(subs) if after_prepare is not None else {}
                undone = MessageToDict(await kubelet.unprepare([ref]))
                out[name] = {
                    **extra,
                    "devices": devices,
                    "config": config,
                    "prepare": json.loads(normalize_text(json.dumps(answer), subs)),
                    "specs": written,
                    "unprepare": json.loads(normalize_text(json.dumps(undone), subs)),
                    "left": sorted(
                        normalize_text(p.name, subs) for p in cdi.iterdir() if p.name not in before
                    ),
                }
        finally:
            await kubelet.close()
            await api.close()

    return run


async def _daemon_pods_ready(plane: cluster.ControlPlane, node_name: str) -> None:
    """Stands in for the kubelet (a test fixture, until cancelled): reports every MPS
    control-daemon pod bound to ``node_name`` running, its one container started and ready,
    as a kubelet would once the container ran. Only the pod's status: the ReplicaSet and
    Deployment statuses follow from it through the controller-manager."""
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    while True:
        for pod in (await asyncio.to_thread(plane.call, "GET", pods))["items"]:
            name = pod["metadata"]["name"]
            if not name.startswith(MPS_DAEMON_PREFIX) or pod["spec"].get("nodeName") != node_name:
                continue
            if pod.get("status", {}).get("phase") == "Running":
                continue
            (container,) = pod["spec"]["containers"]
            conditions = [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ]
            status = {
                "phase": "Running", "conditions": conditions, "startTime": now,
                "containerStatuses": [{
                    "name": container["name"], "image": container["image"], "imageID": "",
                    "ready": True, "started": True, "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }],
            }  # fmt: skip
            code, body = await asyncio.to_thread(
                plane.raw, "PATCH", f"{pods}/{name}/status", {"status": status},
                content_type="application/merge-patch+json",
            )  # fmt: skip
            if code != 200:
                raise AssertionError(f"pod {name} status: {code} {body[:500]!r}")
        await asyncio.sleep(0.2)


_CONTROL = re.compile(r"echo (set_default_[^|]*?) \| nvidia-cuda-mps-control")


def _daemon_of(plane: cluster.ControlPlane) -> AfterPrepare:
    """What NVIDIA's MPS prepare asked of the API server: its control daemon's Deployment,
    as a container view's extra part (names and paths normalized; its pod's command left
    out, being NVIDIA's script rather than an output)."""

    async def get(subs: dict[str, str]) -> dict[str, Any]:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        items = (await asyncio.to_thread(plane.call, "GET", path))["items"]
        daemons = [d for d in items if d["metadata"]["name"].startswith(MPS_DAEMON_PREFIX)]
        out = []
        for d in daemons:
            pod = d["spec"]["template"]["spec"]
            containers = [
                {k: v for k, v in c.items() if k not in ("command", "args")}
                for c in pod["containers"]
            ]
            script = " ".join(a for c in pod["containers"] for a in c.get("args", []))
            kept = {
                "name": d["metadata"]["name"],
                "readyReplicas": d.get("status", {}).get("readyReplicas"),
                "pod": {**pod, "containers": containers},
                # the settings it gives the daemon (the MPS config's), from that command
                "controlCommands": _CONTROL.findall(script),
            }
            out.append(json.loads(normalize_text(json.dumps(kept), subs)))
        return {"daemons": out}

    return get


def mps_view(
    plane: cluster.ControlPlane,
    claims: dict[str, tuple[list[str], list[dict[str, Any]]]],
    out: dict[str, Any],
) -> During:
    """:func:`container_view` of MPS claims: the chart's namespace and service account the
    daemon's Deployment names, and the stand-in kubelet for its pod while it runs."""
    view = container_view(plane, claims, out, after_prepare=_daemon_of(plane))

    async def run(work: Path, node_name: str) -> None:
        plane.call("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
        }, ok=(201, 409))  # fmt: skip
        plane.call("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT},
        }, ok=(201, 409))  # fmt: skip
        stand_in = asyncio.create_task(_daemon_pods_ready(plane, node_name))
        try:
            await view(work, node_name)
        finally:
            stand_in.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stand_in  # raises what made it fail before it was cancelled

    return run


def _source(profile: str | None = None) -> dict[str, Any]:
    return {
        "repository": f"https://github.com/{REPOSITORY}",
        "tag": TAG,
        "commit": COMMIT,
        "binary": "cmd/gpu-kubelet-plugin, go build -mod=vendor (tests/e2e/nvidia_plugin.py)",
        "kubernetes": build.k8s_version(K8S_MINOR),
        "profile": profile,
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "license": "Apache-2.0 (NVIDIA's plugin's output)",
    }


def _counted(calls: list[str]) -> list[list[Any]]:
    """The trace's lines as [call, nvmlReturn_t, how often], sorted."""
    counted = collections.Counter(tuple(line.rsplit(" ", 1)) for line in calls)
    return [[name, int(code), n] for (name, code), n in sorted(counted.items())]


def _fresh(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)


async def _one_run(
    plane: cluster.ControlPlane, profile: str, work: Path, **kwargs: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`run_plugin` in a fresh ``work`` directory, its simulated hardware and trace
    named in the environment the plugin inherits; its log kept in ``work``."""
    await asyncio.to_thread(_fresh, work)
    names = ("GPU_DRA_SIM_NVML", "GPU_DRA_SIM_NVML_TRACE")
    old = {k: os.environ.get(k) for k in names}
    os.environ["GPU_DRA_SIM_NVML"] = str(work / "root" / "run/gpu-dra-sim/nvml-hardware")
    os.environ["GPU_DRA_SIM_NVML_TRACE"] = str(work / "nvml-trace")
    try:
        slices, calls, log = await run_plugin(plane, profile, work, **kwargs)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    (work / "plugin.log").write_text(log)
    return slices, calls


async def _record_mps(
    plane: cluster.ControlPlane, run: Path, calls_by_profile: dict[str, list[list[Any]]]
) -> None:
    """The MPS container view (MPS_CLAIMS) into ``containers-<profile>-mps.json``."""
    templates = binary().parent / "src" / "templates"
    for profile, claims in MPS_CLAIMS.items():
        view: dict[str, Any] = {}
        _, calls = await _one_run(
            plane, profile, run / f"{profile}-mps", gates=MPS_GATES,
            during=mps_view(plane, claims, view), templates=templates,
        )  # fmt: skip
        calls_by_profile[f"{profile}, MPS prepare and unprepare ({MPS_GATES})"] = _counted(calls)
        source: dict[str, Any] = {
            **_source(profile), "featureGates": MPS_GATES,
            "fixture": "the daemon's pod reported running and ready by the recorder, no "
            "kubelet (tests/e2e/nvidia_plugin.py: _daemon_pods_ready)",
        }  # fmt: skip
        body = {"source": source, "claims": view}
        (DATA / f"containers-{profile}-mps.json").write_text(json.dumps(body, indent=1) + "\n")
        print(f"MPS container view on {profile}: {len(view)} claims prepared", file=sys.stderr)


async def record(
    profiles: tuple[str, ...], *, containers: bool = True, only_mps: bool = False
) -> None:
    run = cluster.run_root() / "nvidia-plugin"
    calls_by_profile: dict[str, list[list[Any]]] = {}
    DATA.mkdir(parents=True, exist_ok=True)
    if only_mps:  # the other records' calls stay as they were recorded
        calls_by_profile = json.loads((DATA / "nvml-calls.json").read_text())["calls"]
        async with cluster.ControlPlane(run / "plane", K8S_MINOR) as plane:
            await _record_mps(plane, run, calls_by_profile)
        merged: dict[str, Any] = {"source": _source(), "calls": calls_by_profile}
        (DATA / "nvml-calls.json").write_text(json.dumps(merged, indent=1) + "\n")
        return
    async with cluster.ControlPlane(run / "plane", K8S_MINOR) as plane:
        for profile in profiles:
            slices, calls = await _one_run(plane, profile, run / profile)
            calls_by_profile[profile] = _counted(calls)
            body = {"source": _source(profile), "slices": slices}
            (DATA / f"slices-{profile}.json").write_text(json.dumps(body, indent=1) + "\n")
            print(f"{profile}: {sum(len(s['spec'].get('devices', [])) for s in slices)} devices "
                  f"in {len(slices)} slices, {len(calls)} NVML calls", file=sys.stderr)  # fmt: skip
        for profile, gates, suffix, mig_mode in GATED if set(PROFILES) <= set(profiles) else ():
            slices, calls = await _one_run(
                plane, profile, run / f"{profile}-{suffix}", gates=gates, mig_mode=mig_mode
            )
            mode = " in MIG mode" if mig_mode else ""
            calls_by_profile[f"{profile}{mode} ({gates})"] = _counted(calls)
            gated: dict[str, Any] = {**_source(profile), "featureGates": gates}
            if mig_mode:
                gated["migMode"] = "every GPU in MIG mode before the plugin started, no instance"
            body = {"source": gated, "slices": slices}
            (DATA / f"slices-{profile}-{suffix}.json").write_text(json.dumps(body, indent=1) + "\n")
            print(f"{profile} with {gates}: {len(slices)} slices", file=sys.stderr)
        for profile, claims in CLAIMS.items() if containers else ():
            view: dict[str, Any] = {}
            _, calls = await _one_run(
                plane, profile, run / f"{profile}-containers",
                gates=CONTAINER_GATES, during=container_view(plane, claims, view),
            )  # fmt: skip
            calls_by_profile[f"{profile}, prepare and unprepare ({CONTAINER_GATES})"] = _counted(
                calls
            )
            source: dict[str, Any] = {**_source(profile), "featureGates": CONTAINER_GATES}
            body = {"source": source, "claims": view}
            (DATA / f"containers-{profile}.json").write_text(json.dumps(body, indent=1) + "\n")
            print(f"container view on {profile}: {len(view)} claims prepared", file=sys.stderr)
        if containers and set(MPS_CLAIMS) <= set(profiles):
            await _record_mps(plane, run, calls_by_profile)
    body = {"source": _source(), "calls": calls_by_profile}
    (DATA / "nvml-calls.json").write_text(json.dumps(body, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.nvidia_plugin", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="build NVIDIA's plugin from the mirror (once)")
    b.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR)
    r = sub.add_parser("record", help="run it on simulated nodes, record into tests/data")
    r.add_argument("--profile", action="append", help=f"default: {' '.join(PROFILES)}")
    r.add_argument("--no-containers", action="store_true", help="slices only, no prepare")
    r.add_argument("--only-mps", action="store_true", help="the MPS container view alone")
    args = parser.parse_args(argv)
    if args.what == "build":
        print(build_plugin(args.mirror))
        return 0
    if not binary().exists():
        raise SystemExit(f"{binary()} is not built: python -m tests.e2e.nvidia_plugin build")
    asyncio.run(
        record(
            tuple(args.profile or PROFILES),
            containers=not args.no_containers,
            only_mps=args.only_mps,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
