"""Unix socket paths and the lifecycle of a gRPC server bound to one.

Socket names follow upstream's kubeletplugin helper, so a kubelet (and a
surge-upgraded sibling pod) finds them where it expects them.
"""

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import grpc

from driver.common.errors import PermanentError
from driver.common.fsutil import ensure_dir
from driver.common.logs import kv
from kubeletplugin import dirs

log = logging.getLogger(__name__)

# sun_path is 108 bytes on Linux, one of which is the terminating NUL; gRPC (1.85) refuses
# a path of 106 bytes or more ("should not have more than 107 characters"), so 105 is what
# binds. The kubelet's own registration socket of compute-domain.nvidia.com, with a pod UID
# under /var/lib/kubelet/plugins_registry, is exactly 105.
MAX_SOCKET_PATH = 105
_SOCKET_MODE = 0o660


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    dra: Path


def socket_paths(
    *, registrar_dir: Path, plugins_dir: Path, driver_name: str, pod_uid: str | None
) -> SocketPaths:
    """Where the kubelet looks: ``<driver>[-<podUID>]-reg.sock`` and ``dra[-<podUID>].sock``."""
    suffix = f"-{pod_uid}" if pod_uid else ""
    paths = SocketPaths(
        registration=registrar_dir.absolute() / f"{driver_name}{suffix}-reg.sock",
        dra=plugins_dir.absolute() / driver_name / f"dra{suffix}.sock",
    )
    for path in (paths.registration, paths.dra):
        check_length(path)
    return paths


def check_length(path: Path) -> None:
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise PermanentError(
            f"unix socket path {path} is {size} bytes, over the {MAX_SOCKET_PATH}-byte limit "
            "of a socket address: use a shorter directory or driver name"
        )


def _remove_stale(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise PermanentError(f"{path} exists and is not a socket: refusing to replace it")
    # Our own name: a previous instance of this very plugin (pod) left it behind.
    path.unlink(missing_ok=True)
    log.info("removed stale socket", extra=kv(path=path))


class SocketServer:
    """A ``grpc.aio`` server on one unix socket, whose file goes away with it."""

    def __init__(self, path: Path, server: grpc.aio.Server) -> None:
        check_length(path)
        self.path = path
        self._server = server

    async def start(self) -> None:
        ensure_dir(self.path.parent, dirs.PRIVATE)
        _remove_stale(self.path)
        try:
            self._server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as exc:  # grpc's way of saying the bind failed
            raise PermanentError(f"cannot listen on {self.path}: {exc}") from exc
        # Bound, not yet serving: narrow the mode before any client can call.
        self.path.chmod(_SOCKET_MODE)
        await self._server.start()
        log.info("serving", extra=kv(socket=self.path))

    async def stop(self, grace: float | None = 1.0) -> None:
        await self._server.stop(grace)
        # gRPC unlinks its unix sockets on shutdown; make sure of it, as the name is ours.
        self.path.unlink(missing_ok=True)
