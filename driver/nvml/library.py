"""Find and load ``libnvidia-ml.so.1`` under a driver root, as a GPU node's plugin pod must.

pynvml opens the library with ``CDLL("libnvidia-ml.so.1")`` once per process, from the
default loader path, which inside the plugin's container holds no NVIDIA library: the
host's driver is mounted at the container driver root. So :func:`load` opens the library by
its absolute path first; the loader then answers pynvml's ``dlopen`` by soname with the copy
already loaded. Which copy that is gets checked from ``/proc/self/maps``, not assumed.

Symlinks are resolved inside the driver root, as a ``chroot`` would: an absolute link target
is taken relative to the root and ``..`` stops at it, so a link can never lead out of the
root to a library of this container. Only when no root directory has the library is the
default loader path tried.
"""

import ctypes
import hashlib
import logging
import threading
from pathlib import Path, PurePosixPath

from driver.common.errors import PermanentError
from driver.common.logs import kv

log = logging.getLogger(__name__)

SONAME = "libnvidia-ml.so.1"
# Library directories of the systems we run on, relative to the driver root.
LIBRARY_DIRS = (
    "usr/lib64",  # Amazon Linux 2023 (EKS NVIDIA AMI), RHEL
    "usr/lib/x86_64-linux-gnu",  # Ubuntu, Debian
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/local/nvidia/lib64",  # GKE-style and driver-container installs
    "x86_64-bottlerocket-linux-gnu/sys-root/usr/lib/nvidia/tesla",  # Bottlerocket
    "aarch64-bottlerocket-linux-gnu/sys-root/usr/lib/nvidia/tesla",
)
# Every C symbol our NVML calls bind (pynvml's choice of variant), with the first driver
# branch that has it. Optional ones are handled by discovery when absent.
REQUIRED_SYMBOLS = {
    "nvmlInitWithFlags": "R418",
    "nvmlShutdown": "R418",
    "nvmlErrorString": "R418",
    "nvmlSystemGetDriverVersion": "R418",
    "nvmlSystemGetCudaDriverVersion": "R418",
    "nvmlDeviceGetCount_v2": "R418",
    "nvmlDeviceGetHandleByIndex_v2": "R418",
    "nvmlDeviceGetMinorNumber": "R418",
    "nvmlDeviceGetUUID": "R418",
    "nvmlDeviceGetName": "R418",
    "nvmlDeviceGetBrand": "R418",
    "nvmlDeviceGetCudaComputeCapability": "R418",
    "nvmlDeviceGetMemoryInfo": "R418",
    "nvmlDeviceGetPciInfo_v3": "R418",
    "nvmlDeviceGetNvLinkState": "R418",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2": "R418",
    "nvmlDeviceGetArchitecture": "R450",
    "nvmlDeviceGetMigMode": "R450",
    "nvmlDeviceGetNvLinkRemoteDeviceType": "R460",
    # MIG (called for GPUs in MIG mode only).
    "nvmlDeviceGetMaxMigDeviceCount": "R450",
    "nvmlDeviceGetMigDeviceHandleByIndex": "R450",
    "nvmlDeviceGetGpuInstanceId": "R450",
    "nvmlDeviceGetComputeInstanceId": "R450",
    "nvmlDeviceGetGpuInstanceById": "R450",
    "nvmlGpuInstanceGetInfo": "R450",
    "nvmlGpuInstanceGetComputeInstanceById": "R450",
    "nvmlComputeInstanceGetInfo_v2": "R460",
    "nvmlDeviceGetGpuInstanceProfileInfoV": "R470",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV": "R470",
    # Dynamic MIG (--dynamic-mig): placements, and making and removing instances.
    "nvmlDeviceGetHandleByUUID": "R418",
    "nvmlDeviceGetGpuInstances": "R450",
    "nvmlGpuInstanceGetComputeInstances": "R450",
    "nvmlGpuInstanceCreateComputeInstance": "R450",
    "nvmlComputeInstanceDestroy": "R450",
    "nvmlGpuInstanceDestroy": "R450",
    "nvmlDeviceCreateGpuInstanceWithPlacement": "R470",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2": "R470",
}
OPTIONAL_SYMBOLS = {"nvmlDeviceGetGpuFabricInfoV": "R550"}
SYMLINK_HOPS = 40  # as the kernel's limit

_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None
_loaded_digest: str | None = None
_served: dict[Path, Path] = {}  # driver roots already answered, and with which file


class LibraryNotFoundError(PermanentError):
    """No ``libnvidia-ml.so.1`` under the driver root nor on the default loader path."""


class LibraryError(PermanentError):
    """A library was found but cannot serve us: too old, or a different copy already loaded."""


