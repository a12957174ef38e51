"""Device health on the event loop: NVML events in, taints and the health stream out.

The NVML thread hands events to :meth:`HealthMonitor.submit` (thread-safe, never
blocks). The monitor coalesces them: the first event of a quiet period opens a
``window``; at its end every event of the window is applied at once, with one
summary log line, and only a real change costs a state write, a health-stream
message and one publish. A storm of any size is thus one change and one log line
per window. Events of a GPU in MIG mode land on its MIG devices
(:func:`drivers.gpu.model.devicehealth.placed`); taints are kept by published device UUID.

The taints are persisted in ``health.json`` in the plugin's directory, so a
restarted plugin publishes a broken GPU tainted from its first slice; a file it cannot
understand (torn, truncated, wrong types) keeps the node not ready with one line
(:class:`HealthStateError`), never read as "no taints". An admin
clears them by creating ``health-clear`` in that directory (on the host, or with
``kubectl exec``): empty for every GPU, else one GPU UUID per line. The plugin
reads and removes it; no write permission beyond its own directory is needed.

With a :class:`Recovery` (off by default), a device unschedulable only for XIDs that
NVIDIA resolves by restarting the application is cleared after ``probes`` consecutive
healthy probes ``period`` seconds apart (NVML answers for its GPU, and no event for it
meanwhile): any event or failed probe starts the count again. A lost GPU, XID 79 or 48
are never cleared this way.
"""

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.common.errors import PermanentError, RetryableError
from driver.common.fsutil import write_atomic
from driver.common.logs import kv
from driver.common.supervise import OnFailure, supervised
from driver.devicekind import NodeDevice
from drivers.gpu.kinds import KindTable
from drivers.gpu.model import devicehealth
from drivers.gpu.model.devicehealth import Event, MigPlacement, Taint, Xid
from drivers.gpu.model.inventory import Inventory
from kubeletplugin.healthstream import DeviceHealth, HealthBoard

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Watched:
    """What the health watcher follows of the published devices."""

    devices: Mapping[str, str]  # taint key (a GPU or MIG device UUID) -> device name
    migs: Mapping[str, tuple[MigPlacement, ...]]  # GPU in MIG mode -> its parts
    gpus: tuple[str, ...]  # the physical GPUs whose NVML events are registered

    @classmethod
    def of(
        cls, current: Mapping[str, NodeDevice], inventory: Inventory | None, kinds: KindTable
    ) -> "Watched":
        """Each device where its kind (of ``kinds``, the node's table) says its events come
        from; the monitor names no kind, so a new kind is watched by implementing
        ``health_target``."""
        devices: dict[str, str] = {}
        migs: dict[str, list[MigPlacement]] = {}
        whole: set[str] = set()
        for device in current.values():
            kind = kinds.get(device.kind)
            target = None
            if kind is not None and inventory is not None:
                target = kind.health_target(device, inventory)
            if target is None:
                continue
            devices[target.key] = device.name
            if target.part:
                placement = MigPlacement(target.key, target.gi, target.ci)
                migs.setdefault(target.gpu_uuid, []).append(placement)
            else:
                whole.add(target.gpu_uuid)
        return cls(
            devices=devices,
            migs={p: tuple(ms) for p, ms in sorted(migs.items())},
            gpus=tuple(sorted(whole | migs.keys())),
        )


STATE_FILE = "health.json"
CLEAR_FILE = "health-clear"
WINDOW = 1.0


class HealthStateError(PermanentError):
    """``health.json`` cannot be understood: the node is not served until an admin looks."""


def read_state(plugin_dir: Path) -> dict[str, tuple[Taint, ...]]:
    """The persisted taints; none without a file. Raises HealthStateError for a file
    that cannot be read or understood: reading it as "no taints" would publish a GPU that
    fell off the bus as schedulable, so the node stays not ready instead, as it does for
    a claim record it cannot read."""
    path = plugin_dir / STATE_FILE
    try:
        return devicehealth.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise HealthStateError(
            f"{path} holds the GPU taints but cannot be read ({exc}): not serving, so as not "
            "to publish a failed GPU as healthy; check the GPUs (nvidia-smi), then remove the "
            "file (every GPU is then published untainted until NVML reports otherwise) or "
            "run the release that wrote it"
        ) from exc


class HealthWriteError(RetryableError):
    """``health.json`` could not be written; the taints stay published, and the next
    round writes them again."""


