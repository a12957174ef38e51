"""The ComputeDomain controller through the real ``kubernetes.aio`` client against the local API
server: the objects, status from daemons, deletion, writes counted from the server's request
log (none at rest), two replicas, a lost answer, and SIGKILL between any two writes."""

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster.computedomain import objects
from cluster.computedomain.controller import ComputeDomainController
from cluster.computedomain.metrics import ControllerMetrics
from driver.common.wire import Obj
from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from tests.computedomains import DRIVER_NAMESPACE, SETTINGS, clique, daemon, daemon_pod, domain
from tests.pluginharness import wait_for

TIMEOUT = 10.0
LABEL = names.COMPUTE_DOMAIN_LABEL
OURS = ("computedomains", "daemonsets", "resourceclaimtemplates", "computedomaincliques", "nodes")
ROOT = Path(__file__).resolve().parent.parent


class Running:
    """Controllers a test starts; cancelled (as SIGTERM would) at the end."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.tasks: dict[ComputeDomainController, asyncio.Task[None]] = {}

    def start(self, identity: str = "a", **kw: Any) -> ComputeDomainController:
        kw.setdefault("request_timeout", 2.0)
        kw.setdefault("backoff_cap", 0.2)
        kw.setdefault("lease_duration", 2.0)
        kw.setdefault("renew_deadline", 1.0)
        kw.setdefault("retry_period", 0.2)
        ctl = ComputeDomainController(self.api_client, settings=SETTINGS, identity=identity, **kw)
        self.tasks[ctl] = asyncio.create_task(ctl.run())
        return ctl

    async def stop(self, ctl: ComputeDomainController | None = None) -> None:
        for one in [ctl] if ctl is not None else list(self.tasks):
            task = self.tasks.pop(one)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def running(api_client: Any, apiserver: LocalApiServer) -> AsyncIterator[Running]:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}}
    )
    ctl = Running(api_client)
    try:
        yield ctl
    finally:
        await ctl.stop()


async def settled(ctl: ComputeDomainController, check: Any = lambda: True) -> None:
    await asyncio.wait_for(ctl.settled(check), TIMEOUT)


def writes(server: LocalApiServer) -> list[tuple[str, str, str | None]]:
    return [
        (r.verb, r.resource.rpartition("/")[2] if "status" not in r.resource else "status", r.name)
        for r in server.requests.writes()
        if any(r.resource.split("/")[-1] == o or r.resource.endswith(o + "/status") for o in OURS)
    ]


def state(server: LocalApiServer) -> dict[str, list[tuple[str, str, Any, Any]]]:
    """Every object the controller makes or touches, without what differs between runs."""
    out = {}
    for resource in OURS:
        out[resource] = sorted(
            (
                o["metadata"].get("namespace", ""),
                o["metadata"]["name"],
                o["metadata"].get("labels"),
                o["metadata"].get("finalizers"),
            )
            for o in server.objects(resource)
        )
    return out


def one(server: LocalApiServer, resource: str, name: str | None = None) -> Obj:
    found = [o for o in server.objects(resource) if name in (None, o["metadata"]["name"])]
    assert len(found) == 1, found
    return found[0]


def created(server: LocalApiServer, **kw: Any) -> str:
    [cd] = server.seed(domain(**kw))
    return str(cd["metadata"]["uid"])


async def test_a_domain_gets_nvidias_objects_in_five_writes_and_none_at_rest(
    apiserver: LocalApiServer, running: Running
) -> None:
    ctl = running.start()
    uid = created(apiserver, num_nodes=0)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    cd = one(apiserver, "computedomains")
    assert cd["metadata"]["finalizers"] == [names.FINALIZER]
    assert cd["status"] == {"status": "Ready"}  # numNodes 0 and no daemons: NVIDIA's rule
    ds = one(apiserver, "daemonsets")
    assert ds["metadata"]["name"] == f"computedomain-daemon-{uid}"
    assert ds["metadata"]["namespace"] == DRIVER_NAMESPACE
    assert sorted(
        (
            t["metadata"]["namespace"],
            t["metadata"]["name"],
            t["metadata"]["labels"][names.TARGET_LABEL],
        )
        for t in apiserver.objects("resourceclaimtemplates")
    ) == [
        ("default", "cd1-channel", "Workload"),
        (DRIVER_NAMESPACE, ds["metadata"]["name"], "Daemon"),
    ]
    # The status before the workload template, whose create may fail for good.
    assert [w[0] for w in writes(apiserver)] == ["patch", "create", "create", "patch", "create"]
    # At rest: a change that concerns no plan, and every watch broken and resumed, send nothing
    # to our objects (the Lease's renewals are the leader's, on a timer, and not counted).
    before = writes(apiserver)
    apiserver.seed(daemon_pod(uid, "elsewhere", clique="", ip=""))  # no IP yet: not listed
    await settled(ctl)
    apiserver.faults.drop_watches()
    await asyncio.wait_for(apiserver.wait_for_watches(6), TIMEOUT)
    apiserver.compact()  # and the next reconnect must list again (410)
    apiserver.faults.drop_watches()
    await asyncio.wait_for(apiserver.wait_for_watches(6), TIMEOUT)
    await settled(ctl)
    assert writes(apiserver) == before


async def test_status_follows_the_daemons(apiserver: LocalApiServer, running: Running) -> None:
    ctl = running.start()
    uid = created(apiserver, num_nodes=2)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    assert one(apiserver, "computedomains")["status"] == {"status": "NotReady"}
    ds = one(apiserver, "daemonsets")
    pods = apiserver.seed(
        daemon_pod(uid, "gb-1", ip="10.0.0.1", owner=ds),
        daemon_pod(uid, "gb-2", ip="10.0.0.2", owner=ds),
    )
    entries = [daemon("gb-1", "10.0.0.1", 0), daemon("gb-2", "10.0.0.2", 1, ready=False)]
    [cq] = apiserver.seed(clique(uid, "c1.0", entries, owners=tuple(pods)))

    def status() -> Any:
        return (one(apiserver, "computedomains").get("status") or {}).get("status")

    def nodes() -> list[str]:
        found = one(apiserver, "computedomains").get("status", {}).get("nodes") or []
        return [f"{n['name']}={n['status']}" for n in found]

    await settled(ctl, lambda: len(nodes()) == 2)
    assert (status(), nodes()) == ("NotReady", ["gb-1=Ready", "gb-2=NotReady"])
    before = len(writes(apiserver))
    cq["daemons"][1]["status"] = "Ready"
    apiserver.put(cq)
    await settled(ctl, lambda: status() == "Ready")
    assert writes(apiserver)[before:] == [("patch", "status", "cd1")]  # one write per change
    # A daemon dies without removing its entry: its pod is gone, so the controller removes it.
    apiserver.delete("pods", pods[1]["metadata"]["name"], DRIVER_NAMESPACE)
    await settled(ctl, lambda: nodes() == ["gb-1=Ready"])
    assert status() == "NotReady"
    assert [d["nodeName"] for d in one(apiserver, "computedomaincliques")["daemons"]] == ["gb-1"]


async def test_deletion_leaves_nothing_and_keeps_other_domains_labels(
    apiserver: LocalApiServer, running: Running
) -> None:
    ctl = running.start()
    other = created(apiserver, name="other", template="other")
    uid = created(apiserver, num_nodes=1)
    await settled(ctl, lambda: len(apiserver.objects("daemonsets")) == 2)
    ds = one(apiserver, "daemonsets", f"computedomain-daemon-{uid}")
    [pod] = apiserver.seed(daemon_pod(uid, "gb-1", ip="10.0.0.1", owner=ds))
    apiserver.seed(
        clique(uid, "c1.0", [daemon("gb-1", "10.0.0.1", 0)], owners=(pod,)),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gb-1", "labels": {LABEL: uid}}},
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gb-2", "labels": {LABEL: other}},
        },
    )
    await settled(
        ctl,
        lambda: (
            (one(apiserver, "computedomains", "cd1").get("status") or {}).get("status") == "Ready"
        ),
    )
    apiserver.delete("computedomains", "cd1", "default")
    await settled(ctl, lambda: len(apiserver.objects("computedomains")) == 1)
    left = [o for r in OURS for o in apiserver.objects(r) if uid in str(o["metadata"])]
    assert left == []
    assert apiserver.objects("pods", DRIVER_NAMESPACE) == []
    labels = {
        n["metadata"]["name"]: n["metadata"].get("labels") for n in apiserver.objects("nodes")
    }
    assert labels == {"gb-1": {}, "gb-2": {LABEL: other}}


async def test_a_tenants_labelled_template_neither_blocks_nor_is_deleted(
    apiserver: LocalApiServer, running: Running
) -> None:
    """A ResourceClaimTemplate in another namespace, labelled with the domain's UID and held by
    its own finalizer (issue #38): only the domain's namespace and the driver's count, so the
    domain is deleted as ever and the tenant's object is left alone, in both roles."""
    ctl = running.start()
    apiserver.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    uid = created(apiserver)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    for target in (names.TARGET_WORKLOAD, names.TARGET_DAEMON):
        apiserver.seed(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {
                    "name": f"decoy-{target.lower()}",
                    "namespace": "team-b",
                    "labels": {LABEL: uid, names.TARGET_LABEL: target},
                    "finalizers": ["example.com/hold"],
                },
                "spec": {"spec": {"devices": {"requests": []}}},
            }
        )
    await settled(ctl)
    apiserver.delete("computedomains", "cd1", "default")
    await settled(ctl, lambda: not apiserver.objects("computedomains"))
    assert apiserver.objects("daemonsets") == []
    decoys = apiserver.objects("resourceclaimtemplates", "team-b")
    assert sorted(d["metadata"]["name"] for d in decoys) == ["decoy-daemon", "decoy-workload"]
    assert not any(d["metadata"].get("deletionTimestamp") for d in decoys)
    assert [o["metadata"]["namespace"] for o in apiserver.objects("resourceclaimtemplates")] == [
        "team-b",
        "team-b",
    ]