def resolve_in_root(root: Path, relative: str | PurePosixPath) -> Path | None:
    """``root/relative`` with every symlink resolved inside ``root``; None when absent."""
    parts = list(PurePosixPath(relative).parts)
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("/", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > SYMLINK_HOPS:
                return None
            target = PurePosixPath(candidate.readlink())
            if target.is_absolute():
                resolved = []
            parts = list(target.parts) + parts
            continue
        if not candidate.exists():
            return None
        resolved.append(part)
    return root.joinpath(*resolved)


def candidates(driver_root: Path) -> list[Path]:
    """Where the library is looked for under ``driver_root``, in order."""
    return [driver_root / d / SONAME for d in LIBRARY_DIRS]


def find(driver_root: Path) -> Path | None:
    """The real file behind the first ``libnvidia-ml.so.1`` under ``driver_root``."""
    for directory in LIBRARY_DIRS:
        found = resolve_in_root(driver_root, PurePosixPath(directory) / SONAME)
        if found is not None and found.is_file():
            return found
    return None


def mapped_copies() -> list[tuple[Path, int]]:
    """``libnvidia-ml`` files mapped into this process and their inodes, from /proc/self/maps.

    A path whose file was removed since (a finished test's root) keeps the kernel's
    `` (deleted)`` mark.
    """
    copies: list[tuple[Path, int]] = []
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return copies
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libnvidia-ml.so"):
            copy = (Path(fields[5]), int(fields[4]))
            if copy not in copies:
                copies.append(copy)
    return copies


def load(driver_root: Path) -> Path:
    """Load the driver root's NVML (else the default loader path's) for pynvml; its path.

    Idempotent. Raises :class:`LibraryNotFoundError` naming every path tried, or
    :class:`LibraryError` when the library lacks a symbol we call or another library of
    that soname is already loaded in this process (the loader keeps one per soname).
    """
    with _lock:
        if driver_root not in _served:
            _served[driver_root] = _load(driver_root)
        return _served[driver_root]


def _load(driver_root: Path) -> Path:
    global _loaded, _loaded_digest
    found = find(driver_root)
    already = mapped_copies()
    if already:
        current, inode = already[0]
        if found is not None and not _same_library(found, inode):
            raise LibraryError(
                f"{SONAME} is already loaded from {current}: this process cannot also "
                f"load {found} (the loader keeps one library per soname)"
            )
        return found or current
    if found is None:
        found = _from_default_path(driver_root)
    else:
        try:
            _loaded = ctypes.CDLL(str(found))
        except OSError as exc:
            raise LibraryError(f"cannot load {found}: {exc}") from exc
    mapped = mapped_copies()
    # By inode, or by path: on overlayfs the maps may name the lower file's inode.
    inode = found.stat().st_ino
    if not any(i == inode or p == found for p, i in mapped):
        raise LibraryError(f"loaded {found}, but this process maps {mapped or 'no NVML'}")
    _loaded_digest = _digest(found)
    _check_symbols(found)
    log.debug("NVML library loaded", extra=kv(path=str(found), driver_root=str(driver_root)))
    return found


def _from_default_path(driver_root: Path) -> Path:
    global _loaded
    try:
        _loaded = ctypes.CDLL(SONAME)
    except OSError as exc:
        tried = ", ".join(str(c) for c in candidates(driver_root))
        raise LibraryNotFoundError(
            f"NVML library {SONAME} not found under the driver root {driver_root} (tried "
            f"{tried}) nor on the default library path: set --container-driver-root to "
            "where the host's driver root is mounted (chart value nvidiaDriverRoot is the "
            "host's driver root, mounted at /driver-root), or use --nvml simulated"
        ) from exc
    mapped = mapped_copies()
    if not mapped:
        raise LibraryError(f"{SONAME} loaded from the default path but is not mapped")
    return mapped[0][0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _same_library(found: Path, loaded_inode: int) -> bool:
    """Whether ``found`` is the library loaded: the same file, or a copy of its bytes."""
    try:
        if found.stat().st_ino == loaded_inode:
            return True
        # Two simulated roots in one test process: a copy of the same build is the same
        # library; a different build is not.
        return _loaded_digest is not None and _digest(found) == _loaded_digest
    except OSError:
        return False


def _check_symbols(path: Path) -> None:
    lib = ctypes.CDLL(str(path))
    for symbol, since in REQUIRED_SYMBOLS.items():
        if not hasattr(lib, symbol):
            raise LibraryError(
                f"{path} has no {symbol}, which this plugin calls: the NVIDIA driver is too "
                f"old (driver {since} or later is needed); upgrade the node's driver"
            )
    for symbol, since in OPTIONAL_SYMBOLS.items():
        if not hasattr(lib, symbol):
            log.info(
                "NVML lacks an optional function",
                extra=kv(symbol=symbol, since=since, effect="no NVLink fabric identity"),
            )
