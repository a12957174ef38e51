"""The kubelet's part: register with a node's plugin, prepare each pod's claims, unprepare.

As the kubelet does, a claim shared by several pods of the node is prepared once
(for its first pod) and unprepared once (after its last pod), and a container sees
only the devices of the claims it names.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeletplugin.claims import ClaimRef
from sandbox.demo._cdi import ContainerEdits, defining, read_specs, resolve
from sandbox.demo._nodes import DemoError, NodePlugin
from sandbox.demo._scheduler import claim_key
from sandbox.kubeletsim import KubeletSim


@dataclass(frozen=True)
class PreparedDevice:
    pod: str
    claim: str
    requests: tuple[str, ...]
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class ContainerView:
    pod: str
    container: str
    edits: ContainerEdits


@dataclass
class NodeRun:
    """What happened on one node; ``errors`` lists per-claim failures."""

    node: str
    version: str = ""
    endpoint: str = ""
    devices: list[PreparedDevice] = field(default_factory=list)
    containers: list[ContainerView] = field(default_factory=list)
    # claim key -> (unprepare error or "", CDI spec files still naming the claim)
    unprepared: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


class NodeKubelet:
    """The kubelet of one simulated node; ``pods`` are (pod, {pod claim name: claim})."""

    def __init__(
        self, plugin: NodePlugin, pods: Sequence[tuple[Mapping[str, Any], dict[str, Any]]]
    ) -> None:
        self._plugin = plugin
        self._pods = pods
        self._sim: KubeletSim | None = None
        self._ids: dict[str, list[str]] = {}  # claim uid -> CDI device IDs
        self.run = NodeRun(plugin.name)

    async def register(self) -> None:
        self._sim = await KubeletSim.register(self._plugin.paths.registration)
        self.run.version = self._sim.registration.version
        self.run.endpoint = self._sim.registration.info.endpoint

    async def close(self) -> None:
        if self._sim is not None:
            await self._sim.close()

    def _claims(self) -> list[dict[str, Any]]:
        unique: dict[str, dict[str, Any]] = {}
        for _, claims in self._pods:
            for claim in claims.values():
                unique.setdefault(claim["metadata"]["uid"], claim)
        return list(unique.values())

    async def prepare(self) -> None:
        assert self._sim is not None
        for pod, claims in self._pods:
            pod_name = pod["metadata"]["name"]
            todo = [c for c in claims.values() if c["metadata"]["uid"] not in self._ids]
            if todo:
                response = await self._sim.prepare([_ref(c) for c in todo])
                for claim in todo:
                    self._record(pod_name, claim, response.claims.get(claim["metadata"]["uid"]))
            self._containers(pod, claims)

    def _record(self, pod: str, claim: Mapping[str, Any], answer: Any) -> None:
        uid = claim["metadata"]["uid"]
        if answer is None:
            self.run.errors.append(f"{claim_key(claim)}: the plugin's answer has no entry for it")
            return
        if answer.error:
            self.run.errors.append(f"{claim_key(claim)}: {answer.error}")
            return
        self._ids[uid] = []
        for device in answer.devices:
            ids = tuple(device.cdi_device_ids)
            self._ids[uid].extend(ids)
            self.run.devices.append(
                PreparedDevice(
                    pod, claim_key(claim), tuple(device.request_names), device.device_name, ids
                )
            )

    def _containers(self, pod: Mapping[str, Any], claims: Mapping[str, Any]) -> None:
        specs = read_specs(self._plugin.cdi_root)
        for container in pod["spec"].get("containers") or ():
            names = [c["name"] for c in (container.get("resources") or {}).get("claims") or ()]
            wanted = [claims[n] for n in names if n in claims]
            ids = [i for c in wanted for i in self._ids.get(c["metadata"]["uid"], ())]
            if not ids:
                continue
            try:
                edits = resolve(ids, specs)
            except DemoError as exc:
                self.run.errors.append(f"{pod['metadata']['name']}/{container['name']}: {exc}")
                continue
            self.run.containers.append(
                ContainerView(pod["metadata"]["name"], container["name"], edits)
            )

    async def unprepare(self) -> None:
        """Once every pod of the node has finished: each claim it prepared, one call."""
        assert self._sim is not None
        claims = [c for c in self._claims() if c["metadata"]["uid"] in self._ids]
        if not claims:
            return
        response = await self._sim.unprepare([_ref(c) for c in claims])
        specs = read_specs(self._plugin.cdi_root)
        for claim in claims:
            uid = claim["metadata"]["uid"]
            answer = response.claims.get(uid)
            error = "no entry in the answer" if answer is None else answer.error
            left = defining(self._ids[uid], specs)
            self.run.unprepared[claim_key(claim)] = (error, left)
            if error:
                self.run.errors.append(f"unprepare {claim_key(claim)}: {error}")
            if left:
                self.run.errors.append(f"unprepare {claim_key(claim)}: CDI spec left: {left}")
