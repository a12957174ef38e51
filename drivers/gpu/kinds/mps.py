"""MPS on a full GPU (``sharing.strategy: MPS``): the GPU kind's other shared part.

A GPU in exclusive-process mode admits one MPS server, so the claims on one GPU share
one control daemon, ``nvidia-cuda-mps-control -f``, started by the first prepare and
stopped by the last unprepare. Its pipe directory, where the daemon binds its sockets and
which is mounted into the containers through the CDI spec (all a client needs), is
``<plugin dir>/mps/<digest of the uuid>/``, short enough for a socket's path
(:mod:`drivers.gpu.kinds.mpspaths` has the arithmetic). Its other files live in
``<state dir>/<gpu uuid>/``: ``log/`` (the daemon's, which no container sees), ``pid`` (the daemon,
so that the next plugin adopts it after a restart: the pid and the binary in
``/proc/<pid>/cmdline`` must both match) and ``holders/<claim uid>``, written before
the daemon starts and removed before it stops, which counts the claims. A daemon runs
in its own session, so it outlives the plugin process: clients keep working across a
SIGKILL of a plugin run on the host. In a pod it would not outlive the pod (its PID
namespace ends with it), so there the daemon is a pod of its own (``--mps-daemon=pod``,
:mod:`drivers.gpu.kinds.mpspod`), named in a ``pod`` file instead of ``pid``. The recovery
is the unprepare, so a crash at any step ends with a daemon exactly where a holder is.

The previous release put the pipe at ``<state dir>/<gpu uuid>/pipe/``. A daemon it started
there serves on after an upgrade: its claims' containers have that directory mounted, so it
is adopted, and restarted there if it dies, until its GPU's last claim goes; meanwhile the
new pipe path is a symlink to it (made in the plugin's own directory, which no container
can write), so a new claim's spec names the new path and reaches the same daemon. Then the
link goes, and the GPU's next daemon starts in the new layout.

One GPU per MPS claim: a client reaches one pipe directory (``CUDA_MPS_PIPE_DIRECTORY``),
and a daemon per GPU keeps the count per GPU.

A container can write its pipe directory, and containers of claims an earlier release
prepared can write its log directory too (that release mounted both): what the plugin,
as root, opens there goes through :mod:`drivers.gpu.kinds.files`' descriptor-based calls,
never through a name that a container could have made a link or a directory, and one
GPU's tampered directory fails that GPU alone.
"""

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from driver.common.crashpoints import crashpoint
from driver.common.errors import PermanentError, RetryableError
from driver.common.fsutil import ensure_dir, write_atomic
from driver.common.logs import kv
from driver.common.quantity import Quantity
from driver.common.wire import Obj
from driver.devicekind import PreparedClaim
from drivers.gpu.kinds import mpspaths
from drivers.gpu.kinds.base import GpuKindContext
from drivers.gpu.kinds.files import PRIVATE, SHARED, exists, open_dir, open_regular, remove_entry
from drivers.gpu.kinds.mpspod import (
    GPU_ANNOTATION,
    DaemonSpec,
    ForeignPodError,
    MpsPods,
    failure,
    pipe_of,
    pod_name,
    terminating,
)
from drivers.gpu.model.inventory import is_gpu_uuid
from drivers.gpu.model.nvidiasmi import NvidiaSmi

log = logging.getLogger(__name__)

STRATEGY = "MPS"
_START_WAIT_S = 10.0
_STOP_WAIT_S = 10.0
# A pod: the kubelet's sandbox and container start too, inside the kubelet's 45 s.
_POD_START_WAIT_S = 30.0
_POD_GONE_WAIT_S = 30.0
_POLL_S = 0.02
_LOG_CHARS = 400


class MpsError(PermanentError):
    """An MPS setting this driver cannot apply (more than one GPU, a bad UUID)."""


class MpsDaemonError(RetryableError):
    """The control daemon did not start or stop; a retry may succeed."""