def _channel_condition(server: LocalApiServer) -> Any:
    conditions = (one(server, "computedomains", "cd1").get("status") or {}).get("conditions")
    return conditions[0] if conditions else None


async def test_a_channel_template_that_cannot_be_made_is_reported_in_status(
    apiserver: LocalApiServer, running: Running
) -> None:
    """Its name taken by a template not the domain's (409), or refused by the server (422):
    the status says so, NotReady, though the create keeps failing (issue #38)."""
    apiserver.seed(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "taken", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": []}}},
        }
    )
    ctl = running.start()
    created(apiserver, num_nodes=0, template="taken")
    # Not settled(): the failing create stays marked for its retry.
    await wait_for(lambda: _channel_condition(apiserver) is not None, "the condition", TIMEOUT)
    cd = one(apiserver, "computedomains", "cd1")
    assert cd["status"]["status"] == names.NOT_READY  # Ready but for its channel
    condition = _channel_condition(apiserver)
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "ChannelTemplate",
        "False",
        "NameTaken",
    )
    assert (
        "ResourceClaimTemplate default/taken exists and is not this domain's"
        in (condition["message"])
    )
    # The template goes: the domain's own is made, and the condition leaves the status.
    apiserver.delete("resourceclaimtemplates", "taken", "default")
    await settled(ctl, lambda: _channel_condition(apiserver) is None)
    assert one(apiserver, "computedomains", "cd1")["status"] == {"status": names.READY}


