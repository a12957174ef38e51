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

- ``slices-<profile>.json``: its slices, with what the server assigns per run dropped;
- ``nvml-calls.json``: every NVML call it made on each profile, with what the simulated
  library answered and how often (the library's call trace, ``$GPU_DRA_SIM_NVML_TRACE``).

Run it under ``flock /tmp/gpu-dra-e2e.lock`` with ``GPU_DRA_E2E_RUN`` set, as any run that
starts cluster components. The plugin runs in a mount namespace of its own whose ``/sys`` is
the simulated node's sysfs tree (NVIDIA's plugin reads the PCIe root from ``/sys`` with no
flag to move it; ours reads the same tree through ``--sysfs-root``), with the flags its Helm
chart sets and the chart's default feature gates (none changed).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
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
# Runs with an alpha gate of NVIDIA's on: (profile, gates, the record's suffix). No
# ConsumableShares: v0.4.1 has no such gate (it came after; tests/data/nvidia-plugin/README.md).
GATED = (("p5e.48xlarge", "DynamicMIG=true", "dynamic-mig"),)
DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-plugin"
K8S_MINOR = "1.37"
# The chart's image for the tag (the plugin only names it in objects it creates).
IMAGE = f"registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:{TAG}"


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


def sim_node(root: Path, profile: str, node_name: str) -> tuple[Path, Path]:
    """The simulated node's driver root (library, device nodes, sysfs, driver files) and its
    hardware file."""
    from driver.nvml.simulated import SimulatedNode
    from tests.simroot import ctk_binary, install_driver_files

    node = SimulatedNode(profile, node_name, root)
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
) -> tuple[list[dict[str, Any]], list[str], str]:
    """NVIDIA's plugin on ``profile`` until its pool is complete: its slices (normalized),
    the NVML call trace, and its log. ``gates``: its --feature-gates; ``during(work,
    node_name)`` runs once the pool is complete, before the plugin is stopped."""
    node_name = f"sim-{profile}"
    plane.call("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name,
        "labels": {"kubernetes.io/hostname": node_name}},
    }, ok=(201, 409))  # fmt: skip
    root, _ = sim_node(work / "root", profile, node_name)
    trace = work / "nvml-trace"
    trace.unlink(missing_ok=True)
    plugins, registry, cdi = work / "plugins", work / "registry", work / "cdi"
    for d in (plugins, registry, cdi):
        d.mkdir(parents=True, exist_ok=True)
    # The chart's DaemonSet: --node-name, the namespace, the CDI root, the driver roots (the
    # host's root at /driver-root in the container; here one directory for both), the
    # kubelet's directories, the cdi hook path (copied from the image; any path here).
    argv = [
        str(binary()), f"--node-name={node_name}", "--namespace=nvidia-dra-driver-gpu",
        f"--cdi-root={cdi}", f"--nvidia-driver-root={root}", f"--container-driver-root={root}",
        f"--nvidia-cdi-hook-path={root / 'usr' / 'bin' / 'nvidia-cdi-hook'}",
        f"--kubelet-registrar-directory-path={registry}",
        f"--kubelet-plugins-directory-path={plugins}",
        f"--kubeconfig={plane.admin_kubeconfig}", f"--image-name={IMAGE}",
        "--service-account-name=nvidia-dra-driver-gpu-service-account-kubeletplugin", "-v=6",
    ]  # fmt: skip
    if gates:
        argv.append(f"--feature-gates={gates}")
    # /proc/driver (MIG capabilities) and /proc/devices (the nvidia-caps major) too: NVIDIA's
    # toolkit library reads the host's, as on a node.
    shell = (
        'mount --bind "$0/sys" /sys && mount --bind "$0/proc/devices" /proc/devices && '
        'mount --bind "$0/proc/driver" /proc/driver && exec "$@"'
    )
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
# kubelet prepares a claim once per node): "one-gpu". MPS is left out: NVIDIA's prepare
# starts its control daemon as a Deployment and waits for its pod, which needs a kubelet.
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


def normalize_text(text: str, subs: dict[str, str]) -> str:
    """``text`` with each key of ``subs`` (longest first) replaced by its placeholder."""
    for old in sorted(subs, key=len, reverse=True):
        text = text.replace(old, subs[old])
    return text


def container_view(
    plane: cluster.ControlPlane,
    claims: dict[str, tuple[list[str], list[dict[str, Any]]]],
    out: dict[str, Any],
) -> During:
    """What NVIDIA's plugin prepares for each of ``claims``, into ``out``: the CDI device
    IDs it answers, the CDI spec files it writes (paths and claim UIDs normalized), and the
    files left after unprepare."""

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
                undone = MessageToDict(await kubelet.unprepare([ref]))
                out[name] = {
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


async def record(profiles: tuple[str, ...], *, containers: bool = True) -> None:
    run = cluster.run_root() / "nvidia-plugin"
    calls_by_profile: dict[str, list[list[Any]]] = {}
    DATA.mkdir(parents=True, exist_ok=True)
    async with cluster.ControlPlane(run / "plane", K8S_MINOR) as plane:
        for profile in profiles:
            slices, calls = await _one_run(plane, profile, run / profile)
            calls_by_profile[profile] = _counted(calls)
            body = {"source": _source(profile), "slices": slices}
            (DATA / f"slices-{profile}.json").write_text(json.dumps(body, indent=1) + "\n")
            print(f"{profile}: {sum(len(s['spec'].get('devices', [])) for s in slices)} devices "
                  f"in {len(slices)} slices, {len(calls)} NVML calls", file=sys.stderr)  # fmt: skip
        for profile, gates, suffix in GATED if set(PROFILES) <= set(profiles) else ():
            slices, calls = await _one_run(plane, profile, run / f"{profile}-{suffix}", gates=gates)
            calls_by_profile[f"{profile} ({gates})"] = _counted(calls)
            gated: dict[str, Any] = {**_source(profile), "featureGates": gates}
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
    args = parser.parse_args(argv)
    if args.what == "build":
        print(build_plugin(args.mirror))
        return 0
    if not binary().exists():
        raise SystemExit(f"{binary()} is not built: python -m tests.e2e.nvidia_plugin build")
    asyncio.run(record(tuple(args.profile or PROFILES), containers=not args.no_containers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
