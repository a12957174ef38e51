"""Time-slicing of a full GPU (``sharing.strategy: TimeSlicing``): the GPU kind's shared part.

Pods that share one claim share its GPU; the claim's ``timeSlicingConfig.interval``
sets how long each context runs before the GPU switches (``nvidia-smi compute-policy
--set-timeslice``). The setting is the GPU's, not the claim's, so who relies on it is
counted: one holder file per claim and GPU, ``<state dir>/<gpu uuid>/<claim uid>``,
holding the boot ID and the interval. Prepare writes it before changing the setting;
unprepare removes it, then sets the GPU to what the remaining holders asked for, or
back to Default when none remain. Both are idempotent and a crash between any two
steps leaves a state that the next unprepare or the recovery (which is the unprepare)
makes consistent: the setting changes only after the holder file that explains it
exists, and is restored after the last holder file is gone. An adminAccess device is
never time-sliced: it is a look at a GPU, not a share of it.

Shares of one GPU (consumable capacity) are prepared side by side, by one plugin's worker
threads or by the two plugin instances of a surge upgrade: the look at the other holders,
the holder write and the setting are one step per GPU, under a file lock
(``<state dir>/<gpu uuid>.lock``), so of two shares asking for different intervals exactly
one gets the GPU and the other is refused, naming both.
"""

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from driver.common.errors import PermanentError
from driver.common.fsutil import ensure_dir, write_atomic
from driver.common.logs import kv
from driver.devicekind import PreparedClaim
from drivers.gpu.kinds.base import GpuKindContext
from drivers.gpu.kinds.files import PRIVATE
from drivers.gpu.model.inventory import is_gpu_uuid
from drivers.gpu.model.nvidiasmi import NvidiaSmi

log = logging.getLogger(__name__)

STRATEGY = "TimeSlicing"
DEFAULT_INTERVAL = "Default"


class TimeSliceConflictError(PermanentError):
    """Another prepared claim holds the GPU at a different interval."""


class TimeSlicingNotReadyError(PermanentError):
    """The claim state never attached the kind (a programming error, not the claim's)."""


def wanted(claim: PreparedClaim, uuid_key: str) -> dict[str, str]:
    """GPU UUID -> interval, for the devices of ``claim`` that are time-sliced."""
    out: dict[str, str] = {}
    for device in claim.devices:
        settings = dict(device.sharing)
        if device.admin_access or settings.get("strategy") != STRATEGY:
            continue
        uuid = dict(device.identity).get(uuid_key)
        if uuid is None:
            continue  # another kind's device (a MIG device): not a whole GPU to time-slice
        out[uuid] = settings.get("interval", DEFAULT_INTERVAL)
    return out


class TimeSlicing:
    def __init__(self, uuid_key: str) -> None:
        self._uuid_key = uuid_key
        self._dir: Path | None = None
        self._boot = ""
        self._smi: NvidiaSmi | None = None

    def attach(self, context: GpuKindContext) -> None:
        self._dir = context.state_dir / "timeslice"
        ensure_dir(self._dir, PRIVATE)
        self._boot = context.boot_id
        self._smi = context.nvidia_smi_tool()

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        return bool(wanted(claim, self._uuid_key))

    def prepare(self, claim: PreparedClaim) -> None:
        smi = self._ready()
        for uuid, interval in sorted(wanted(claim, self._uuid_key).items()):
            with self._locked(uuid):
                self._prepare_gpu(smi, claim, uuid, interval)

    def _prepare_gpu(self, smi: NvidiaSmi, claim: PreparedClaim, uuid: str, interval: str) -> None:
        others = {u: i for u, i in self.holders(uuid).items() if u != claim.uid}
        for other, held in sorted(others.items()):
            if held != interval:
                raise TimeSliceConflictError(
                    f"claim {claim}: GPU {uuid} is time-sliced at interval {held} for "
                    f"claim uid {other}; this claim asks for {interval}: a GPU runs at one "
                    "interval, so the claims sharing it must ask for the same one"
                )
        self._write_holder(uuid, claim.uid, interval)
        smi.set_timeslice(uuid, interval)
        log.info(
            "time slice set",
            extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                     claim_name=claim.name, gpu_uuid=uuid, interval=interval),
        )  # fmt: skip

    def unprepare(self, claim: PreparedClaim) -> None:
        smi = self._ready()
        for uuid in sorted(wanted(claim, self._uuid_key)):
            with self._locked(uuid):
                self._unprepare_gpu(smi, claim, uuid)

    def _unprepare_gpu(self, smi: NvidiaSmi, claim: PreparedClaim, uuid: str) -> None:
        held = self._holder_path(uuid, claim.uid)
        had_one = held.exists()
        held.unlink(missing_ok=True)
        rest = self.holders(uuid)
        if rest and not had_one:
            return  # this claim never changed the GPU; the others' setting stays
        interval = min(rest.values()) if rest else DEFAULT_INTERVAL
        smi.set_timeslice(uuid, interval)
        log.info(
            "time slice restored",
            extra=kv(claim_uid=claim.uid, claim_namespace=claim.namespace,
                     claim_name=claim.name, gpu_uuid=uuid, interval=interval,
                     holders=len(rest)),
        )  # fmt: skip
        if not rest:
            with contextlib.suppress(OSError):
                held.parent.rmdir()

    @contextlib.contextmanager
    def _locked(self, uuid: str) -> Iterator[None]:
        """The GPU's turn (see the module's docstring). A file lock, not an asyncio one:
        that would order one process's claims only. The kinds run in worker threads, so
        the wait blocks no event loop; each call opens its own descriptor, so threads of
        one process exclude each other as processes do. The file is kept: removing a lock
        file lets a third preparer lock a new one while the second holds the old."""
        path = self._gpu_dir(uuid).with_name(f"{uuid}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # and with it the lock

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)

    def holders(self, uuid: str) -> dict[str, str]:
        """claim uid -> interval, of this boot's holders of ``uuid``'s setting."""
        out: dict[str, str] = {}
        try:
            entries = list(os.scandir(self._gpu_dir(uuid)))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.startswith("."):
                continue  # a temp file a killed write left: it never changed the GPU
            try:
                boot, interval = Path(entry.path).read_text().split()
            except (OSError, ValueError):
                continue
            if self._boot and boot != self._boot:
                # The setting did not outlive that boot, nor does its holder.
                Path(entry.path).unlink(missing_ok=True)
                continue
            out[entry.name] = interval
        return out

    def _ready(self) -> NvidiaSmi:
        if self._smi is None:
            raise TimeSlicingNotReadyError("time-slicing used before the claim state attached it")
        return self._smi

    def _gpu_dir(self, uuid: str) -> Path:
        if self._dir is None:
            raise TimeSlicingNotReadyError("time-slicing used before the claim state attached it")
        if not is_gpu_uuid(uuid):
            raise TimeSliceConflictError(f"GPU UUID {uuid!r} is not one NVML writes")
        return self._dir / uuid

    def _holder_path(self, uuid: str, claim_uid: str) -> Path:
        return self._gpu_dir(uuid) / claim_uid

    def _write_holder(self, uuid: str, claim_uid: str, interval: str) -> None:
        path = self._holder_path(uuid, claim_uid)
        ensure_dir(path.parent, PRIVATE)
        write_atomic(path, f"{self._boot or '-'} {interval}\n")
