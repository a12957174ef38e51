"""Prometheus metrics of the node daemon, served over HTTP on their own port.

Counters and histograms are updated where things happen (prepare, unprepare);
health and NVML event counts are read from their owners at scrape time, so no
second copy can drift. What is prepared comes from the claim state, which tells
:class:`Metrics` (a ``kubeletplugin.state.ClaimObserver``) of every prepare and
unprepare, the claims recovered at start, and at each reconcile what the node's
records hold, another instance's work included. Every label set is bounded: outcomes
and health states are fixed sets, XIDs are bytes, and the per-device info series
exist only while their claim is prepared.

They are served by :class:`driver.common.metricsserver.MetricsServer` (re-exported here), the
one server every component's metrics go through.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.common.metricsserver import CONTENT_TYPE as CONTENT_TYPE
from driver.common.metricsserver import MetricsServer as MetricsServer
from driver.common.metricsserver import counted
from driver.devicekind import PreparedClaim
from driver.kube.rest import ERROR_CLASSES as _API_ERRORS
from drivers.gpu.kinds import gpu_uuid
from kubeletplugin.healthstream import HealthBoard

_STATES = ("Healthy", "Unhealthy", "Unknown")
_WRITE_VERBS = ("create", "update", "delete")


@dataclass(frozen=True)
class DeviceInfo:
    claim_uid: str
    claim_namespace: str
    claim_name: str
    device: str
    gpu_uuid: str


class ClaimMetrics:
    """What any driver of the framework counts (its DRA service's calls, by outcome, and its
    prepared claims), named under ``prefix``: no label of it is GPU-shaped, so a second
    driver of the node process (the ComputeDomain driver, ``COMPUTE_DOMAIN_PREFIX``) has its
    own families beside the GPU driver's, served by the host's server (:class:`Forward`)."""

    def __init__(self, prefix: str = "gpu_dra", *, what: str = "Claims") -> None:
        self.registry = CollectorRegistry()
        self._prefix = prefix
        self._what = what
        self.prepare_total = Counter(
            f"{prefix}_prepare_requests",
            f"{what} prepared, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.unprepare_total = Counter(
            f"{prefix}_unprepare_requests",
            f"{what} unprepared, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.prepare_seconds = Histogram(
            f"{prefix}_prepare_duration_seconds",
            "NodePrepareResources call latency",
            ["outcome"],
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            f"{prefix}_unprepare_duration_seconds",
            "NodeUnprepareResources call latency",
            ["outcome"],
            registry=self.registry,
        )
        self._uids: set[str] = set()
        self.registry.register(_Scraped(self))

    # The claim state's observer (kubeletplugin.state.ClaimObserver).

    def prepared(self, claim: PreparedClaim) -> None:
        self._uids.add(claim.uid)

    def unprepared(self, uid: str) -> None:
        self._uids.discard(uid)

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        self._uids = set(claims)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect_scraped(self) -> Iterator[Metric]:
        claims = GaugeMetricFamily(
            f"{self._prefix}_prepared_claims", f"{self._what} prepared on this node"
        )
        claims.add_metric([], len(self._uids))
        yield claims


# The ComputeDomain driver's families, in the kubelet plugin's with --compute-domains.
COMPUTE_DOMAIN_PREFIX = "gpu_dra_compute_domain_node"
COMPUTE_DOMAIN_WHAT = "ComputeDomain channel and daemon claims"


class Forward(Collector):
    """Another registry's families, collected into the host's (one port, one scrape)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()


class Metrics(ClaimMetrics):
    def __init__(
        self,
        *,
        board: HealthBoard | None = None,
        events_by_xid: Callable[[], Mapping[int, int]] = dict,
        slice_writes: Callable[[], Mapping[str, int]] = dict,
        slice_write_failures: Callable[[], Mapping[str, int]] = dict,
        api_errors: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        super().__init__()
        self._board = board
        self._events = events_by_xid
        self._slice_writes = slice_writes
        self._slice_write_failures = slice_write_failures
        self._api_errors = api_errors
        self._devices: dict[str, tuple[DeviceInfo, ...]] = {}  # claim uid -> its devices

    # The claim state's observer (kubeletplugin.state.ClaimObserver).

    def prepared(self, claim: PreparedClaim) -> None:
        self._devices[claim.uid] = _infos(claim)

    def unprepared(self, uid: str) -> None:
        self._devices.pop(uid, None)

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        self._devices = {uid: _infos(claim) for uid, claim in claims.items()}

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


def _infos(claim: PreparedClaim) -> tuple[DeviceInfo, ...]:
    return tuple(
        DeviceInfo(
            claim.uid, claim.namespace, claim.name, d.device_name, gpu_uuid(dict(d.identity))
        )
        for d in claim.devices
    )


class _Scraped(Collector):
    def __init__(self, metrics: ClaimMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_scraped()
