"""The demo from start to end: set up, the four acts, the report, and a clean teardown."""

import asyncio
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from driver import DEFAULT_DRIVER_NAME
from driver.kube import client as kubeclient
from sandbox.demo import _report as report
from sandbox.demo import _views as views
from sandbox.demo._cdi import read_specs
from sandbox.demo._cluster import node_object, slice_rows, wait_for_slices
from sandbox.demo._kubelet import NodeKubelet, NodeRun
from sandbox.demo._manifests import (
    claim_from_template,
    load_examples,
    pod_claim_sources,
)
from sandbox.demo._nodes import DemoError, NodePlugin, NodeSpec
from sandbox.demo._scheduler import claim_key, schedule
from sandbox.demo._views import Placed

NAMESPACE = "default"


@dataclass(frozen=True)
class Options:
    nodes: Sequence[NodeSpec]
    keep: bool = False
    driver: str = DEFAULT_DRIVER_NAME
    # Plugin start and first publish; generous for two cold Python processes on two cores.
    ready_timeout_s: float = 60.0


class Demo:
    def __init__(self, options: Options, out: TextIO) -> None:
        self._options = options
        self._out = out
        self._started = time.monotonic()
        self._api: Any = None
        self._plugins: list[NodePlugin] = []

    def say(self, text: str = "") -> None:
        self._out.write(text + "\n")
        self._out.flush()

    async def run(self) -> int:
        """The exit code: 0 when every step did what it shows."""
        from sandbox.apiserver import LocalApiServer

        # The in-process server logs every request; the report says what matters.
        logging.getLogger("sandbox.apiserver").setLevel(logging.WARNING)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        # SIGINT already cancels this task (asyncio.run); SIGTERM should clean up the same way.
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        server = LocalApiServer()
        # Short: the plugins' unix socket paths live under it (107-byte limit).
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gdra-"))
        try:
            self.say("gpu-dra demo: the whole DRA flow on this machine; no cluster, no GPU")
            self.say(f"work directory {root} (removed at exit)")
            await server.start()
            kubeconfig = server.write_kubeconfig(root / "kubeconfig")
            self._api = await kubeclient.api_client(kubeconfig, component="demo")
            code = await self._acts(root, kubeconfig, server.url)
            if self._options.keep:
                self.say(f"\nthe API server keeps running at {server.url}; explore it with:")
                self.say(f"  kubectl --kubeconfig {kubeconfig} get resourceslices")
                self.say(f"  kubectl --kubeconfig {kubeconfig} get resourceclaims -o yaml")
                self.say("press Ctrl-C to stop the nodes and the API server")
                await asyncio.Event().wait()
        finally:
            codes = await self._teardown(server, root)
            loop.remove_signal_handler(signal.SIGTERM)
        if any(c != 0 for c in codes.values()):
            self.say("a plugin did not shut down cleanly (non-zero exit code)")
            code = code or 1
        return code

    async def _teardown(self, server: Any, root: Path) -> dict[str, int | None]:
        """Stop the plugins, the client and the server; the work directory goes whatever happens."""
        self.say()
        codes: dict[str, int | None] = {}
        started = [p for p in self._plugins if p.started]
        try:
            for plugin, code in zip(
                started, await asyncio.gather(*(p.stop() for p in started)), strict=True
            ):
                codes[plugin.name] = code
                self.say(f"plugin of {plugin.name} (pid {plugin.pid}) stopped, exit code {code}")
        finally:
            try:
                if self._api is not None:
                    await self._api.close()
                await server.stop()
            finally:
                shutil.rmtree(root, ignore_errors=True)
                self.say(f"removed {root}")
        return codes

    async def _acts(self, root: Path, kubeconfig: Path, url: str) -> int:
        from kubernetes.aio.client import ApiException

        try:
            await self._start_nodes(root, kubeconfig, url)
            await self._publish()
            pods = await self._apply()
            placed = await self._schedule(pods)
            runs = await self._kubelet(placed)
        except ApiException as exc:
            body = str(exc.body or "")[:400]
            raise DemoError(
                f"the API server refused a request: {exc.status} {exc.reason}: {body}"
            ) from exc
        failures = [e for run in runs for e in run.errors]
        self.say(report.heading(7, "summary"))
        self.say(views.summary(placed, runs, failures))
        self.say(f"total time: {time.monotonic() - self._started:.1f} s")
        return 1 if failures else 0

    # ---- 1. API server and nodes ------------------------------------------------------------

    async def _start_nodes(self, root: Path, kubeconfig: Path, url: str) -> None:
        from kubernetes.aio import client

        self.say(report.heading(1, "local API server, Nodes, one kubelet plugin process per node"))
        self.say(f"API server {url} (kubeconfig {kubeconfig})")
        core: Any = client.CoreV1Api(self._api)
        for spec in self._options.nodes:
            await core.create_node(node_object(spec))
            self._plugins.append(
                NodePlugin(
                    spec, root / spec.name, kubeconfig=kubeconfig, driver=self._options.driver
                )
            )
        for plugin in self._plugins:
            await plugin.start()
        await asyncio.gather(*(p.wait_ready(self._options.ready_timeout_s) for p in self._plugins))
        self.say(
            report.table(
                ["NODE", "PROFILE", "PLUGIN PID", "REGISTRATION SOCKET"],
                [[p.name, p.spec.profile, p.pid, p.paths.registration] for p in self._plugins],
            )
        )
        self.say("plugins up: " + " ".join(f"{p.name}={p.pid}" for p in self._plugins))

    # ---- 2. slices, classes, examples ---------------------------------------------------------

    async def _publish(self) -> None:
        self.say(report.heading(2, "ResourceSlices the plugins published"))
        slices = await wait_for_slices(
            self._api, self._plugins, self._options.driver, self._options.ready_timeout_s
        )
        self.say(
            report.table(
                ["SLICE", "NODE", "POOL", "GEN", "DEVICES", "MODEL", "NVLINK"],
                slice_rows(slices, self._options.driver),
            )
        )

    async def _apply(self) -> list[dict[str, Any]]:
        """DeviceClasses from the chart, then the examples; the example pods, as created."""
        from kubernetes.aio import client

        from tools.validation import chart_device_classes

        self.say(report.heading(3, "DeviceClasses from the Helm chart, and the examples"))
        resource: Any = client.ResourceV1Api(self._api)
        core: Any = client.CoreV1Api(self._api)
        # Every switch on, as validate and explain know them (a test holds them equal to the
        # chart's render): the demo needs no Helm engine, so a plain install runs it.
        classes = chart_device_classes()
        rows: list[list[object]] = []
        for obj in classes:
            await resource.create_device_class(obj)
            exprs = [s["cel"]["expression"] for s in obj["spec"].get("selectors") or ()]
            rows.append(["DeviceClass", obj["metadata"]["name"], "chart", " && ".join(exprs)])
        pods: list[dict[str, Any]] = []
        for source, obj in load_examples():
            obj["metadata"]["namespace"] = NAMESPACE
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind == "ResourceClaimTemplate":
                await resource.create_namespaced_resource_claim_template(NAMESPACE, obj)
            elif kind == "ResourceClaim":
                await resource.create_namespaced_resource_claim(NAMESPACE, obj)
            elif kind == "Pod":
                created = await core.create_namespaced_pod(NAMESPACE, obj)
                pods.append(self._api.sanitize_for_serialization(created))
            else:
                continue
            rows.append([kind, name, source, ""])
        self.say(report.table(["KIND", "NAME", "FROM", "SELECTS"], rows))
        return pods

    # ---- 3. control plane --------------------------------------------------------------------

    async def _claims_for(self, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Pod claim name -> ResourceClaim, creating claims from templates as the
        resource-claim controller does and recording them in the pod's status."""
        from kubernetes.aio import client

        resource: Any = client.ResourceV1Api(self._api)
        core: Any = client.CoreV1Api(self._api)
        claims: dict[str, dict[str, Any]] = {}
        statuses = []
        for pod_claim, kind, name in pod_claim_sources(pod):
            if kind == "template":
                template = await resource.read_namespaced_resource_claim_template(name, NAMESPACE)
                body = claim_from_template(
                    pod, pod_claim, self._api.sanitize_for_serialization(template)
                )
                created = await resource.create_namespaced_resource_claim(NAMESPACE, body)
                claim = self._api.sanitize_for_serialization(created)
                statuses.append({"name": pod_claim, "resourceClaimName": claim["metadata"]["name"]})
            else:
                read = await resource.read_namespaced_resource_claim(name, NAMESPACE)
                claim = self._api.sanitize_for_serialization(read)
            claims[pod_claim] = claim
        if statuses:
            pod["status"] = {**(pod.get("status") or {}), "resourceClaimStatuses": statuses}
            written = await core.replace_namespaced_pod_status(
                pod["metadata"]["name"], NAMESPACE, pod
            )
            pod.update(self._api.sanitize_for_serialization(written))
        return claims

    async def _schedule(self, pods: list[dict[str, Any]]) -> list[Placed]:
        self.say(report.heading(4, "control plane: claims from templates, allocation (explain)"))
        placed: list[Placed] = []
        for pod in pods:
            claims = await self._claims_for(pod)
            outcome = await schedule(self._api, pod, list(claims.values()))
            written = {claim_key(o.claim): o.claim for o in outcome.claims}
            claims = {n: written.get(claim_key(c), c) for n, c in claims.items()}
            placed.append(Placed(pod, claims, outcome))
            self.say(views.pod_view(NAMESPACE, outcome))
        rows = views.misfits(placed)
        self.say("\nwhere claims do not fit, and why")
        self.say(report.table(["CLAIM", "NODE", "REASON"], rows) if rows else "(nowhere)")
        self.say("\nallocations written to status.allocation, with reservedFor")
        self.say(views.allocations(placed))
        return placed

    # ---- 4. kubelet --------------------------------------------------------------------------

    async def _kubelet(self, placed: list[Placed]) -> list[NodeRun]:
        self.say(report.heading(5, "kubelet: NodePrepareResources, what containers get"))
        kubelets: list[NodeKubelet] = []
        for plugin in self._plugins:
            pods = [(p.pod, p.claims) for p in placed if p.outcome.node == plugin.name]
            if pods:
                kubelets.append(NodeKubelet(plugin, pods))
        try:
            for kubelet in kubelets:
                await kubelet.register()
                await kubelet.prepare()
            self.say(views.prepared([k.run for k in kubelets]))
            self.say(report.heading(6, "kubelet: NodeUnprepareResources after the pods end"))
            for kubelet in kubelets:
                await kubelet.unprepare()
            left = {p.name: len(read_specs(p.cdi_root)) for p in self._plugins}
            self.say(views.unprepared([k.run for k in kubelets], left))
        finally:
            for kubelet in kubelets:
                await kubelet.close()
        return [k.run for k in kubelets]
