"""Prometheus metrics of the node daemon, served over HTTP on their own port.

Counters and histograms are updated where things happen (prepare, unprepare);
health and NVML event counts are read from their owners at scrape time, so no
second copy can drift. What is prepared comes from the claim state, which tells
:class:`Metrics` (a ``kubeletplugin.state.ClaimObserver``) of every prepare and
unprepare, the claims recovered at start, and at each reconcile what the node's
records hold, another instance's work included. Every label set is bounded: outcomes
and health states are fixed sets, XIDs are bytes, and the per-device info series
exist only while their claim is prepared.

The server is one asyncio server on the daemon's loop: a bounded number of
connections at a time (the rest are closed at once), each given ``read_timeout`` to
send its request, so a slow or hostile client costs no thread and no unbounded memory.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.common.logs import kv
from driver.gpu.kinds import PreparedClaim, gpu_uuid
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

    # The claim state's observer (kubeletplugin.state.ClaimObserver).

    def prepared(self, claim: PreparedClaim) -> None:
        self._devices[claim.uid] = _infos(claim)

    def unprepared(self, uid: str) -> None:
        self._devices.pop(uid, None)

    def recorded(self, claims: Mapping[str, PreparedClaim]) -> None:
        self._devices = {uid: _infos(claim) for uid, claim in claims.items()}

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
        for devices in self._devices.values():
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


def _infos(claim: PreparedClaim) -> tuple[DeviceInfo, ...]:
    return tuple(
        DeviceInfo(
            claim.uid, claim.namespace, claim.name, d.device_name, gpu_uuid(dict(d.identity))
        )
        for d in claim.devices
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


_REQUEST_LIMIT = 8192  # bytes of request line and headers; a scrape sends a few hundred


class MetricsServer:
    """``GET /metrics`` on ``host``:``port`` (port 0: a free one, then :attr:`port` says
    which). ``host``: the pod's IP in the chart; loopback by default, so metrics are not
    offered on every interface of a host-network pod unless asked for."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        port: int,
        host: str = "127.0.0.1",
        max_connections: int = 8,
        read_timeout: float = 10.0,
    ) -> None:
        self._metrics = metrics
        self._host = host
        self.port = port
        self._max = max_connections
        self._read_timeout = read_timeout
        self._active = 0
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self.port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self._host, self.port, limit=_REQUEST_LIMIT
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "serving metrics",
            extra=kv(address=self._host, port=self.port, max_connections=self._max),
        )

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= self._max:  # over the cap: no slot, and no wait for one
            writer.close()
            return
        self._active += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", b"GET only\n"
            elif path in ("/metrics", "/"):
                status, body = "200 OK", self._metrics.render()
            else:
                status, body = "404 Not Found", b"not found: GET /metrics\n"
            content_type = CONTENT_TYPE if status == "200 OK" else "text/plain; charset=utf-8"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await asyncio.wait_for(writer.drain(), self._read_timeout)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that is slow, gone or sends too much gets no answer
        finally:
            self._active -= 1
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), self._read_timeout)
