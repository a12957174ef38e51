"""Prometheus metrics every node driver of the framework has, served over HTTP on their own
port; each driver adds its own families (the GPU driver's: ``drivers/gpu/metrics.py``).

Counters and histograms are updated where things happen (prepare, unprepare). What is
prepared comes from the claim state, which tells :class:`ClaimMetrics` (a
``kubeletplugin.state.ClaimObserver``) of every prepare and unprepare, the claims recovered
at start, and at each reconcile what the node's records hold, another instance's work
included. Every label set is bounded.

They are served by :class:`driver.common.metricsserver.MetricsServer` (re-exported here), the
one server every component's metrics go through.
"""

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.common.metricsserver import CONTENT_TYPE as CONTENT_TYPE
from driver.common.metricsserver import MetricsServer as MetricsServer
from driver.devicekind import PreparedClaim


class ClaimMetrics:
    """What any driver of the framework counts (its DRA service's calls, by outcome, and its
    prepared claims), named under ``prefix``: no label of it is GPU-shaped, so a second
    driver of the node process (the ComputeDomain driver) has its own families beside the
    GPU driver's, served by the host's server (:class:`Forward`)."""

    def __init__(self, prefix: str, *, what: str = "Claims") -> None:
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


class Forward(Collector):
    """Another registry's families, collected into the host's (one port, one scrape)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()


class _Scraped(Collector):
    def __init__(self, metrics: ClaimMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_scraped()