def default_control(container_driver_root: Path) -> Path:
    return container_driver_root / "usr" / "bin" / "nvidia-cuda-mps-control"


def wanted(claim: PreparedClaim, uuid_key: str) -> dict[str, dict[str, str]]:
    """GPU UUID -> MPS settings, for the devices of ``claim`` that use MPS."""
    out: dict[str, dict[str, str]] = {}
    for device in claim.devices:
        settings = dict(device.sharing)
        uuid = dict(device.identity).get(uuid_key)
        if device.admin_access or settings.get("strategy") != STRATEGY or uuid is None:
            continue  # unshared, or another kind's device (a MIG device)
        out[uuid] = settings
    return out


def _limit_for(settings: Mapping[str, str], uuid: str, index: str) -> str | None:
    return (
        settings.get(f"pinnedMemoryLimit/{uuid}")
        or settings.get(f"pinnedMemoryLimit/{index}")
        or settings.get("pinnedMemoryLimit")
    )


def _pinned_limit(claim: PreparedClaim, settings: Mapping[str, str], uuid: str) -> int | None:
    """The claim's configured pinned memory limit for its one GPU, in bytes (the quantity was
    checked when the config was read); under 1Mi it is refused, as NVIDIA's driver refuses it
    ("set too low"), since CUDA takes it in whole MiB."""
    configured = _limit_for(settings, uuid, "0")
    if configured is None:
        return None
    limit = int(Quantity.parse(configured).value)
    if limit < 1 << 20:
        raise MpsError(
            f"claim {claim}: the MPS pinned memory limit {configured} for GPU {uuid} is under "
            "1Mi: CUDA takes it in whole MiB"
        )
    return limit


