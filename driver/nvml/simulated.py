"""A simulated node: a fake driver root laid out as on AL2023, served by the C NVML.

The hardware answers come from the simulated ``libnvidia-ml.so.1`` (``driver/nvml/sim``)
through the real pynvml, exactly the code path of a GPU node. The root holds
``usr/lib64/libnvidia-ml.so.1`` (a symlink to the version-suffixed file, as the NVIDIA
packages install it), the ``dev/nvidia*`` nodes (character devices when this process may
create them, plain files otherwise), the sysfs tree discovery reads, and the hardware file
the library reads (named by ``$GPU_DRA_SIM_NVML``).

:class:`SimulatedNvml` is what stays of the Python side, and why: the library is loaded once
per process and re-reads its hardware file at each ``nvmlInit``, so before each init this
node's profile and faults (from the profile, ``faults=``, and the YAML state file) are
rendered into that file and the variable pointed at it. It holds no hardware facts and
answers no query; every other attribute is pynvml's own function. One process serves one
simulated node at a time, as one process on a real node sees one machine.
"""

import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import pynvml

from driver.nvml import library
from driver.nvml.faults import Faults, read_state_file
from driver.nvml.profile import Profile, SimGpu, load_profile
from driver.nvml.sim.build import library as built_library
from driver.nvml.sim.hardware import hardware_text
from driver.nvml.sysfs import write_if_changed, write_sysfs

STATE_FILE_ENV = "GPU_DRA_SIM_STATE"
HARDWARE_ENV = "GPU_DRA_SIM_NVML"
HARDWARE_FILE = Path("run/gpu-dra-sim/nvml-hardware")
_NVIDIA_MAJOR = 195
_UVM_MAJOR = 510  # dynamic on a real host; any free major will do here
_CAPS_MAJOR = 508  # nvidia-caps: dynamic too
_IMEX_CHANNELS_MAJOR = 507  # nvidia-caps-imex-channels: dynamic too
# The IMEX management capability, as the driver lists it (NVIDIA's fabric-imex-mgmt file).
IMEX_MGMT_MINOR = 1
IMEX_MGMT_MODE = 256  # decimal, as the driver writes it: 0400
# The driver's fixed MIG minors (/proc/driver/nvidia-caps/mig-minors): config 1, monitor 2,
# then per GPU 15 GPU instance slots of 1 GI access minor and 8 CI access minors each.
_GI_SLOTS, _CI_SLOTS = 15, 8
_init_lock = threading.Lock()


def state_file_from_env() -> Path | None:
    value = os.environ.get(STATE_FILE_ENV)
    return Path(value) if value else None


class SimulatedNvml:
    """pynvml, with ``nvmlInit`` rendering this node's hardware file first (see module doc)."""

    def __init__(
        self,
        profile: Profile,
        root: Path,
        *,
        node_name: str = "node",
        faults: Faults | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.profile = profile
        self.root = root
        self.node_name = node_name
        self.faults = faults or Faults()
        self.state_file = state_file
        self.gpus = profile.gpus(node_name)

    @property
    def hardware_file(self) -> Path:
        return self.root / HARDWARE_FILE

    def effective_faults(self) -> Faults:
        return read_state_file(self.state_file).over(self.faults.over(self.profile.faults))

    def render(self) -> Path:
        """Write the hardware file as the profile and faults say now; its path."""
        faults = self.effective_faults()
        seed = faults.fabric_cluster or self.node_name
        text = hardware_text(
            self.profile, self.gpus, faults, self.profile.fabric_cluster_uuid(seed), self.root
        )
        path = self.hardware_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(text)
        tmp.replace(path)
        return path

    def nvmlInit(self) -> None:
        library.load(self.root)
        with _init_lock:  # the variable and the init it is read by, together
            path = str(self.render())
            if os.environ.get(HARDWARE_ENV) != path:  # set once in a one-node process
                os.environ[HARDWARE_ENV] = path
            pynvml.nvmlInit()

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)


