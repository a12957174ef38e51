"""The controller's Prometheus metrics, read from its view at scrape time (no second count that
could drift), served by :class:`driver.common.metricsserver.MetricsServer`.

``nvidia_dra_compute_domain_info{status}`` keeps NVIDIA's name, help and labels
(``pkg/metrics/computedomain_cluster.go``), so dashboards and alerts made for NVIDIA's driver
keep working; NVIDIA counts up and down per UID on each status change, this counts the domains
in the view. A standby replica watches nothing and reports zero domains; ``..._leader`` says
which replica is the one to read.
"""

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.common.metricsserver import counted
from driver.kube.rest import ERROR_CLASSES
from drivers.computedomain import names

_WRITE_VERBS = ("create", "patch", "delete")


class ControllerMetrics(Collector):
    def __init__(
        self,
        *,
        domains: Callable[[], Mapping[str, int]] = dict,
        leading: Callable[[], bool] = bool,
        writes: Callable[[], Mapping[str, int]] = dict,
        write_failures: Callable[[], Mapping[str, int]] = dict,
        api_errors: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._domains = domains
        self._leading = leading
        self._writes = writes
        self._failures = write_failures
        self._api_errors = api_errors
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "nvidia_dra_compute_domain_info",
            "Current number of ComputeDomain custom resources in the cluster as seen by "
            "compute-domain-controller, partitioned by compute domain status.",
            labels=["status"],
        )
        counts = self._domains()
        for status in names.STATUSES:
            info.add_metric([status], counts.get(status, 0))
        yield info
        leader = GaugeMetricFamily(
            "gpu_dra_compute_domain_controller_leader",
            "1 while this replica holds the leader Lease and reconciles, else 0",
        )
        leader.add_metric([], 1 if self._leading() else 0)
        yield leader
        yield counted(
            "gpu_dra_compute_domain_writes",
            "Writes the ComputeDomain controller sent, by verb",
            "verb",
            _WRITE_VERBS,
            self._writes(),
        )
        yield counted(
            "gpu_dra_compute_domain_write_failures",
            "ComputeDomain controller writes that failed, by error class",
            "error",
            ERROR_CLASSES,
            self._failures(),
        )
        yield counted(
            "gpu_dra_api_errors",
            "Failed API server calls of the controller, by error class",
            "error",
            ERROR_CLASSES,
            self._api_errors(),
        )