@dataclass(frozen=True, slots=True)
class Recovery:
    probes: int  # consecutive healthy probes that clear a device
    period: float  # seconds between two probes
    xids: frozenset[int] = devicehealth.DEFAULT_RECOVERABLE_XIDS
    # From any thread: True when the physical GPU of this UUID answers NVML.
    probe: Callable[[str], bool] = lambda uuid: False


class HealthMonitor:
    def __init__(
        self,
        plugin_dir: Path,
        board: HealthBoard,
        *,
        pool: str,
        ignored: frozenset[int] = devicehealth.DEFAULT_IGNORED_XIDS,
        window: float = WINDOW,
        on_change: Callable[[], None] = lambda: None,
        recovery: Recovery | None = None,
        taints: Mapping[str, tuple[Taint, ...]] | None = None,
    ) -> None:
        """``taints``: what :func:`read_state` read; None: read it here (raises what it
        raises)."""
        self._dir = plugin_dir
        self._board = board
        self._pool = pool
        self._ignored = ignored
        self._window = window
        # Told after each change of the taints (the node tells its publisher); set before
        # run() by whoever builds the publisher from this monitor's taints.
        self.on_change = on_change
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._devices: dict[str, str] = {}  # GPU or MIG device UUID -> device name
        self._migs: dict[str, tuple[MigPlacement, ...]] = {}  # GPUs in MIG mode
        self.taints: dict[str, tuple[Taint, ...]] = dict(
            read_state(plugin_dir) if taints is None else taints
        )
        self.events_by_xid: collections.Counter[int] = collections.Counter()
        self.changes = 0
        self.windows = 0
        self._recovery = recovery
        self._streaks: dict[str, int] = {}  # device UUID -> consecutive healthy probes
        self.recoveries = 0
        # Taints changed since the last successful write; one write at a time, so an
        # older state never lands after a newer one.
        self._unsaved = False
        self._save_lock = asyncio.Lock()

    # -- state ----------------------------------------------------------------

    async def _save(self) -> None:
        """Write the taints if they changed; off the loop, since the fsync can take long on a
        busy disk and prepares are served meanwhile. Raises HealthWriteError."""
        async with self._save_lock:
            if not self._unsaved:
                return
            path = self._dir / STATE_FILE
            content = devicehealth.dumps(self.taints).encode()
            self._unsaved = False  # a change during the write sets it again
            try:
                await asyncio.to_thread(write_atomic, path, content, fsync=True)
            except OSError as exc:
                self._unsaved = True
                raise HealthWriteError(
                    f"cannot write {path}: {exc}; the taints stay published and are written "
                    "again at the next round"
                ) from exc

    def set_devices(
        self, uuid_to_device: Mapping[str, str], migs: devicehealth.Placements | None = None
    ) -> None:
        """The published devices (GPUs and MIG devices, by UUID), their health on the board;
        ``migs``: the MIG devices of each GPU in MIG mode, where its events land."""
        self._devices = dict(uuid_to_device)
        self._migs = {parent: tuple(devices) for parent, devices in (migs or {}).items()}
        self._publish_board()

    def _publish_board(self) -> None:
        entries = []
        for uuid, name in sorted(self._devices.items(), key=lambda item: item[1]):
            health, message = devicehealth.health_of(self.taints.get(uuid, ()))
            entries.append(DeviceHealth(self._pool, name, health, message))
        self._board.replace(entries)

    def device_taints(self, device_name: str) -> list[dict[str, str]]:
        for uuid, name in self._devices.items():
            if name == device_name:
                return [t.published() for t in self.taints.get(uuid, ())]
        return []

    def tainted(
        self, source: Callable[[], Awaitable[list[dict[str, Any]]]]
    ) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
        """``source`` (the publisher's desired devices) with each device's taints."""

        async def devices() -> list[dict[str, Any]]:
            out = []
            for device in await source():
                taints = self.device_taints(str(device.get("name")))
                out.append({**device, "taints": taints} if taints else device)
            return out

        return devices

    # -- events ---------------------------------------------------------------

    def submit(self, events: list[Event]) -> None:
        """From any thread; wakes the loop once per batch of pending events."""
        with self._lock:
            first = not self._pending
            self._pending.extend(events)
        if first and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _take(self) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
        return events

    async def run(self, clear_check: float = 5.0) -> None:
        self._loop = asyncio.get_running_loop()
        if self._pending:
            self._wake.set()

        async def round_() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), clear_check)
            await self._check_clear()
            if self._wake.is_set():
                await asyncio.sleep(self._window)  # the window: what arrives meanwhile joins
                self._wake.clear()
                await self._apply(self._take())
            await self._save()  # a change whose write failed is written again here

        # The taints live in memory and in the slices; a failed write or clear request
        # is worth a log line and another try, not the daemon.
        await supervised("health-monitor", round_, OnFailure.CONTINUE, pause=self._window)

    async def _apply(self, events: list[Event]) -> None:
        if not events:
            return
        self.windows += 1
        xids = collections.Counter(e.xid for e in events if isinstance(e, Xid))
        self.events_by_xid.update(xids)
        on_devices, unplaced = devicehealth.placed(events, self._migs)
        for event in on_devices:  # anything new about a device starts its count again
            self._streaks.pop(event.uuid, None)
        new = devicehealth.apply(self.taints, on_devices, self._ignored)
        changed = new != self.taints
        log.warning(
            "NVML health events",
            extra=kv(
                events=len(events),
                xids=",".join(f"{x}x{n}" for x, n in sorted(xids.items())),
                other=len(events) - sum(xids.values()),
                gpus=",".join(sorted({e.uuid for e in events})),
                devices=len({e.uuid for e in on_devices}),
                # XIDs naming a MIG instance that is not published: they taint nothing
                unplaced=len(unplaced),
                changed=changed,
            ),
        )
        if changed:
            await self._set(new)

    async def _set(self, taints: dict[str, tuple[Taint, ...]]) -> None:
        self.taints = taints
        self._unsaved = True
        try:
            await self._save()  # durable before it is published, where the disk allows
        finally:
            # Published even when the write failed: a broken disk must not keep a broken
            # GPU schedulable. The next round writes it again.
            self.changes += 1
            self._publish_board()
            self.on_change()

    async def run_recovery(self) -> None:
        """Probes the recoverable devices every ``period``; returns at once without one."""
        recovery = self._recovery
        if recovery is None:
            return

        async def round_() -> None:
            await asyncio.sleep(recovery.period)
            await self.probe_once()

        await supervised("health-recovery", round_, OnFailure.CONTINUE, pause=recovery.period)

    async def probe_once(self) -> None:
        recovery = self._recovery
        assert recovery is not None
        parents = {m.uuid: gpu_uuid for gpu_uuid, ms in self._migs.items() for m in ms}
        candidates = [
            uuid for uuid, ts in self.taints.items() if devicehealth.recoverable(ts, recovery.xids)
        ]
        self._streaks = {u: n for u, n in self._streaks.items() if u in candidates}
        answers: dict[str, bool] = {}
        for uuid in candidates:
            gpu_uuid = parents.get(uuid, uuid)
            if gpu_uuid not in answers:
                answers[gpu_uuid] = await asyncio.to_thread(recovery.probe, gpu_uuid)
            if uuid not in self.taints or not answers[gpu_uuid]:
                self._streaks.pop(uuid, None)
                continue
            self._streaks[uuid] = self._streaks.get(uuid, 0) + 1
        # Events applied while the probes ran dropped their devices' counts: re-checked here.
        done = sorted(
            u
            for u, n in self._streaks.items()
            if n >= recovery.probes
            and devicehealth.recoverable(self.taints.get(u, ()), recovery.xids)
        )
        if not done:
            return
        for uuid in done:
            del self._streaks[uuid]
        log.warning(
            "health recovered after healthy probes",
            extra=kv(
                devices=",".join(self._devices.get(u, u) for u in done), probes=recovery.probes
            ),
        )
        self.recoveries += len(done)
        await self._set(devicehealth.recovered(self.taints, done))

    async def _check_clear(self) -> None:
        path = self._dir / CLEAR_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("cannot read the health clear request", extra=kv(path=path, error=exc))
            return
        uuids: Iterable[str] | None = [line.strip() for line in text.splitlines() if line.strip()]
        if not uuids:
            uuids = None
        else:  # a GPU UUID clears its MIG devices too
            uuids = [*uuids, *(m.uuid for u in uuids for m in self._migs.get(u, ()))]
        new = devicehealth.cleared(self.taints, uuids)
        log.warning(
            "health cleared by request",
            extra=kv(gpus="all" if uuids is None else ",".join(uuids), changed=new != self.taints),
        )
        if new != self.taints:
            await self._set(new)
        path.unlink(missing_ok=True)