def _share_mib(claim: PreparedClaim, uuid: str, uuid_key: str) -> int | None:
    """The memory the claim's shares of the GPU consumed (consumable capacity), in MiB."""
    shares = [
        Quantity.parse(dict(d.consumed)["memory"]).value
        for d in claim.devices
        if dict(d.identity).get(uuid_key) == uuid and "memory" in dict(d.consumed)
    ]
    return int(sum(shares) // (1 << 20)) if shares else None


def _one_gpu(claim: PreparedClaim, gpus: Mapping[str, object]) -> None:
    if len(gpus) > 1:
        raise MpsError(
            f'claim {claim}: field "sharing.strategy": MPS shares one GPU per claim, '
            f"this one has {len(gpus)}"
        )


class Mps:
    def __init__(self, uuid_key: str) -> None:
        self._uuid_key = uuid_key
        self._dir: Path | None = None
        self._pipes: Path | None = None  # <plugin dir>/mps: the pipe directories
        self._control: Path | None = None
        self._smi: NvidiaSmi | None = None
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # reaped when they exit
        self._failing: dict[str, str] = {}  # GPU UUID -> the watchdog's last restart error
        self._pods: MpsPods | None = None  # the daemons run as pods (drivers.gpu.kinds.mpspod)
        self._driver_roots = (Path("/"), Path("/"))  # the host's, and where the plugin sees it
        self._swept = False  # the node's daemon pods held to the holders once, at start

    def attach(self, context: GpuKindContext) -> None:
        self._dir = context.state_dir / "mps"
        ensure_dir(self._dir, PRIVATE)
        # The kind's state is <plugin dir>/kinds/<kind> (kubeletplugin.records).
        self._pipes = mpspaths.pipes_root(context.state_dir.parents[1])
        ensure_dir(self._pipes, PRIVATE)
        self._failing = {}
        node = context.node
        root = node.container_driver_root
        self._control = node.mps_control or default_control(root)
        self._smi = context.nvidia_smi_tool()
        self._pods = node.mps_pods
        self._swept = False
        self._driver_roots = (node.nvidia_driver_root, root)

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        return bool(wanted(claim, self._uuid_key))

    def edits(self, claim: PreparedClaim) -> Mapping[str, Any]:
        """The pipe directory and the limits, for a claim's containers. Not the log
        directory: a client writes no log (the daemon and its server do), and a directory
        a container can write is one more place where the plugin must distrust every
        name."""
        gpus = wanted(claim, self._uuid_key)
        if not gpus:
            return {}
        _one_gpu(claim, gpus)  # the spec is built at plan time: refused before any record
        ((uuid, settings),) = gpus.items()
        pipe = self._new_pipe(uuid)  # a link to the daemon's pipe while an adopted one serves
        env = [f"CUDA_MPS_PIPE_DIRECTORY={pipe}"]
        if "activeThreadPercentage" in settings:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={settings['activeThreadPercentage']}")
        # The client sees its one GPU as device 0.
        configured = _pinned_limit(claim, settings, uuid)
        limits = [configured] if configured is not None else []
        share = _share_mib(claim, uuid, self._uuid_key)
        if share is not None:
            limits.append(share << 20)  # a share of the GPU's memory is enforced as its limit
        if limits:
            # In whole MiB, as NVIDIA's driver writes it: CUDA reads "<n>M" or "<n>G" (binary
            # units), not a Kubernetes quantity such as 10Gi or 10G (decimal).
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={min(limits) >> 20}M")
        mounts = [{"hostPath": str(pipe), "containerPath": str(pipe), "options": ["rbind", "rw"]}]
        return {"env": env, "mounts": mounts}

    def prepare(self, claim: PreparedClaim) -> None:
        gpus = wanted(claim, self._uuid_key)
        _one_gpu(claim, gpus)
        for uuid, settings in gpus.items():
            _pinned_limit(claim, settings, uuid)  # refused before a daemon is started for it
        for uuid in gpus:
            with self._locked(uuid):
                holder = self._gpu_dir(uuid) / "holders" / claim.uid
                ensure_dir(holder.parent, PRIVATE)
                write_atomic(holder, f"{claim.namespace}/{claim.name}\n")
                self._ensure_running(uuid, claim, claim.uid)

    def unprepare(self, claim: PreparedClaim) -> None:
        for uuid in wanted(claim, self._uuid_key):
            with self._locked(uuid):
                holders = self._gpu_dir(uuid) / "holders"
                (holders / claim.uid).unlink(missing_ok=True)
                crashpoint("after-mps-holder-removed")
                if not (holders.exists() and any(holders.iterdir())):
                    self._stop(uuid, claim)

    @contextlib.contextmanager
    def _locked(self, uuid: str) -> Iterator[None]:
        """One claim at a time per GPU: claims sharing a GPU (shares of its memory) are
        prepared in parallel, and two first prepares must not start two daemons, nor a
        last unprepare stop the daemon a new holder just counted on. A file lock, so two
        plugin instances of a node (a surge upgrade) take turns too."""
        path = self._gpu_dir(uuid).with_name(f"{uuid}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)

    def watch(self) -> list[str]:
        """Restart the daemon of every GPU that has holders but no daemon (it died: a
        crash, an OOM kill), each reported in one line; returns those GPUs' UUIDs."""
        if self._dir is None:
            return []
        if self._pods is not None and not self._swept:
            try:
                self.sweep_pods()
                self._swept = True
            except Exception as exc:  # the API server away: the next round tries again
                log.warning("MPS control daemon pods not swept", extra=kv(error=exc))
        restarted: list[str] = []
        for gpu_dir in sorted(p for p in self._dir.iterdir() if p.is_dir()):
            uuid = gpu_dir.name
            if not is_gpu_uuid(uuid):
                continue
            try:
                if self._restart_if_gone(uuid):
                    restarted.append(uuid)
                self._failing.pop(uuid, None)
            except Exception as exc:
                # One GPU's trouble (a pipe directory a container tampered with, a GPU whose
                # nvidia-smi fails) is that GPU's: the next GPU's dead daemon still comes back.
                # A GPU lost for good fails every round: one line per distinct error.
                again = self._failing.get(uuid) == str(exc)
                self._failing[uuid] = str(exc)
                log.log(
                    logging.DEBUG if again else logging.ERROR,
                    "MPS control daemon restart failed",
                    extra=kv(gpu_uuid=uuid, error=exc),
                )
        return restarted

    def _restart_if_gone(self, uuid: str) -> bool:
        with self._locked(uuid):
            holders = sorted((self._gpu_dir(uuid) / "holders").glob("*"))
            if not holders:
                if self._pods is not None:
                    self._stop_orphan(uuid)
                return False
            if self._alive(uuid):
                return False
            namespace, _, name = holders[0].read_text().strip().partition("/")
            claim = PreparedClaim(holders[0].name, namespace, name, ())
            log.log(
                logging.DEBUG if uuid in self._failing else logging.ERROR,
                "MPS control daemon is gone; restarting it",
                extra=kv(gpu_uuid=uuid, claims=len(holders), claim_uid=claim.uid,
                         claim_namespace=namespace, claim_name=name),
            )  # fmt: skip
            self._ensure_running(uuid, claim, None)
            return True

    def running_pid(self, uuid: str) -> int | None:
        """The daemon of ``uuid``: the one its pid file names, or else one a plugin killed
        between starting it and writing that file, found in ``/proc`` and adopted."""
        running = self._running(uuid)
        return running[0] if running is not None else None

    def _running(self, uuid: str) -> tuple[int, Path] | None:
        """The daemon of ``uuid`` and the pipe it serves (this layout's or the last's)."""
        self._reap()
        with contextlib.suppress(OSError, ValueError):
            pid = int((self._gpu_dir(uuid) / "pid").read_text())
            if (pipe := self._daemon_pipe(pid, uuid)) is not None:
                return pid, pipe
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (pipe := self._daemon_pipe(int(entry.name), uuid)):
                write_atomic(self._gpu_dir(uuid) / "pid", f"{entry.name}\n")
                return int(entry.name), pipe
        return None

    def _daemon_pipe(self, pid: int, uuid: str) -> Path | None:
        """Alive, our binary in the foreground (``-f``), serving one of ``uuid``'s pipes:
        that pipe."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # argv[0], or argv[1] after the interpreter of a script (a test's stand-in).
            if str(self._control).encode() not in argv[:2] or b"-f" not in argv:
                return None
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            return None
        if state == "Z":
            return None
        for pipe in (self._new_pipe(uuid), self._legacy_pipe(uuid)):
            if f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ:
                return pipe
        return None

    # ---- the pipe directory (drivers.gpu.kinds.mpspaths) --------------------------------

    def _new_pipe(self, uuid: str) -> Path:
        if self._pipes is None or not is_gpu_uuid(uuid):
            self._gpu_dir(uuid)  # raises what fits
        assert self._pipes is not None
        return self._pipes / mpspaths.gpu_key(uuid)

    def _legacy_pipe(self, uuid: str) -> Path:
        return mpspaths.legacy_pipe_dir(self._gpu_dir(uuid))

    def _pipe_to_start(self, uuid: str, new_holder: str | None) -> Path:
        """Where the GPU's next daemon serves: the last release's pipe while its claims
        hold the GPU (their containers have it mounted), else this layout's. The last
        release's claims are the holders but ``new_holder`` when no daemon of this layout
        ever ran for the GPU (its pipe is made at the first start, and removed only to
        make the link)."""
        new, legacy = self._new_pipe(uuid), self._legacy_pipe(uuid)
        if new.is_symlink():
            return legacy
        if new.is_dir() or not legacy.is_dir():
            return new
        holders = self._gpu_dir(uuid) / "holders"
        others = [h for h in holders.glob("*") if h.name != new_holder] if holders.is_dir() else []
        return legacy if others else new

    def _serve_from(self, uuid: str, pipe: Path) -> None:
        """This layout's pipe path made to reach ``pipe``: itself (a directory; a link of
        an earlier adoption removed), or a link to the last release's pipe."""
        new = self._new_pipe(uuid)
        if pipe == new:
            if new.is_symlink():
                new.unlink()
            ensure_dir(new, SHARED, parent_mode=PRIVATE)
            return
        if new.is_symlink() and new.readlink() == pipe:
            return
        if new.is_symlink():
            new.unlink()
        elif new.is_dir():
            # No daemon serves it (the one daemon of the GPU serves the last release's
            # pipe): what its last daemon left, and a container may have written.
            shutil.rmtree(new)
        new.symlink_to(pipe)
        log.info("MPS control daemon of the last release adopted; its pipe linked",
                 extra=kv(gpu_uuid=uuid, pipe=pipe, link=new))  # fmt: skip

    def _unlink(self, uuid: str) -> None:
        """The last claim of an adopted daemon went: the GPU's next one is this layout's."""
        new = self._new_pipe(uuid)
        if new.is_symlink():
            new.unlink()

    # ---- the daemon -------------------------------------------------------------------

    def _alive(self, uuid: str) -> bool:
        if self._pods is None:
            return self.running_pid(uuid) is not None
        pod = self._pod(uuid, self._pods)
        return pod is not None and not terminating(pod) and failure(pod) is None

    def _ensure_running(self, uuid: str, claim: PreparedClaim, new_holder: str | None) -> None:
        """``new_holder``: the claim whose prepare counted it just now, None for a restart."""
        if self._pods is not None:
            self._ensure_pod(uuid, claim, self._pods, new_holder)
            return
        if (running := self._running(uuid)) is not None:
            self._serve_from(uuid, running[1])
            return  # another claim's, or adopted from the plugin before us
        pipe, logs = self._pipe_to_start(uuid, new_holder), self._gpu_dir(uuid) / "log"
        self._serve_from(uuid, pipe)
        for d in (pipe, logs):
            ensure_dir(d, SHARED, parent_mode=PRIVATE)
        with contextlib.ExitStack() as stack:
            try:
                pipe_fd, out = self._open_for_start(stack, pipe, logs)
            except OSError as exc:
                raise MpsDaemonError(
                    f"claim {claim}: the MPS directories of GPU {uuid} cannot be used: {exc}"
                ) from exc
            self._start(uuid, claim, pipe, pipe_fd, out)

    @staticmethod
    def _open_for_start(stack: contextlib.ExitStack, pipe: Path, logs: Path) -> tuple[int, int]:
        """The pipe directory cleared of the daemon's last control pipe, and the daemon's
        output file, both reached from descriptors (see the module's docstring)."""
        pipe_fd = open_dir(pipe)
        stack.callback(os.close, pipe_fd)
        # A daemon killed before it could clean up leaves its control pipe behind, which
        # would read as "started" at once: no daemon serves this GPU now (checked above).
        # Whatever else sits there (a directory a container made) would keep any daemon
        # from starting: it goes too.
        remove_entry(pipe_fd, "control")
        logs_fd = open_dir(logs)
        stack.callback(os.close, logs_fd)
        out = open_regular(logs_fd, "daemon.out", os.O_RDWR | os.O_APPEND)
        stack.callback(os.close, out)
        return pipe_fd, out

    def _start(self, uuid: str, claim: PreparedClaim, pipe: Path, pipe_fd: int, out: int) -> None:
        if self._control is None or self._smi is None:
            raise MpsError("MPS used before the claim state attached it")
        gpu_dir = self._gpu_dir(uuid)
        self._smi.run("-i", uuid, "-c", "EXCLUSIVE_PROCESS")
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(gpu_dir / "log"),
        }
        try:
            child = subprocess.Popen(
                [str(self._control), "-f"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the plugin, and its signals
            )
        except OSError as exc:
            raise MpsError(f"claim {claim}: cannot start {self._control}: {exc}") from exc
        self._children[child.pid] = child
        write_atomic(gpu_dir / "pid", f"{child.pid}\n")
        deadline = time.monotonic() + _START_WAIT_S
        while not exists(pipe_fd, "control"):
            if child.poll() is not None or time.monotonic() > deadline:
                # The unprepare of the rollback sets the compute mode back.
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                child.wait()
                (gpu_dir / "pid").unlink(missing_ok=True)
                raise MpsDaemonError(
                    f"claim {claim}: the MPS control daemon for GPU {uuid} did not start "
                    f"(exit {child.poll()}): {_tail(out)}"
                )
            time.sleep(_POLL_S)
        log.info(
            "MPS control daemon started",
            extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                     claim_name=claim.name, gpu_uuid=uuid, pid=child.pid),
        )  # fmt: skip

    def _stop(self, uuid: str, claim: PreparedClaim) -> None:
        if self._pods is not None:
            self._stop_pod(uuid, claim, self._pods)
            return
        gpu_dir = self._gpu_dir(uuid)
        running = self._running(uuid)
        if running is not None and self._control is not None:
            pid = running[0]
            self._quit(running[1])
            deadline = time.monotonic() + _STOP_WAIT_S
            while self.running_pid(uuid) is not None:
                if time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    deadline = time.monotonic() + _STOP_WAIT_S
                time.sleep(_POLL_S)
            # Gone as a daemon once a zombie: one of ours is reaped now, not at the next
            # start (the real-GPU check saw it still listed right after the unprepare).
            if (child := self._children.get(pid)) is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(_STOP_WAIT_S)
            self._reap()
            log.info(
                "MPS control daemon stopped",
                extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                         claim_name=claim.name, gpu_uuid=uuid, pid=pid),
            )  # fmt: skip
        (gpu_dir / "pid").unlink(missing_ok=True)
        self._unlink(uuid)
        if self._smi is not None and gpu_dir.exists():
            self._smi.run("-i", uuid, "-c", "DEFAULT")

    # ---- the daemon as a pod (drivers.gpu.kinds.mpspod) ----------------------------------

    def _ensure_pod(
        self, uuid: str, claim: PreparedClaim, pods: MpsPods, new_holder: str | None
    ) -> None:
        """The GPU's daemon pod serving: adopted when one serves or is starting (a plugin
        restarted, the other plugin pod of a surge, a create whose answer was lost),
        replaced when one will not serve, else created. The ``pod`` file names it from
        before the create until it is gone, so the watchdog finds a pod whose last claim
        went with a crash."""
        if self._control is None or self._smi is None:
            raise MpsError("MPS used before the claim state attached it")
        gpu_dir = self._gpu_dir(uuid)
        try:
            pod = self._pod(uuid, pods)
        except ForeignPodError as exc:
            raise ForeignPodError(f"claim {claim}: {exc}") from exc
        if pod is not None and (terminating(pod) or failure(pod) is not None):
            log.warning(
                "MPS control daemon pod does not serve; replacing it",
                extra=kv(gpu_uuid=uuid, pod=pod["metadata"]["name"],
                         why=failure(pod) or "deleted", **_claim_kv(claim)),
            )  # fmt: skip
            pods.delete(uuid, pod["metadata"]["uid"])
            pods.wait_gone(uuid, pod["metadata"]["uid"], _POD_GONE_WAIT_S)
            pod = None
        pipe = self._pod_pipe(uuid, pod) if pod is not None else None
        if pipe is None:
            pipe = self._pipe_to_start(uuid, new_holder)
        logs = gpu_dir / "log"
        self._serve_from(uuid, pipe)
        for d in (pipe, logs):
            ensure_dir(d, SHARED, parent_mode=PRIVATE)
        with contextlib.ExitStack() as stack:
            try:
                pipe_fd = open_dir(pipe)
                stack.callback(os.close, pipe_fd)
                if pod is None:
                    remove_entry(pipe_fd, "control")  # a dead daemon's, see _open_for_start
            except OSError as exc:
                raise MpsDaemonError(
                    f"claim {claim}: the MPS directories of GPU {uuid} cannot be used: {exc}"
                ) from exc
            created = pod is None
            if pod is None:
                self._smi.run("-i", uuid, "-c", "EXCLUSIVE_PROCESS")
                write_atomic(gpu_dir / "pod", f"{uuid}\n")
                try:
                    pod = pods.create(self._daemon_spec(uuid, pods, pipe), self._pipes_of(uuid))
                except ForeignPodError as exc:
                    raise ForeignPodError(f"claim {claim}: {exc}") from exc
                crashpoint("after-mps-pod-created")
            self._await_pod(uuid, claim, pods, pipe_fd, pod)
        if created:
            log.info(
                "MPS control daemon started",
                extra=kv(gpu_uuid=uuid, pod=pod["metadata"]["name"], **_claim_kv(claim)),
            )

    def _await_pod(
        self, uuid: str, claim: PreparedClaim, pods: MpsPods, pipe_fd: int, pod: Obj
    ) -> None:
        """Until the daemon made its control pipe; a pod that will not serve, or none in
        time, is deleted (the rollback's unprepare sets the compute mode back)."""
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        deadline = time.monotonic() + _POD_START_WAIT_S
        next_look = 0.0
        why = ""
        while not exists(pipe_fd, "control"):
            now = time.monotonic()
            if now > deadline:
                why = f"not serving after {_POD_START_WAIT_S:.0f} s"
            elif now >= next_look:
                next_look = now + 0.5
                seen = pods.get(uuid)
                gone = seen is None or seen["metadata"].get("uid") != uid
                why = "its pod was deleted" if gone else (failure(seen or {}) or "")
            if why:
                pods.delete(uuid, uid)
                raise MpsDaemonError(
                    f"claim {claim}: the MPS control daemon for GPU {uuid} did not start "
                    f"(pod {name}): {why}"
                )
            time.sleep(_POLL_S)

    def _pod(self, uuid: str, pods: MpsPods) -> Obj | None:
        """The GPU's daemon pod, None when there is none; :class:`ForeignPodError` for a pod
        under its name that is not this daemon (:meth:`MpsPods.ours`)."""
        pod = pods.get(uuid)
        if pod is None:
            return None
        return pods.ours(pod, self._daemon_spec(uuid, pods), self._pipes_of(uuid))

    def _daemon_spec(self, uuid: str, pods: MpsPods, pipe: Path | None = None) -> DaemonSpec:
        if self._control is None:
            raise MpsError("MPS used before the claim state attached it")
        pipe = pipe or self._new_pipe(uuid)
        logs = self._gpu_dir(uuid) / "log"
        return DaemonSpec(pods.node_name, uuid, self._control, pipe, logs, *self._driver_roots)

    def _pipes_of(self, uuid: str) -> tuple[str, str]:
        """The pipes a daemon of the GPU may serve: this layout's and the last release's."""
        return str(self._new_pipe(uuid)), str(self._legacy_pipe(uuid))

    def _pod_pipe(self, uuid: str, pod: Obj) -> Path | None:
        """The pipe a daemon pod serves, one of :meth:`_pipes_of` (what :meth:`MpsPods.ours`
        lets a pod serve), else None."""
        pipe = pipe_of(pod)
        return Path(pipe) if pipe in self._pipes_of(uuid) else None

    def _stop_pod(self, uuid: str, claim: PreparedClaim | None, pods: MpsPods) -> None:
        """``quit`` through the pipe, as to a daemon of the plugin's own, then the pod
        deleted and gone; then the compute mode back to DEFAULT."""
        gpu_dir = self._gpu_dir(uuid)
        try:
            pod = self._pod(uuid, pods)
        except ForeignPodError as exc:
            # Not this daemon: ours is gone already, and the other is not ours to stop.
            log.warning("MPS control daemon pod replaced by another; left alone",
                        extra=kv(gpu_uuid=uuid, error=exc))  # fmt: skip
            pod = None
        if pod is not None:
            pipe, uid = self._pod_pipe(uuid, pod), pod["metadata"]["uid"]
            if not terminating(pod) and failure(pod) is None and pipe is not None:
                self._quit(pipe)
                deadline = time.monotonic() + _STOP_WAIT_S
                while (seen := pods.get(uuid)) is not None and failure(seen) is None:
                    if time.monotonic() > deadline or seen["metadata"].get("uid") != uid:
                        break  # the deletion's SIGTERM, then the kubelet's SIGKILL
                    time.sleep(_POLL_S * 10)
            pods.delete(uuid, uid)
            pods.wait_gone(uuid, uid, _POD_GONE_WAIT_S)
            log.info(
                "MPS control daemon stopped",
                extra=kv(gpu_uuid=uuid, pod=pod_name_of(pods, uuid),
                         **(_claim_kv(claim) if claim is not None else {})),
            )  # fmt: skip
        (gpu_dir / "pod").unlink(missing_ok=True)
        self._unlink(uuid)
        if self._smi is not None and gpu_dir.exists():
            self._smi.run("-i", uuid, "-c", "DEFAULT")

    def _stop_orphan(self, uuid: str) -> None:
        """A pod named by a GPU without holders: its last claim's unprepare, or the claim's
        recovery, was killed between the holder's removal and the pod's deletion."""
        if not (self._gpu_dir(uuid) / "pod").exists() or self._pods is None:
            return
        log.warning("MPS control daemon pod without a claim; deleting it",
                    extra=kv(gpu_uuid=uuid, pod=pod_name_of(self._pods, uuid)))  # fmt: skip
        self._stop_pod(uuid, None, self._pods)

    def sweep_pods(self) -> list[str]:
        """Delete this node's daemon pods whose GPU has no holder (a state directory lost
        with its pod files, a pod made for a GPU this node no longer has); their UUIDs."""
        if self._pods is None or self._dir is None:
            return []
        swept = []
        for pod in self._pods.on_node():
            uuid = str((pod["metadata"].get("annotations") or {}).get(GPU_ANNOTATION, ""))
            if not is_gpu_uuid(uuid) or pod["metadata"]["name"] != pod_name_of(self._pods, uuid):
                continue  # another driver's, or another node's name: not ours to judge
            with self._locked(uuid):
                holders = self._gpu_dir(uuid) / "holders"
                if holders.is_dir() and any(holders.iterdir()):
                    continue
                log.warning("MPS control daemon pod without a claim; deleting it",
                            extra=kv(gpu_uuid=uuid, pod=pod["metadata"]["name"]))  # fmt: skip
                self._stop_pod(uuid, None, self._pods)
                swept.append(uuid)
        return swept

    def _quit(self, pipe: Path) -> None:
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [str(self._control)], input=b"quit\n", env=env, timeout=_STOP_WAIT_S,
                capture_output=True, check=False,
            )  # fmt: skip

    def _reap(self) -> None:
        # Called from worker threads side by side (two claims' unprepares, the watchdog):
        # another one may have reaped the same child a moment ago.
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)

    def _gpu_dir(self, uuid: str) -> Path:
        if self._dir is None:
            raise MpsError("MPS used before the claim state attached it")
        if not is_gpu_uuid(uuid):
            raise MpsError(f"GPU UUID {uuid!r} is not one NVML writes")
        return self._dir / uuid


def _tail(fd: int) -> str:
    """The end of the daemon's output, read from the descriptor it was given: the file
    the daemon wrote, whatever its name has become since."""
    size = os.fstat(fd).st_size
    start = max(0, size - 4 * _LOG_CHARS)
    return os.pread(fd, size - start, start).decode(errors="replace")[-_LOG_CHARS:].strip()


def pod_name_of(pods: MpsPods, uuid: str) -> str:
    return pod_name(pods.node_name, uuid)


def _claim_kv(claim: PreparedClaim) -> dict[str, Any]:
    return dict(kv(claim_uid=claim.uid, claim_namespace=claim.namespace, claim_name=claim.name))
