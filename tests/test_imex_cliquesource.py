"""The IMEX daemon's clique membership through the real ``kubernetes.aio`` client against the
local API server: the first daemon creates the clique, others join at the lowest free index
(also when they start at once), each entry follows its pod's readiness, peers are yielded on a
change, a daemon that stops takes its entry out, nothing is written at rest, and a domain's
status (our controller, running beside them) follows its daemons."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cluster.computedomain.controller import ComputeDomainController
from cluster.imexdaemon.cliquesource import CliqueSource, label_pod
from cluster.imexdaemon.membership import Member
from cluster.imexdaemon.peers import Peer
from driver.common.wire import Obj
from driver.kube.rest import Client
from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from tests.chart_render import render
from tests.computedomains import DRIVER_NAMESPACE, SETTINGS, daemon_pod, domain
from tests.imexharness import wait_for

CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.1"
TIMEOUT = 10.0

pytestmark = pytest.mark.timeout(60)


class Daemon:
    """One daemon's source, consumed in a task that keeps the lists it yields."""

    def __init__(self, client: Client, member: Member) -> None:
        self.source = CliqueSource(client, member)
        self.lists: list[tuple[Peer, ...]] = []
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        async for peers in self.source.updates():
            self.lists.append(peers)

    def ips(self) -> set[str]:
        return {p.ip for p in self.lists[-1]} if self.lists else set()

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Domain:
    """Daemon pods of one domain in the local API server, and their daemons."""

    def __init__(self, server: LocalApiServer, api_client: Any, uid: str) -> None:
        self.server, self.client, self.uid = server, Client(api_client), uid
        self.daemons: dict[str, Daemon] = {}

    def pod(self, node: str, ip: str, *, ready: bool) -> Obj:
        pod = daemon_pod(self.uid, node, ip=ip, clique=None, ready=ready)
        return self.server.put(pod) if self._current(node) is None else self._set_ready(node, ready)

    def _current(self, node: str) -> Obj | None:
        found = [
            p
            for p in self.server.objects("pods", DRIVER_NAMESPACE)
            if p["spec"]["nodeName"] == node
        ]
        return found[0] if found else None

    def _set_ready(self, node: str, ready: bool) -> Obj:
        pod = self._current(node)
        assert pod is not None
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        return self.server.put(pod)

    def member(self, node: str, ip: str) -> Member:
        pod = self._current(node)
        assert pod is not None
        return Member(
            namespace=DRIVER_NAMESPACE,
            domain_uid=self.uid,
            clique_id=CLIQUE,
            node_name=node,
            pod_name=pod["metadata"]["name"],
            pod_uid=pod["metadata"]["uid"],
            pod_ip=ip,
        )

    def start(self, node: str, ip: str, *, ready: bool = False) -> Daemon:
        self.pod(node, ip, ready=ready)
        self.daemons[node] = Daemon(self.client, self.member(node, ip))
        return self.daemons[node]

    def clique(self) -> Obj | None:
        name = names.clique_name(self.uid, CLIQUE)
        found = [
            c for c in self.server.objects("computedomaincliques") if c["metadata"]["name"] == name
        ]
        return found[0] if found else None

    def entries(self) -> dict[str, tuple[str, int, str]]:
        clique = self.clique() or {}
        return {
            d["nodeName"]: (d["ipAddress"], d["index"], d["status"])
            for d in clique.get("daemons") or ()
        }

    def clique_writes(self) -> int:
        return len(self.server.requests.writes("computedomaincliques"))


async def until(condition: Callable[[], bool], what: str) -> None:
    await wait_for(condition, what, TIMEOUT)


@pytest.fixture
async def cd(apiserver: LocalApiServer, api_client: Any) -> AsyncIterator[Domain]:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}}
    )
    made = Domain(apiserver, api_client, "7c1e4d52-95c3-4f1f-a0a3-1f1d7a2b9e44")
    try:
        yield made
    finally:
        await asyncio.gather(*(d.stop() for d in made.daemons.values()))


async def test_two_daemons_starting_at_once_both_join_and_see_each_other(cd: Domain) -> None:
    a = cd.start("node-a", "10.0.0.1")
    b = cd.start("node-b", "10.0.0.2")
    await until(lambda: a.ips() == b.ips() == {"10.0.0.1", "10.0.0.2"}, "both see both")
    entries = cd.entries()
    assert sorted(index for _, index, _ in entries.values()) == [0, 1]
    assert {ip for ip, _, _ in entries.values()} == {"10.0.0.1", "10.0.0.2"}
    clique = cd.clique()
    assert clique is not None
    assert clique["metadata"]["labels"] == {
        names.COMPUTE_DOMAIN_LABEL: cd.uid,
        names.CLIQUE_LABEL: CLIQUE,
    }
    owners = {o["name"] for o in clique["metadata"]["ownerReferences"]}
    assert owners == {"daemon-node-a", "daemon-node-b"}


