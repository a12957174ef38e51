"""Where an MPS control daemon's pipe directory lives, short enough for its sockets.

``nvidia-cuda-mps-control -f`` binds unix sockets in its pipe directory
(``CUDA_MPS_PIPE_DIRECTORY``): ``control`` and ``control_privileged``; beside them it makes
``control_lock`` and ``nvidia-cuda-mps-control.pid`` (files) and ``log`` (a FIFO), and its
server adds nothing there for a client (all read on an H200, driver 580.159.04, MPS 13000,
with a CUDA client running). A socket path must fit ``sun_path``; the real daemon is one
byte stricter than the kernel: it runs with ``control_privileged`` at 106 bytes and exits 1,
printing nothing, at 107 (and at 108, 109, 114). So every socket path here is held to
:data:`MAX_SOCKET_PATH` = 106, budgeted for the longest socket name, ``control_privileged``.

The release before this one put the pipe under the kind's state,
``<plugins>/gpu.nvidia.com/kinds/gpu/mps/GPU-<uuid>/pipe/``: at the chart's default plugins
directory ``control_privileged`` was 118 bytes there, and no daemon ever started on a node.
The pipe now sits right under the driver's plugin directory, named by a short digest of the
GPU's UUID (the same every start, every release: nothing but the UUID goes in)::

    /var/lib/kubelet/plugins          24  the chart's kubeletPluginsDirectoryPath
    /gpu.nvidia.com                   15  the driver's plugin directory
    /mps                               4
    /0123456789ab                     13  sha256(uuid)[:12], 48 bits: no two GPUs of a node meet
    /control_privileged               19
                                     ---
                                      75  of 106: 31 to spare

so the plugins directory may be up to 55 bytes long (a kubelet root of 47) with
``gpu.nvidia.com``; :func:`check` refuses a longer one at the plugin's start. Containers
see the pipe at the same path (the CDI spec and the daemon's pod mount it there), so the
budget holds inside them too. The daemon's log, its pid or pod file and the holders stay in
the kind's state directory: no socket lives there.
"""

import hashlib
import os
from pathlib import Path

from driver.common.errors import PermanentError

# Measured on the real daemon (see above): sun_path's 108 bytes less the NUL, less one.
MAX_SOCKET_PATH = 106
SOCKET_NAMES = ("control", "control_privileged")
LONGEST_SOCKET = max(SOCKET_NAMES, key=len)
PIPES_DIR = "mps"
KEY_CHARS = 12
# The previous release's pipe under the kind's state: <state>/mps/<uuid>/pipe.
LEGACY_PIPE = "pipe"


class PipePathTooLongError(PermanentError):
    """The plugins directory leaves no room for the MPS sockets: a setting to change."""


def gpu_key(uuid: str) -> str:
    """The GPU's directory name: a digest of its UUID alone, so stable across restarts
    and upgrades, and short whatever the UUID."""
    return hashlib.sha256(uuid.encode()).hexdigest()[:KEY_CHARS]


def pipes_root(plugin_dir: Path) -> Path:
    """``<plugins>/<driver>/mps``: holds every GPU's pipe directory."""
    return plugin_dir / PIPES_DIR


def pipe_dir(plugin_dir: Path, uuid: str) -> Path:
    return pipes_root(plugin_dir) / gpu_key(uuid)


def legacy_pipe_dir(gpu_state_dir: Path) -> Path:
    """The previous release's pipe of a GPU whose state is ``<state>/mps/<uuid>``."""
    return gpu_state_dir / LEGACY_PIPE


def longest_socket(plugin_dir: Path) -> Path:
    """The longest socket path any daemon of this layout binds."""
    return pipes_root(plugin_dir) / ("0" * KEY_CHARS) / LONGEST_SOCKET


def socket_bytes(path: Path) -> int:
    return len(os.fsencode(path))


def check(plugin_dir: Path) -> None:
    """Refuse a plugin directory under which the MPS sockets cannot be bound."""
    longest = longest_socket(plugin_dir)
    size = socket_bytes(longest)
    if size > MAX_SOCKET_PATH:
        raise PipePathTooLongError(
            f"MPS pipe directory under {plugin_dir} ({socket_bytes(plugin_dir)} bytes) is too "
            f"long: its socket {longest.name} would be {size} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit of nvidia-cuda-mps-control; use a plugin directory "
            f"of at most {socket_bytes(plugin_dir) - (size - MAX_SOCKET_PATH)} bytes"
        )
