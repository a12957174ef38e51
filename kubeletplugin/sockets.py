"""Unix socket paths and the lifecycle of a gRPC server bound to one.

Socket names follow upstream's kubeletplugin helper (Kubernetes 1.38), so a kubelet (and a
surge-upgraded sibling pod) finds them where it expects them. With a pod UID (the chart's
rolling updates) each name carries it, and where the whole path would not bind, a shorter
name is taken, in upstream's order (the digest is SHA-256, its first bytes in URL-safe
Base64 without padding):

- registration: ``<driver>-<podUID>-reg.sock``, ``<driver>-<b64(sha256(uid))[:8 bytes]>-reg.sock``,
  ``dra-<b64(sha256(driver NUL uid))[:16 bytes]>-reg.sock``;
- DRA service: ``dra-<podUID>.sock``, ``dra-<b64(sha256(uid))[:8 bytes]>`` (no suffix).

The kubelet learns the DRA socket from the registration and finds the registration socket
by watching its directory, so any of the names works. A name is taken when its path fits
:data:`MAX_SOCKET_PATH` (gRPC's, one byte under upstream's test for Go). At
``/var/lib/kubelet`` compute-domain.nvidia.com's registration socket with a pod UID is
exactly 105 bytes: one byte more of kubelet root and it is the hashed one.
"""

import base64
import hashlib
import logging
import os
import stat
from collections.abc import Sequence
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
    # This pod's names of the other forms: a stale one (an instance that chose otherwise
    # before an upgrade) is removed at start, never a sibling pod's.
    stale: tuple[Path, ...] = ()

    def others(self, path: Path) -> tuple[Path, ...]:
        return tuple(p for p in self.stale if p.parent == path.parent and p != path)


def digest(*parts: str, size: int) -> str:
    """Upstream's short name part: SHA-256 of the parts joined by NUL, its first ``size``
    bytes in URL-safe Base64 without padding (11 characters for 8, 22 for 16)."""
    raw = hashlib.sha256("\0".join(parts).encode()).digest()[:size]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def registration_names(driver_name: str, pod_uid: str | None) -> Sequence[str]:
    if not pod_uid:
        return (f"{driver_name}-reg.sock",)
    return (
        f"{driver_name}-{pod_uid}-reg.sock",
        f"{driver_name}-{digest(pod_uid, size=8)}-reg.sock",
        f"dra-{digest(driver_name, pod_uid, size=16)}-reg.sock",
    )


def dra_names(pod_uid: str | None) -> Sequence[str]:
    if not pod_uid:
        return ("dra.sock",)
    return (f"dra-{pod_uid}.sock", f"dra-{digest(pod_uid, size=8)}")


def _first_fitting(directory: Path, names: Sequence[str]) -> Path:
    paths = [directory / name for name in names]
    fitting = [p for p in paths if _bytes(p) <= MAX_SOCKET_PATH]
    return fitting[0] if fitting else paths[-1]  # the shortest, refused by check_length


def socket_paths(
    *, registrar_dir: Path, plugins_dir: Path, driver_name: str, pod_uid: str | None
) -> SocketPaths:
    """Where the kubelet looks: the first of each socket's names whose path fits."""
    registrar, plugin = registrar_dir.absolute(), plugins_dir.absolute() / driver_name
    registration_all = [registrar / n for n in registration_names(driver_name, pod_uid)]
    dra_all = [plugin / n for n in dra_names(pod_uid)]
    paths = SocketPaths(
        registration=_first_fitting(registrar, registration_names(driver_name, pod_uid)),
        dra=_first_fitting(plugin, dra_names(pod_uid)),
        stale=tuple(registration_all + dra_all),
    )
    for path in (paths.registration, paths.dra):
        check_length(path)
    return paths


def _bytes(path: Path) -> int:
    return len(os.fsencode(path))


def check_length(path: Path) -> None:
    size = _bytes(path)
    if size > MAX_SOCKET_PATH:
        raise PermanentError(
            f"unix socket path {path} is {size} bytes, over the {MAX_SOCKET_PATH}-byte limit "
            "of a socket address: use a shorter directory or driver name"
        )


def _remove_stale(path: Path, *, ours: bool = True) -> None:
    """A socket of this pod's left behind; ``ours``: the name about to be bound, where
    anything else is refused (another form's name that is no socket is left alone)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        if not ours:
            return
        raise PermanentError(f"{path} exists and is not a socket: refusing to replace it")
    # Our own name: a previous instance of this very plugin (pod) left it behind.
    path.unlink(missing_ok=True)
    log.info("removed stale socket", extra=kv(path=path))


class SocketServer:
    """A ``grpc.aio`` server on one unix socket, whose file goes away with it."""

    def __init__(self, path: Path, server: grpc.aio.Server, *, stale: Sequence[Path] = ()) -> None:
        check_length(path)
        self.path = path
        self._server = server
        self._stale = tuple(stale)  # this pod's names of the other forms

    async def start(self) -> None:
        ensure_dir(self.path.parent, dirs.PRIVATE)
        for other in self._stale:
            _remove_stale(other, ours=False)
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
