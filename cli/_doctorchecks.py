"""``gpu-dra doctor``'s judgement: pure functions from what was found on a node to one
verdict per question users ask (NVIDIA's issues: driver root, NVML, CDI, device plugin,
socket paths). :mod:`cli._doctorfound` does the looking; nothing here reads a file.
"""

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

# sun_path is 108 bytes with its NUL, and gRPC refuses 106 and more.
from kubeletplugin.sockets import MAX_SOCKET_PATH

# A surge upgrade's sockets carry the new pod's UID, the longest names the plugin binds.
_POD_UID = "00000000-0000-0000-0000-000000000000"
_CD_DRIVER = "compute-domain.nvidia.com"
_RELEASE = "gpu-dra-driver"
_CHART = "charts/gpu-dra-driver -n gpu-dra-driver"
_LOGS = f"kubectl -n {_RELEASE} logs ds/{_RELEASE}-kubelet-plugin"
# containerd 1.7's CRI plugin, and 2.x's runtime half of it (config version 3).
_CRI_V2 = ("plugins", "io.containerd.grpc.v1.cri")
_CRI_V3 = ("plugins", "io.containerd.cri.v1.runtime")
_DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_GPU_NODE = re.compile(r"nvidia\d+")


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"  # worth knowing, breaks nothing by itself
    FAIL = "fail"
    SKIP = "skip"  # could not be looked at from here; the detail says why


@dataclass(frozen=True)
class Verdict:
    name: str
    status: Status
    detail: str
    fix: str | None = None  # the one command that fixes a warn or fail


