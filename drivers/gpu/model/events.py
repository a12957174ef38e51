"""The NVML event loop: a thread that turns XID and ECC events into health events.

It runs NVIDIA's sequence: ``nvmlInit``, one event set, per GPU
``nvmlDeviceGetHandleByUUID`` / ``nvmlDeviceGetSupportedEventTypes`` /
``nvmlDeviceRegisterEvents(mask & supported)``, then ``nvmlEventSetWait_v2`` with
a timeout until stopped, and ``nvmlEventSetFree`` / ``nvmlShutdown``. The wait
blocks in C, so it lives on its own thread; events leave it through ``emit``,
which must be thread-safe and must not block (the caller hands them to its loop).

GPUs found after start (a rediscovery) are handed over with :meth:`EventWatcher.watch`;
the thread registers them on its event set between two waits, so events of the GPUs
already watched are never missed meanwhile. NVML cannot unregister a device, and a set
holding a GPU that fell off the bus answers every wait with GPU_IS_LOST: when GPUs leave
the inventory the thread moves the rest to a fresh event set, so they are watched again.
"""

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, SupportsInt

import pynvml

from driver.common.logs import kv
from drivers.gpu.model.devicehealth import DOUBLE_BIT_ECC_XID, Event, GpuLost, Unmonitored, Xid

log = logging.getLogger(__name__)

XID_CRITICAL = pynvml.nvmlEventTypeXidCriticalError
DOUBLE_BIT_ECC = pynvml.nvmlEventTypeDoubleBitEccError
MASK = XID_CRITICAL | DOUBLE_BIT_ECC
WAIT_MS = 5000
NO_INSTANCE = 0xFFFFFFFF


class EventNvml(Protocol):
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any, /) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int, /) -> Any: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, /) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any, /) -> None: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...


def _instance(value: SupportsInt) -> int | None:
    """A GPU or compute instance ID of an event; None for NVML's "none" (0xFFFFFFFF),
    which an event concerning the whole GPU carries."""
    number = int(value)
    return None if number == NO_INSTANCE else number


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class EventWatcher:
    """Watches ``uuids`` until :meth:`stop`; call :meth:`run` on a thread of its own."""

    def __init__(
        self,
        nvml: EventNvml,
        uuids: Sequence[str],
        emit: Callable[[list[Event]], None],
        *,
        wait_ms: int = WAIT_MS,
    ) -> None:
        self._nvml = nvml
        self._uuids = tuple(uuids)
        self._emit = emit
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wanted: tuple[str, ...] | None = None  # a new inventory, not yet registered
        self._failed: str | None = None  # why there is no event set, once run() gave up
        self.monitored: tuple[str, ...] = ()
        self.ready = threading.Event()  # set once registration is done
        self._set: Any = None  # the event set, owned by the thread of run()

    def watch(self, uuids: Sequence[str]) -> None:
        """From any thread: watch ``uuids`` from now on (registered within one wait)."""
        with self._lock:
            if self._failed is None:
                self._wanted = tuple(uuids)
                return
            new = [u for u in uuids if u not in self._uuids]
            self._uuids = tuple(uuids)
        # No event set (NVML events unavailable): new GPUs are unmonitored like the rest.
        if new:
            self._emit([Unmonitored(u, self._failed) for u in new])

    def stop(self) -> None:
        """Ends :meth:`run` within one wait timeout."""
        self._stop.set()

    def run(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._unmonitored_all(f"nvmlInit: {exc}")
            return
        try:
            event_set = nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._unmonitored_all(f"nvmlEventSetCreate: {exc}")
            nvml.nvmlShutdown()
            return
        self._set = event_set
        try:
            handles: dict[str, Any] = {}
            self._register(event_set, self._uuids, handles)
            self.ready.set()
            self._loop(handles)
        finally:
            nvml.nvmlEventSetFree(self._set)
            nvml.nvmlShutdown()

    def _unmonitored_all(self, reason: str) -> None:
        log.warning("NVML events unavailable: every GPU unmonitored", extra=kv(error=reason))
        with self._lock:
            self._failed = reason
            uuids = self._uuids
        self._emit([Unmonitored(u, reason) for u in uuids])
        self.ready.set()

    def _register(self, event_set: Any, uuids: Sequence[str], handles: dict[str, Any]) -> None:
        """Registers the GPUs of ``uuids`` not in ``handles`` (which it updates)."""
        unmonitored: list[Event] = []
        for uuid in uuids:
            if uuid in handles:
                continue
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
                mask = MASK & self._nvml.nvmlDeviceGetSupportedEventTypes(handle)
                if not mask & XID_CRITICAL:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                self._nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            except pynvml.NVMLError as exc:
                log.warning("GPU unmonitored", extra=kv(gpu_uuid=uuid, error=str(exc)))
                unmonitored.append(Unmonitored(uuid, str(exc)))
                continue
            handles[uuid] = handle
        self.monitored = tuple(handles)
        if unmonitored:
            self._emit(unmonitored)
        log.info("watching NVML events", extra=kv(gpus=len(handles), unmonitored=len(unmonitored)))

    def _follow(self, handles: dict[str, Any]) -> bool:
        """Takes up the inventory :meth:`watch` handed over, if any; True when the
        GPUs moved to a fresh event set."""
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None or set(wanted) == set(handles):
            return False
        self._uuids = wanted
        fresh = False
        if set(handles) - set(wanted):
            try:
                event_set = self._nvml.nvmlEventSetCreate()
            except pynvml.NVMLError as exc:
                log.warning("cannot renew the NVML event set", extra=kv(error=str(exc)))
            else:
                self._nvml.nvmlEventSetFree(self._set)
                self._set, fresh = event_set, True
                handles.clear()
        self._register(self._set, wanted, handles)
        return fresh

    def _loop(self, handles: dict[str, Any]) -> None:
        lost_reported: set[str] = set()
        while not self._stop.is_set():
            if self._follow(handles):
                lost_reported.clear()
            try:
                data = self._nvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError_GpuIsLost:
                lost = self._lost(handles) - lost_reported
                if lost:
                    lost_reported |= lost
                    self._emit([GpuLost(u) for u in sorted(lost)])
                self._stop.wait(self._wait_ms / 1000)  # the wait answers at once from now on
                continue
            except pynvml.NVMLError as exc:
                log.warning("NVML event wait failed; retrying", extra=kv(error=str(exc)))
                self._stop.wait(self._wait_ms / 1000)
                continue
            try:
                uuid = _text(self._nvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError:
                self._emit([GpuLost(u) for u in handles])
                continue
            gi, ci = _instance(data.gpuInstanceId), _instance(data.computeInstanceId)
            if data.eventType & XID_CRITICAL:
                self._emit([Xid(uuid, int(data.eventData), gi, ci)])
            elif data.eventType & DOUBLE_BIT_ECC:
                self._emit([Xid(uuid, DOUBLE_BIT_ECC_XID, gi, ci)])

    def _lost(self, handles: dict[str, Any]) -> set[str]:
        # The wait does not say which GPU: ask each handle; none answering lost means all.
        lost = set()
        for uuid, handle in handles.items():
            try:
                self._nvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError_GpuIsLost:
                lost.add(uuid)
            except pynvml.NVMLError:
                continue
        return lost or set(handles)


def probe(nvml: EventNvml, uuid: str) -> bool:
    """A recovery probe: True when NVML finds the GPU ``uuid`` and answers for it."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(uuid))) == uuid
    except pynvml.NVMLError:
        return False
    finally:
        nvml.nvmlShutdown()