async def test_a_channel_template_the_server_refuses_is_reported_in_status(
    apiserver: LocalApiServer, running: Running
) -> None:
    [cd] = apiserver.seed(domain(num_nodes=0))
    # The daemon template made already, so that the one create refused is the channel's.
    apiserver.seed(objects.daemon_template(cd, SETTINGS))
    apiserver.faults.fail("create", "resource.k8s.io/resourceclaimtemplates", code=422, times=-1)
    running.start()
    await wait_for(lambda: _channel_condition(apiserver) is not None, "the condition", TIMEOUT)
    condition = _channel_condition(apiserver)
    assert condition["reason"] == "Rejected"
    assert "the API server refused ResourceClaimTemplate" in condition["message"]


async def test_a_release_answered_after_its_deleted_event_leaves_no_ghost(
    apiserver: LocalApiServer, running: Running
) -> None:
    """A real server's watch may bring a template's DELETED event before the answer to the
    patch that removed its last finalizer. That answer must not put the template back into
    the cache: no event would ever remove it, and the domain's teardown would wait on it."""
    ctl = running.start()
    uid = created(apiserver)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    apiserver.faults.drop_response(
        "patch", "resource.k8s.io/resourceclaimtemplates", times=-1, mode="late"
    )
    apiserver.delete("computedomains", "cd1", "default")
    await settled(ctl, lambda: not apiserver.objects("computedomains"))
    assert [o for r in OURS for o in apiserver.objects(r) if uid in str(o["metadata"])] == []
    assert ctl.domains_by_status() == {"Ready": 0, "NotReady": 0}  # no ghost domain either