@dataclass(frozen=True)
class Cluster:
    """What the API server says about this node; ``error``: it could not be asked."""

    server_version: str | None = None
    dra_api: bool = False
    node_found: bool = False
    kubelet_version: str | None = None
    slices: int = 0
    devices: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Found:
    """What the I/O layer saw. Paths are as seen from where doctor runs."""

    node: str
    driver_name: str
    simulated: bool
    driver_root: str
    nvml_library: str | None = None
    nvml_tried: tuple[str, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: int | None = None
    nvml_error: str | None = None
    dev_nodes: tuple[str, ...] = ()
    dev_dirs: tuple[str, ...] = ()
    ctk: str | None = None
    cdi_generate_error: str | None = None
    containerd_config: str | None = None  # the file read; None: none found
    containerd_text: str | None = None
    cdi_root: str = "/var/run/cdi"
    registrar_dir: str = "/var/lib/kubelet/plugins_registry"
    registrar_exists: bool = False
    plugins_dir: str = "/var/lib/kubelet/plugins"
    plugins_exists: bool = False
    device_plugin_dir: str | None = None  # None: not visible from here
    device_plugin_sockets: tuple[str, ...] = ()
    mps_binaries: dict[str, bool] = field(default_factory=dict)
    registration_sockets: tuple[str, ...] = ()
    dra_sockets: tuple[str, ...] = ()
    cluster: Cluster | None = None
    cluster_skip: str | None = None


def nvml(f: Found) -> Verdict:
    if f.nvml_library is None and not f.simulated:
        return Verdict(
            "nvml",
            Status.FAIL,
            f"libnvidia-ml.so.1 not found under the driver root {f.driver_root} "
            f"(tried {', '.join(f.nvml_tried) or 'nothing'}); is the driver installed there?",
            f"helm upgrade {_RELEASE} {_CHART} --reuse-values "
            "--set nvidiaDriverRoot=<the directory holding usr/lib64/libnvidia-ml.so.1>",
        )
    if f.nvml_error is not None:
        return Verdict(
            "nvml",
            Status.FAIL,
            f"{f.nvml_library or 'NVML'} found but not usable: {f.nvml_error}",
            "nvidia-smi  # on the host: says why the driver does not answer",
        )
    sim = " (simulated)" if f.simulated else ""
    return Verdict(
        "nvml",
        Status.OK,
        f"{f.nvml_library}{sim}: driver {f.driver_version}, CUDA {f.cuda_version}, {f.gpus} GPU(s)",
    )


def device_nodes(f: Found) -> Verdict:
    gpu_nodes = sorted(n for n in f.dev_nodes if _GPU_NODE.fullmatch(n))
    where = " or ".join(f.dev_dirs)
    fix = "nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules"
    if "nvidiactl" not in f.dev_nodes or not gpu_nodes:
        missing = "nvidiactl" if "nvidiactl" not in f.dev_nodes else "nvidia<N>"
        return Verdict("devices", Status.FAIL, f"no /dev/{missing} in {where}", fix)
    if f.gpus is not None and len(gpu_nodes) < f.gpus:
        # NVIDIA's issue 1380: a fresh node's first pod got a spec written before these.
        return Verdict(
            "devices",
            Status.FAIL,
            f"{len(gpu_nodes)} /dev/nvidia<N> node(s) for {f.gpus} GPU(s) in {where}",
            fix,
        )
    return Verdict("devices", Status.OK, f"nvidiactl and {len(gpu_nodes)} GPU node(s) in {where}")


def toolkit(f: Found) -> Verdict:
    if f.ctk is None:
        if f.simulated:
            return Verdict(
                "toolkit", Status.SKIP, "simulated hardware: the plugin needs no toolkit"
            )
        return Verdict(
            "toolkit",
            Status.FAIL,
            f"nvidia-ctk not found under {f.driver_root} (usr/bin, usr/local/bin, "
            "usr/local/nvidia/toolkit) nor on PATH: the plugin cannot write CDI specs",
            "sudo dnf install -y nvidia-container-toolkit  # apt-get on Ubuntu",
        )
    if f.cdi_generate_error is not None:
        return Verdict(
            "toolkit",
            Status.FAIL,
            f"{f.ctk} cdi generate failed: {f.cdi_generate_error}",
            f"{f.ctk} cdi generate --driver-root={f.driver_root}  # on the host, to see it fail",
        )
    return Verdict("toolkit", Status.OK, f"{f.ctk}: cdi generate works")


def containerd_cdi(f: Found) -> Verdict:
    """containerd reads CDI specs only with CDI on: 2.x (config version 3) by default, 1.7
    only with ``enable_cdi = true``; and only from ``cdi_spec_dirs``."""
    restart = "sudo systemctl restart containerd"
    if f.containerd_config is None or f.containerd_text is None:
        return Verdict(
            "containerd-cdi",
            Status.WARN,
            "no containerd config found: containerd 2.x enables CDI by default, 1.7 does not",
            "containerd config dump | grep -E 'enable_cdi|cdi_spec_dirs'  # on the host",
        )
    try:
        config = tomllib.loads(f.containerd_text)
    except tomllib.TOMLDecodeError as exc:
        return Verdict("containerd-cdi", Status.FAIL, f"{f.containerd_config}: {exc}")
    version = config.get("version", 1)
    section = _table(config, _CRI_V3 if version == 3 else _CRI_V2)
    enabled = section.get("enable_cdi", version == 3)
    if enabled is not True:
        key = '[plugins."io.containerd.grpc.v1.cri"] enable_cdi = true'
        return Verdict(
            "containerd-cdi",
            Status.FAIL,
            f"{f.containerd_config}: CDI is off (containerd 1.7 needs {key})",
            f"{restart}  # after setting {key} in {f.containerd_config}",
        )
    dirs = section.get("cdi_spec_dirs", list(_DEFAULT_CDI_DIRS))
    if isinstance(dirs, list) and f.cdi_root.rstrip("/") not in [str(d).rstrip("/") for d in dirs]:
        return Verdict(
            "containerd-cdi",
            Status.FAIL,
            f"{f.containerd_config}: cdi_spec_dirs {dirs} leave out the chart's cdiRoot "
            f"{f.cdi_root}: containerd never sees the claims' specs",
            f"{restart}  # after adding {f.cdi_root} to cdi_spec_dirs",
        )
    return Verdict(
        "containerd-cdi", Status.OK, f"{f.containerd_config}: CDI on, reads {f.cdi_root}"
    )


def _table(config: dict[str, object], path: tuple[str, ...]) -> dict[str, object]:
    node: object = config
    for key in path:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def kubelet_dirs(f: Found) -> Verdict:
    missing = [
        d
        for d, there in ((f.registrar_dir, f.registrar_exists), (f.plugins_dir, f.plugins_exists))
        if not there
    ]
    if missing:
        return Verdict(
            "kubelet-dirs",
            Status.FAIL,
            f"{', '.join(missing)} missing: not the kubelet's directories (a custom --root-dir?)",
            f"helm upgrade {_RELEASE} {_CHART} --reuse-values "
            "--set kubeletPlugin.kubeletPluginsDirectoryPath=<root-dir>/plugins "
            "--set kubeletPlugin.kubeletRegistrarDirectoryPath=<root-dir>/plugins_registry",
        )
    longest = max(
        (
            path
            for driver in (f.driver_name, _CD_DRIVER)
            for path in (
                f"{f.registrar_dir.rstrip('/')}/{driver}-{_POD_UID}-reg.sock",
                f"{f.plugins_dir.rstrip('/')}/{driver}/dra-{_POD_UID}.sock",
            )
        ),
        key=lambda p: len(os.fsencode(p)),
    )
    size = len(os.fsencode(longest))
    if size > MAX_SOCKET_PATH:
        return Verdict(
            "kubelet-dirs",
            Status.FAIL,
            f"socket path {longest} is {size} bytes, over the {MAX_SOCKET_PATH} a unix socket "
            "can bind through gRPC",
            "kubelet --root-dir=<a shorter directory>  # or a shorter --driver-name",
        )
    return Verdict(
        "kubelet-dirs",
        Status.OK,
        f"{f.registrar_dir} and {f.plugins_dir}; longest socket path {size} of "
        f"{MAX_SOCKET_PATH} bytes",
    )


def device_plugin(f: Found) -> Verdict:
    if f.device_plugin_dir is None:
        return Verdict(
            "device-plugin", Status.SKIP, "the kubelet's device-plugins directory is not visible"
        )
    if f.device_plugin_sockets:
        return Verdict(
            "device-plugin",
            Status.FAIL,
            f"NVIDIA's device plugin serves this node too ({', '.join(f.device_plugin_sockets)} "
            f"in {f.device_plugin_dir}): both hand out the same GPUs",
            "kubectl -n kube-system delete daemonset nvidia-device-plugin-daemonset",
        )
    return Verdict("device-plugin", Status.OK, f"no nvidia device plugin in {f.device_plugin_dir}")


def mps(f: Found) -> Verdict:
    absent = sorted(name for name, there in f.mps_binaries.items() if not there)
    if absent:
        return Verdict(
            "mps",
            Status.WARN,
            f"{', '.join(absent)} not under {f.driver_root}: claims sharing a GPU by MPS fail "
            "(other claims are served)",
            f"helm upgrade {_RELEASE} {_CHART} --reuse-values "
            "--set 'kubeletPlugin.extraArgs={--mps-control=<host path of "
            "nvidia-cuda-mps-control>}'",
        )
    return Verdict("mps", Status.OK, f"{', '.join(sorted(f.mps_binaries))} present")


def registration(f: Found) -> Verdict:
    if not f.registration_sockets or not f.dra_sockets:
        return Verdict(
            "registration",
            Status.FAIL,
            f"no {f.driver_name} registration socket in {f.registrar_dir} or DRA socket in "
            f"{f.plugins_dir}/{f.driver_name}: the plugin is not serving on this node",
            _LOGS,
        )
    return Verdict(
        "registration",
        Status.OK,
        f"{', '.join(f.registration_sockets)}; {', '.join(f.dra_sockets)}",
    )


def kubernetes(f: Found) -> Verdict:
    c = f.cluster
    if c is None:
        return Verdict("kubernetes", Status.SKIP, f.cluster_skip or "no API server to ask")
    if c.error is not None:
        return Verdict("kubernetes", Status.FAIL, c.error, "kubectl auth can-i list resourceslices")
    if not c.dra_api:
        return Verdict(
            "kubernetes",
            Status.FAIL,
            f"the API server ({c.server_version}) does not serve resource.k8s.io/v1: "
            "DRA needs Kubernetes 1.34 or later",
            "eksctl upgrade cluster --version=1.34  # or your platform's upgrade",
        )
    if not c.node_found:
        return Verdict(
            "kubernetes",
            Status.FAIL,
            f"no Node {f.node}: pass --node-name as the API server names this node",
        )
    older = _minor(c.kubelet_version) < 34
    detail = (
        f"API server {c.server_version}, resource.k8s.io/v1 served; node {f.node}'s kubelet "
        f"{c.kubelet_version}"
    )
    if older:
        return Verdict(
            "kubernetes",
            Status.FAIL,
            detail + ": a kubelet before 1.34 does not call DRA drivers' v1 API",
            "eksctl upgrade nodegroup --kubernetes-version=1.34  # or your platform's upgrade",
        )
    return Verdict("kubernetes", Status.OK, detail)


def _minor(version: str | None) -> int:
    match = re.match(r"v?1\.(\d+)", version or "")
    return int(match.group(1)) if match else 0


def slices(f: Found) -> Verdict:
    c = f.cluster
    if c is None or c.error is not None or not c.node_found:
        return Verdict("slices", Status.SKIP, "needs the API server (see kubernetes)")
    if not c.slices:
        return Verdict(
            "slices",
            Status.FAIL,
            f"no ResourceSlice of {f.driver_name} for node {f.node}: no claim can get its GPUs",
            _LOGS,
        )
    if f.gpus is not None and c.devices < f.gpus:
        return Verdict(
            "slices",
            Status.WARN,
            f"{c.slices} ResourceSlice(s) with {c.devices} device(s), for {f.gpus} GPU(s)",
            _LOGS,
        )
    return Verdict("slices", Status.OK, f"{c.slices} ResourceSlice(s), {c.devices} device(s)")


CHECKS: tuple[Callable[[Found], Verdict], ...] = (
    nvml,
    device_nodes,
    toolkit,
    containerd_cdi,
    kubelet_dirs,
    device_plugin,
    mps,
    kubernetes,
    registration,
    slices,
)


def judge(found: Found) -> list[Verdict]:
    return [check(found) for check in CHECKS]