def write_driver_root(root: Path, gpus: tuple[SimGpu, ...], driver_version: str) -> None:
    """Lay out ``root`` as an AL2023 NVIDIA node's: library, device nodes, sysfs."""
    lib_dir = root / "usr" / "lib64"
    lib_dir.mkdir(parents=True, exist_ok=True)
    real = lib_dir / f"libnvidia-ml.so.{driver_version}"
    if not real.exists():
        built = built_library()
        try:
            os.link(built, real)  # one inode for every simulated root of this machine
        except OSError:
            shutil.copyfile(built, real)
    link = lib_dir / library.SONAME
    if not link.is_symlink():
        link.symlink_to(real.name)
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    nodes = {"nvidiactl": (_NVIDIA_MAJOR, 255), "nvidia-uvm": (_UVM_MAJOR, 0)}
    nodes["nvidia-uvm-tools"] = (_UVM_MAJOR, 1)
    nodes.update({f"nvidia{gpu.minor}": (_NVIDIA_MAJOR, gpu.minor) for gpu in gpus})
    for name, (major, minor) in nodes.items():
        _device_node(dev / name, major, minor)
    write_sysfs(root, gpus)
    write_mig_capabilities(root, gpus)
    write_proc_devices(root)


def write_proc_devices(root: Path) -> None:
    """The driver's entries in ``/proc/devices`` and its IMEX management capability, which
    the ComputeDomain driver reads (majors are dynamic on a real host). ``Block devices:``
    follows the character devices, as NVIDIA's parser requires of the file."""
    proc = root / "proc"
    proc.mkdir(exist_ok=True)
    write_if_changed(
        proc / "devices",
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n"
        f"{_NVIDIA_MAJOR} nvidia\n{_IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n"
        f"{_CAPS_MAJOR} nvidia-caps\n{_UVM_MAJOR} nvidia-uvm\n"
        "\nBlock devices:\n  7 loop\n259 blkext\n",
    )
    caps = proc / "driver" / "nvidia" / "capabilities"
    caps.mkdir(parents=True, exist_ok=True)
    write_if_changed(
        caps / "fabric-imex-mgmt",
        f"DeviceFileMinor: {IMEX_MGMT_MINOR}\nDeviceFileMode: {IMEX_MGMT_MODE}\n"
        "DeviceFileModify: 1\n",
    )


def mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of a GI's (``ci`` None) or a CI's ``access`` file."""
    base = 3 + gpu_minor * _GI_SLOTS * (1 + _CI_SLOTS) + gi * (1 + _CI_SLOTS)
    return base if ci is None else base + 1 + ci


def write_mig_capabilities(root: Path, gpus: tuple[SimGpu, ...]) -> None:
    """What the driver keeps for each MIG instance: its ``access`` files under
    ``/proc/driver/nvidia/capabilities`` and its ``/dev/nvidia-caps`` nodes."""
    caps = root / "proc" / "driver" / "nvidia" / "capabilities"
    for gpu in gpus:
        for mig in gpu.mig_instances:
            gi_dir = caps / f"gpu{gpu.minor}" / "mig" / f"gi{mig.gi_id}"
            ci_dir = gi_dir / f"ci{mig.ci_id}"
            ci_dir.mkdir(parents=True, exist_ok=True)
            for directory, minor in (
                (gi_dir, mig_minor(gpu.minor, mig.gi_id)),
                (ci_dir, mig_minor(gpu.minor, mig.gi_id, mig.ci_id)),
            ):
                access = f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                write_if_changed(directory / "access", access)
                (root / "dev" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
                _device_node(
                    root / "dev" / "nvidia-caps" / f"nvidia-cap{minor}", _CAPS_MAJOR, minor
                )


def _device_node(path: Path, major: int, minor: int) -> None:
    if path.exists():
        return
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        path.touch()  # no CAP_MKNOD: a plain file marks where the node would be


class SimulatedNode:
    """A simulated node rooted at ``root_dir`` (pass it as ``sysfs_root`` and driver root)."""

    def __init__(
        self,
        profile: str | Path | Profile,
        node_name: str,
        root_dir: Path,
        *,
        faults: Faults | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.node_name = node_name
        self.root = root_dir
        self.sysfs_root = root_dir
        self.nvml = SimulatedNvml(
            self.profile,
            root_dir,
            node_name=node_name,
            faults=faults,
            state_file=state_file if state_file is not None else state_file_from_env(),
        )
        write_driver_root(root_dir, self.nvml.gpus, self.profile.driver_version)