async def test_a_create_whose_answer_is_lost_is_not_made_twice(
    apiserver: LocalApiServer, running: Running
) -> None:
    apiserver.faults.drop_response("create", "apps/daemonsets")
    ctl = running.start()
    created(apiserver)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    assert len(apiserver.objects("daemonsets")) == 1
    assert ctl.stats.failures  # the lost answer, and perhaps the 409 of the retry


async def test_two_replicas_one_leads_the_other_takes_over(
    apiserver: LocalApiServer, running: Running
) -> None:
    first = running.start("first")
    await asyncio.wait_for(first.synced.wait(), TIMEOUT)
    second = running.start("second")
    created(apiserver)
    await settled(first, lambda: apiserver.objects("daemonsets"))
    assert not second.leading and second.election is not None
    await running.stop(first)  # a clean stop releases the Lease: no wait for its expiry
    await asyncio.wait_for(second.synced.wait(), TIMEOUT)
    await settled(second)
    # The status before the workload template, whose create may fail for good.
    assert [w[0] for w in writes(apiserver)] == ["patch", "create", "create", "patch", "create"]
    apiserver.delete("computedomains", "cd1", "default")
    await settled(second, lambda: not apiserver.objects("computedomains"))


async def test_a_leader_that_cannot_renew_stands_down(
    apiserver: LocalApiServer, running: Running
) -> None:
    ctl = running.start("only")
    await asyncio.wait_for(ctl.synced.wait(), TIMEOUT)
    apiserver.faults.fail("update", "leases", code=500, times=-1)
    assert ctl.election is not None
    # The renew deadline passes with every renewal failing.
    await asyncio.wait_for(ctl.election.lost.wait(), TIMEOUT)
    assert not ctl.leading and not ctl.synced.is_set()
    apiserver.faults.clear()
    await asyncio.wait_for(ctl.synced.wait(), TIMEOUT)
    assert ctl.election.transitions == 2


async def test_a_leader_whose_renewal_is_held_back_stands_down_before_another_may_lead(
    apiserver: LocalApiServer, running: Running
) -> None:
    # A patient client (10 s per request): only the election's own bound can stop the leader
    # in time. Before it, the held renewal kept "a" at work for the 3 s, "b" leading from ~2 s.
    first = running.start("a", request_timeout=10.0)
    await asyncio.wait_for(first.synced.wait(), TIMEOUT)
    second = running.start("b", request_timeout=10.0)
    a, b = first.election, second.election
    assert a is not None and b is not None
    apiserver.faults.delay("update", "leases", seconds=3.0, times=1)
    # Who leads, sampled until "a" stands down and then for as long as the held renewal and
    # a takeover by "b" can take: an observer, not a wait for state.
    leaders: set[tuple[bool, bool]] = set()
    loop = asyncio.get_running_loop()

    async def sample(until: Any) -> None:
        while not until():
            leaders.add((a.leading, b.leading))
            await asyncio.sleep(0.005)

    stood_down = lambda: a.lost.is_set() or a.transitions >= 2 or b.leading  # noqa: E731
    await asyncio.wait_for(sample(stood_down), TIMEOUT)
    end = loop.time() + 3.0
    await sample(lambda: loop.time() > end)
    assert (True, True) not in leaders, "two leaders at once"


