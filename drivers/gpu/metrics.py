"""The GPU driver's Prometheus metrics: the framework's claim counts
(``kubeletplugin.metrics.ClaimMetrics``) and what only a GPU node has.

Health and NVML event counts are read from their owners at scrape time, so no second copy
can drift; the per-device info series (which claim holds which physical GPU, as each
device's kind says) exist only while their claim is prepared. XIDs are bytes and health
states a fixed set, so every label set stays bounded.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from driver.common.metricsserver import counted
from driver.devicekind import PreparedClaim, PreparedDevice
from driver.kube.rest import ERROR_CLASSES as _API_ERRORS
from drivers.gpu.kinds import KindTable, gpu_kinds
from kubeletplugin.healthstream import HealthBoard
from kubeletplugin.metrics import ClaimMetrics

PREFIX = "gpu_dra"
_STATES = ("Healthy", "Unhealthy", "Unknown")
_WRITE_VERBS = ("create", "update", "delete")


@dataclass(frozen=True)
class DeviceInfo:
    claim_uid: str
    claim_namespace: str
    claim_name: str
    device: str
    gpu_uuid: str


class Metrics(ClaimMetrics):
    def __init__(
        self,
        *,
        kinds: KindTable | None = None,
        board: HealthBoard | None = None,
        events_by_xid: Callable[[], Mapping[int, int]] = dict,
        slice_writes: Callable[[], Mapping[str, int]] = dict,
        slice_write_failures: Callable[[], Mapping[str, int]] = dict,
        api_errors: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        super().__init__(PREFIX)
        # Each device's physical GPU, as its kind says (a table of its own when None).
        self._kinds = gpu_kinds() if kinds is None else kinds
        self._board = board
        self._events = events_by_xid
        self._slice_writes = slice_writes
        self._slice_write_failures = slice_write_failures
        self._api_errors = api_errors
        self._devices: dict[str, tuple[DeviceInfo, ...]] = {}  # claim uid -> its devices

    # The claim state's observer (kubeletplugin.state.ClaimObserver).

    def prepared(self, claim: PreparedClaim) -> None:
        self._devices[claim.uid] = self._infos(claim)

    def unprepared(self, uid: str) -> None:
        self._devices.pop(uid, None)

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        self._devices = {uid: self._infos(claim) for uid, claim in claims.items()}

    def collect_scraped(self) -> Iterator[Metric]:
        health = GaugeMetricFamily(
            "gpu_dra_devices", "Published devices by health state", labels=["state"]
        )
        counts = dict.fromkeys(_STATES, 0)
        if self._board is not None:
            for device in self._board.snapshot()[1]:
                counts[device.health] += 1
        for state, count in counts.items():
            health.add_metric([state], count)
        yield health
        events = GaugeMetricFamily(
            "gpu_dra_nvml_xid_events", "NVML XID events seen, by XID", labels=["xid"]
        )
        for xid, count in sorted(self._events().items()):
            events.add_metric([str(xid)], count)
        yield events
        info = GaugeMetricFamily(
            "gpu_dra_prepared_device_info",
            "One series per prepared device: which claim holds which GPU",
            labels=["gpu_uuid", "device", "claim_namespace", "claim_name", "claim_uid"],
        )
        for devices in self._devices.values():
            for d in devices:
                info.add_metric(
                    [d.gpu_uuid, d.device, d.claim_namespace, d.claim_name, d.claim_uid], 1
                )
        yield info
        claims = GaugeMetricFamily("gpu_dra_prepared_claims", "Claims prepared on this node")
        claims.add_metric([], len(self._devices))
        yield claims
        yield counted(
            "gpu_dra_slice_writes",
            "ResourceSlice writes the publisher sent, by verb",
            "verb",
            _WRITE_VERBS,
            self._slice_writes(),
        )
        yield counted(
            "gpu_dra_slice_write_failures",
            "ResourceSlice writes that failed, by error class",
            "error",
            _API_ERRORS,
            self._slice_write_failures(),
        )
        yield counted(
            "gpu_dra_api_errors",
            "Failed API server calls of the daemon, by error class",
            "error",
            _API_ERRORS,
            self._api_errors(),
        )

    def _infos(self, claim: PreparedClaim) -> tuple[DeviceInfo, ...]:
        return tuple(
            DeviceInfo(
                claim.uid, claim.namespace, claim.name, d.device_name, self._gpu_of(d.kind, d)
            )
            for d in claim.devices
        )

    def _gpu_of(self, kind_name: str, device: PreparedDevice) -> str:
        kind = self._kinds.get(kind_name)
        return kind.physical_gpu(dict(device.identity)) if kind is not None else ""
