"""``gpu-dra doctor``'s looking: read-only, one small function per thing looked at, each
returning plain values for :class:`cli._doctorchecks.Found`. Nothing here judges.

Host files are looked for where they are, then under the driver root: in the chart's plugin
pod the host's root is mounted at /driver-root when the driver root is / (EKS AL2023).
"""

import argparse
import os
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from cli import _nvmlargs as nvml_args
from cli._doctorchecks import Cluster, Found

if TYPE_CHECKING:
    from driver.nvml import Nvml, SysfsRoot

_CTK_LOCATIONS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/toolkit")
_MPS_BINARIES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
_CDI_GENERATE_TIMEOUT_S = 60.0
_IN_CLUSTER = "KUBERNETES_SERVICE_HOST"


def gather(args: argparse.Namespace) -> Found:
    """Everything the checks read, from the node the flags name."""
    from driver.common.errors import DriverError
    from driver.nvml import library

    node = nvml_args.node_name(args, per_profile=True)
    simulated = args.nvml == "simulated"
    found = Found(
        node=node,
        driver_name=args.driver_name,
        simulated=simulated,
        driver_root=args.container_driver_root,
    )
    try:
        with nvml_args.open_backend(args, node) as (backend, sysfs_root):
            # Simulated hardware brings its own root; look at it while it exists.
            root = Path(sysfs_root) if simulated else Path(args.container_driver_root)
            found = replace(found, driver_root=str(root), **_nvml(backend, sysfs_root, root))
            return _files(found, root, args)
    except DriverError as exc:
        root = Path(args.container_driver_root)
        lib = library.find(root)
        found = replace(
            found,
            nvml_library=str(lib) if lib else None,
            nvml_tried=tuple(str(c) for c in library.candidates(root)),
            nvml_error=str(exc) if lib else None,
        )
        return _files(found, root, args)


def _nvml(backend: "Nvml", sysfs_root: "SysfsRoot", root: Path) -> dict[str, Any]:
    from driver.common.errors import DriverError
    from driver.nvml import library
    from drivers.gpu.model.discovery import discover

    # The copy this process mapped is the one used (the default path's, when the root had none).
    mapped = [str(p) for p, _ in library.mapped_copies()]
    lib = mapped[0] if mapped else (str(library.find(root)) if library.find(root) else None)
    try:
        inventory = discover(backend, sysfs_root=sysfs_root)
    except DriverError as exc:
        return {"nvml_library": lib, "nvml_error": str(exc)}
    return {
        "nvml_library": lib,
        "driver_version": inventory.driver_version,
        "cuda_version": ".".join(map(str, inventory.cuda_driver_version)),
        "gpus": len(inventory.gpus),
    }


def _files(found: Found, root: Path, args: argparse.Namespace) -> Found:
    registrar = Path(args.kubelet_registrar_directory_path)
    plugins = Path(args.kubelet_plugins_directory_path)
    dev_dirs = _unique([root / "dev", *([] if found.simulated else [Path("/dev")])])
    ctk = _find_ctk(root, search_path=not found.simulated)
    config = _first_file(root, Path(args.containerd_config))
    device_plugins = _first_dir(root, plugins.parent / "device-plugins")
    mps_dir = Path(args.mps_control).parent if args.mps_control else root / "usr" / "bin"
    return replace(
        found,
        dev_dirs=tuple(str(d) for d in dev_dirs),
        dev_nodes=tuple(sorted({p.name for d in dev_dirs for p in _nvidia_entries(d)})),
        ctk=str(ctk) if ctk else None,
        cdi_generate_error=_cdi_generate(ctk, root) if ctk else None,
        containerd_config=str(config) if config else None,
        containerd_text=config.read_text(errors="replace") if config else None,
        cdi_root=args.cdi_root,
        registrar_dir=str(registrar),
        registrar_exists=registrar.is_dir(),
        plugins_dir=str(plugins),
        plugins_exists=plugins.is_dir(),
        device_plugin_dir=str(device_plugins) if device_plugins else None,
        device_plugin_sockets=_sockets(device_plugins, "nvidia*.sock") if device_plugins else (),
        mps_binaries={name: (mps_dir / name).is_file() for name in _MPS_BINARIES},
        registration_sockets=_sockets(registrar, f"{found.driver_name}*-reg.sock"),
        dra_sockets=_sockets(plugins / found.driver_name, "dra*.sock"),
        **_cluster(found, args),
    )


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(p.resolve() if p.exists() else p for p in paths))