async def test_metrics_count_domains_by_status(apiserver: LocalApiServer, running: Running) -> None:
    ctl = running.start()
    created(apiserver, name="ready", num_nodes=0, template="a")
    created(apiserver, name="waiting", num_nodes=3, template="b")
    await settled(ctl, lambda: len(apiserver.objects("daemonsets")) == 2)
    metrics = ControllerMetrics(
        domains=ctl.domains_by_status, leading=lambda: ctl.leading, writes=lambda: ctl.stats.writes
    )
    text = metrics.render().decode()
    assert 'nvidia_dra_compute_domain_info{status="Ready"} 1.0' in text
    assert 'nvidia_dra_compute_domain_info{status="NotReady"} 1.0' in text
    assert "gpu_dra_compute_domain_controller_leader 1.0" in text
    assert 'gpu_dra_compute_domain_writes_total{verb="create"} 6.0' in text


# -- SIGKILL between two writes ----------------------------------------------------------------


def controller_process(kubeconfig: Path, crash_after: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GPU_DRA_CRASHPOINT": f"computedomain-write-{crash_after}",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "compute-domain-controller",
            f"--kubeconfig={kubeconfig}",
            f"--driver-namespace={DRIVER_NAMESPACE}",
            f"--image={SETTINGS.image}",
            "--leader-elect=false",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def killed(proc: subprocess.Popen[bytes]) -> None:
    code = await asyncio.wait_for(asyncio.to_thread(proc.wait), 60)
    assert code == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else code


@pytest.fixture
def kubeconfig(apiserver: LocalApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.mark.parametrize("crash_after", range(1, 5))
async def test_killed_between_creation_writes_converges_without_a_second_write(
    apiserver: LocalApiServer, running: Running, kubeconfig: Path, crash_after: int
) -> None:
    created(apiserver, num_nodes=0)
    await killed(controller_process(kubeconfig, crash_after))
    assert len(writes(apiserver)) == crash_after
    ctl = running.start()
    await settled(ctl, lambda: (one(apiserver, "computedomains").get("status") or {}).get("status"))
    assert len(writes(apiserver)) == 5  # each write once, by one process or the other
    assert len(apiserver.objects("daemonsets")) == 1
    assert len(apiserver.objects("resourceclaimtemplates")) == 2


@pytest.mark.parametrize("crash_after", range(1, 8))
async def test_killed_between_deletion_writes_converges_and_leaves_nothing(
    apiserver: LocalApiServer, running: Running, kubeconfig: Path, crash_after: int
) -> None:
    ctl = running.start()
    uid = created(apiserver, num_nodes=0)
    await settled(ctl, lambda: apiserver.objects("daemonsets"))
    apiserver.seed(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {LABEL: uid}}}
    )
    await settled(ctl)
    await running.stop(ctl)
    apiserver.delete("computedomains", "cd1", "default")
    before = len(writes(apiserver))
    await killed(controller_process(kubeconfig, crash_after))
    assert len(writes(apiserver)) == before + crash_after
    ctl = running.start()
    await settled(ctl, lambda: not apiserver.objects("computedomains"))
    assert state(apiserver) == {
        "computedomains": [],
        "daemonsets": [],
        "resourceclaimtemplates": [],
        "computedomaincliques": [],
        "nodes": [("", "n1", {}, None)],
    }
    assert len(writes(apiserver)) == before + 8  # each step once