async def test_an_entry_follows_its_pods_readiness_and_nothing_is_written_at_rest(
    cd: Domain,
) -> None:
    a = cd.start("node-a", "10.0.0.1")
    await until(lambda: cd.entries().get("node-a") == ("10.0.0.1", 0, names.NOT_READY), "joined")
    cd.pod("node-a", "10.0.0.1", ready=True)
    await until(lambda: cd.entries()["node-a"][2] == names.READY, "Ready")
    cd.pod("node-a", "10.0.0.1", ready=False)
    await until(lambda: cd.entries()["node-a"][2] == names.NOT_READY, "NotReady")
    assert cd.clique_writes() == 3  # create, Ready, NotReady
    # A change to the pod that its entry does not show: seen by the source, and not written.
    pod = cd._current("node-a")
    assert pod is not None
    pod["metadata"].setdefault("annotations", {})["touched"] = "yes"
    seen = int(cd.server.put(pod)["metadata"]["resourceVersion"])
    await until(lambda: a.source._pods.seen >= seen, "the pod change seen")
    assert cd.clique_writes() == 3
    assert len(a.lists) == 1  # one peer list: readiness changes no address


async def test_a_daemon_that_leaves_takes_its_entry_and_its_peers_follow(cd: Domain) -> None:
    a = cd.start("node-a", "10.0.0.1")
    b = cd.start("node-b", "10.0.0.2")
    await until(lambda: a.ips() == {"10.0.0.1", "10.0.0.2"}, "both joined")
    await b.stop()
    await b.source.leave()
    await until(lambda: a.ips() == {"10.0.0.1"}, "a sees b gone")
    assert set(cd.entries()) == {"node-a"}
    # b's node comes back with a new pod: the lowest free index again, a new address.
    cd.server.delete("pods", "daemon-node-b", DRIVER_NAMESPACE)
    cd.start("node-b", "10.0.0.7")
    await until(lambda: a.ips() == {"10.0.0.1", "10.0.0.7"}, "b back")
    free = 1 - cd.entries()["node-a"][1]  # whichever of 0 and 1 a did not take at the start
    assert cd.entries()["node-b"][:2] == ("10.0.0.7", free)


async def test_a_clique_deleted_under_a_daemon_is_made_again(cd: Domain) -> None:
    a = cd.start("node-a", "10.0.0.1")
    await until(lambda: "node-a" in cd.entries(), "joined")
    cd.server.delete("computedomaincliques", names.clique_name(cd.uid, CLIQUE), DRIVER_NAMESPACE)
    await until(lambda: "node-a" in cd.entries(), "joined again")
    assert a.ips() == {"10.0.0.1"}


async def test_the_pod_is_labelled_with_its_clique(cd: Domain) -> None:
    cd.pod("node-a", "10.0.0.1", ready=False)
    await label_pod(cd.client, cd.member("node-a", "10.0.0.1"))
    pod = cd._current("node-a")
    assert pod is not None and pod["metadata"]["labels"][names.CLIQUE_LABEL] == CLIQUE


async def test_the_domain_status_follows_its_daemons(cd: Domain, api_client: Any) -> None:
    """Our controller beside two daemons: NotReady until both pods are Ready, then Ready;
    NotReady again when one pod is not."""
    cd.server.seed(domain("cd", num_nodes=2, uid=cd.uid))
    controller = ComputeDomainController(
        api_client, settings=SETTINGS, identity="a", leader_elect=False, backoff_cap=0.2
    )
    running = asyncio.create_task(controller.run())
    try:

        def status() -> tuple[str, int]:
            found = cd.server.objects("computedomains")[0].get("status") or {}
            return found.get("status", ""), len(found.get("nodes") or ())

        cd.start("node-a", "10.0.0.1")
        cd.start("node-b", "10.0.0.2")
        await until(lambda: status() == (names.NOT_READY, 2), "two nodes listed, not ready")
        cd.pod("node-a", "10.0.0.1", ready=True)
        cd.pod("node-b", "10.0.0.2", ready=True)
        await until(lambda: status() == (names.READY, 2), "Ready")
        cd.pod("node-b", "10.0.0.2", ready=False)
        await until(lambda: status() == (names.NOT_READY, 2), "NotReady again")
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_the_charts_daemon_role_is_exactly_what_a_daemon_sends(cd: Domain) -> None:
    """Every request a daemon makes through its life is granted, and every grant is used."""
    a = cd.start("node-a", "10.0.0.1")
    b = cd.start("node-b", "10.0.0.2")
    await label_pod(cd.client, a.source.member)
    await until(lambda: a.ips() == b.ips() == {"10.0.0.1", "10.0.0.2"}, "both joined")
    cd.pod("node-a", "10.0.0.1", ready=True)
    await until(lambda: cd.entries()["node-a"][2] == names.READY, "Ready")
    await a.stop()
    await a.source.leave()
    await until(lambda: set(cd.entries()) == {"node-b"}, "a left")
    rules = {
        o["metadata"]["name"]: o
        for o in render((), ("computeDomains.enabled=true",))
        if o["kind"] == "Role"
    }["compute-domain-daemon"]["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert set(cd.server.requests.permissions()) == granted
    assert {r.namespace for r in cd.server.requests} == {DRIVER_NAMESPACE}