def _nvidia_entries(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.name.startswith("nvidia")]
    except OSError:
        return []


def _under(root: Path, path: Path) -> Path:
    return root / PurePosixPath(path).relative_to("/") if path.is_absolute() else root / path


def _first_file(root: Path, path: Path) -> Path | None:
    return next((p for p in (path, _under(root, path)) if p.is_file()), None)


def _first_dir(root: Path, path: Path) -> Path | None:
    return next((p for p in (path, _under(root, path)) if p.is_dir()), None)


def _find_ctk(root: Path, *, search_path: bool) -> Path | None:
    for location in _CTK_LOCATIONS:
        candidate = root / location / "nvidia-ctk"
        if candidate.is_file():
            return candidate
    found = shutil.which("nvidia-ctk") if search_path else None
    return Path(found) if found else None


def _cdi_generate(ctk: Path, root: Path) -> str | None:
    """Run the plugin's own ``nvidia-ctk cdi generate`` (to stdout: nothing is written);
    its error, or None when it printed a spec."""
    argv = [str(ctk), "cdi", "generate", "--format=json", f"--driver-root={root}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_CDI_GENERATE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return None if done.stdout.lstrip().startswith("{") else "printed no CDI spec"


def _sockets(directory: Path, pattern: str) -> tuple[str, ...]:
    try:
        return tuple(
            sorted(p.name for p in directory.glob(pattern) if stat.S_ISSOCK(p.lstat().st_mode))
        )
    except OSError:
        return ()


def _cluster(found: Found, args: argparse.Namespace) -> dict[str, Any]:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if not kubeconfig and default.is_file():
        kubeconfig = str(default)
    if not kubeconfig and not os.environ.get(_IN_CLUSTER):
        return {"cluster_skip": "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod"}
    import asyncio

    return {"cluster": asyncio.run(_ask(kubeconfig, found))}


async def _ask(kubeconfig: str | None, found: Found) -> Cluster:
    from driver.common.errors import DriverError
    from driver.kube.client import api_client
    from driver.kube.resources import NODES, RESOURCE_SLICES
    from driver.kube.rest import Client

    try:
        api = await api_client(kubeconfig, component="doctor")
    except DriverError as exc:
        return Cluster(error=str(exc))
    async with api:
        client = Client(api)
        try:
            version = await client.get_json("/version", resource="version")
            groups = await client.get_json("/apis/resource.k8s.io", resource="resource.k8s.io")
            served = {v.get("version") for v in groups.get("versions") or ()}
            if "v1" not in served:
                return Cluster(server_version=version.get("gitVersion"))
            nodes = await client.list_all(
                NODES, query=[("fieldSelector", f"metadata.name={found.node}")]
            )
            selector = f"spec.nodeName={found.node},spec.driver={found.driver_name}"
            slices = await client.list_all(RESOURCE_SLICES, query=[("fieldSelector", selector)])
        except DriverError as exc:
            return Cluster(error=str(exc))
    info = ((nodes[0].get("status") or {}).get("nodeInfo") or {}) if nodes else {}
    return Cluster(
        server_version=version.get("gitVersion"),
        dra_api=True,
        node_found=bool(nodes),
        kubelet_version=info.get("kubeletVersion"),
        slices=len(slices),
        devices=sum(len((s.get("spec") or {}).get("devices") or ()) for s in slices),
    )
