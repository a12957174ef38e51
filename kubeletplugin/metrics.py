"""Prometheus metrics of the node daemon, served over HTTP on their own port.

Counters and histograms are updated where things happen (prepare, unprepare);
health and NVML event counts are read from their owners at scrape time, so no
second copy can drift. Every label set is bounded: outcomes and health states
are fixed sets, XIDs are bytes, and the per-device info series exist only while
their claim is prepared (they go with its unprepare).
"""

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.common.logs import kv
from driver.kube.rest import ApiError
from kubeletplugin.healthstream import HealthBoard

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATES = ("Healthy", "Unhealthy", "Unknown")
_WRITE_VERBS = ("create", "update", "delete")
# The error classes of driver.kube.rest: a fixed set, each reported (0 until it happens).
_API_ERRORS = tuple(sorted(c.__name__ for c in ApiError.__subclasses__()))


@dataclass(frozen=True)
class DeviceInfo:
    claim_uid: str
    claim_namespace: str
    claim_name: str
    device: str
    gpu_uuid: str


class Metrics:
    def __init__(
        self,
        *,
        board: HealthBoard | None = None,
        events_by_xid: Callable[[], Mapping[int, int]] = dict,
        slice_writes: Callable[[], Mapping[str, int]] = dict,
        slice_write_failures: Callable[[], Mapping[str, int]] = dict,
        api_errors: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self.prepare_total = Counter(
            "gpu_dra_prepare_requests",
            "Claims prepared, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.unprepare_total = Counter(
            "gpu_dra_unprepare_requests",
            "Claims unprepared, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.prepare_seconds = Histogram(
            "gpu_dra_prepare_duration_seconds",
            "NodePrepareResources call latency",
            ["outcome"],
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            "gpu_dra_unprepare_duration_seconds",
            "NodeUnprepareResources call latency",
            ["outcome"],
            registry=self.registry,
        )
        self._board = board
        self._events = events_by_xid
        self._slice_writes = slice_writes
        self._slice_write_failures = slice_write_failures
        self._api_errors = api_errors
        self._devices: dict[str, tuple[DeviceInfo, ...]] = {}  # claim uid -> its devices
        self.registry.register(_Scraped(self))

    def prepared(self, claim_uid: str, devices: Sequence[DeviceInfo]) -> None:
        self._devices[claim_uid] = tuple(devices)

    def unprepared(self, claim_uid: str) -> None:
        self._devices.pop(claim_uid, None)

    def render(self) -> bytes:
        return generate_latest(self.registry)

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
        for devices in tuple(self._devices.values()):  # scraped from the server's thread
            for d in devices:
                info.add_metric(
                    [d.gpu_uuid, d.device, d.claim_namespace, d.claim_name, d.claim_uid], 1
                )
        yield info
        claims = GaugeMetricFamily("gpu_dra_prepared_claims", "Claims prepared on this node")
        claims.add_metric([], len(self._devices))
        yield claims
        yield _counted(
            "gpu_dra_slice_writes",
            "ResourceSlice writes the publisher sent, by verb",
            "verb",
            _WRITE_VERBS,
            self._slice_writes(),
        )
        yield _counted(
            "gpu_dra_slice_write_failures",
            "ResourceSlice writes that failed, by error class",
            "error",
            _API_ERRORS,
            self._slice_write_failures(),
        )
        yield _counted(
            "gpu_dra_api_errors",
            "Failed API server calls of the daemon, by error class",
            "error",
            _API_ERRORS,
            self._api_errors(),
        )


def _counted(
    name: str, documentation: str, label: str, known: Sequence[str], counts: Mapping[str, int]
) -> CounterMetricFamily:
    """A counter family with every known label value (bounded: others are not reported)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value in known:
        family.add_metric([value], counts.get(value, 0))
    return family


class _Scraped(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_scraped()


class MetricsServer:
    """``GET /metrics`` on ``port`` (0: a free one, then :attr:`port` says which).

    prometheus_client's own threaded HTTP server: nothing the daemon does not already
    import, and a slow scrape never holds up the event loop. Collection reads the claim
    state from that thread, hence the copies in :meth:`Metrics.collect_scraped`.
    """

    def __init__(self, metrics: Metrics, *, port: int, host: str = "0.0.0.0") -> None:
        self._metrics = metrics
        self._host = host
        self.port = port
        self._server: WSGIServer | None = None

    async def start(self) -> None:
        self._server, _ = start_http_server(self.port, self._host, self._metrics.registry)
        self.port = int(self._server.server_port)
        log.info("serving metrics", extra=kv(port=self.port))

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)  # returns once its loop has stopped
            server.server_close()
