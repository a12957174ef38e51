"""The ComputeDomain controller's pure plan: NVIDIA's objects, status rules and deletion order,
and convergence: applied to a small in-memory cluster, every plan reaches a state that plans
nothing, from any prefix of its writes (a controller killed between two of them)."""

import copy
import dataclasses
import itertools
from typing import Any

import pytest

from cluster.computedomain import objects, status
from cluster.computedomain.plan import Observed, Write, covers, plan
from driver.common.wire import Obj
from drivers.computedomain import names
from tests.computedomains import (
    DRIVER_NAMESPACE,
    SETTINGS,
    clique,
    daemon,
    daemon_pod,
    domain,
    new_uid,
)

LABEL = names.COMPUTE_DOMAIN_LABEL


class Cluster:
    """Just enough of an API server for plans: versions, merge patches with a version check,
    finalizers that hold a delete, and Background deletion of a DaemonSet's pods."""

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.writes: list[Write] = []
        self.stuck_pods = False  # a DaemonSet's pods stay when it goes (their node is down)

    def add(self, resource: str, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", new_uid())
        meta.setdefault("namespace", "")
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[(resource, meta["namespace"], meta["name"])] = obj
        return obj

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((resource, namespace, name))

    def of(self, resource: str, uid: str) -> tuple[Obj, ...]:
        return tuple(
            o
            for (r, _, _), o in sorted(self.objects.items())
            if r == resource and (o["metadata"].get("labels") or {}).get(LABEL) == uid
        )

    def observed(self, uid: str) -> Observed:
        domains = [
            o
            for (r, _, _), o in self.objects.items()
            if r == "computedomains" and o["metadata"]["uid"] == uid
        ]
        return Observed(
            domain=domains[0] if domains else None,
            daemon_sets=self.of("daemonsets", uid),
            templates=self.of("resourceclaimtemplates", uid),
            pods=self.of("pods", uid),
            cliques=self.of("computedomaincliques", uid),
            nodes=self.of("nodes", uid),
            pods_seen=self.rv,
        )

    def apply(self, write: Write) -> None:
        self.writes.append(write)
        resource = write.resource.partition("/")[0]
        key = (resource, write.namespace, write.name)
        if write.verb == "create":
            assert key not in self.objects, f"create of an existing {key}"
            assert write.body is not None
            self.add(resource, write.body)
            return
        current = self.objects[key]
        if write.verb == "delete":
            assert write.preconditions == {
                "uid": current["metadata"]["uid"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            }
            if current["metadata"].get("finalizers"):
                current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                self.rv += 1
                current["metadata"]["resourceVersion"] = str(self.rv)
            else:
                self._remove(key)
            return
        assert write.verb == "patch" and write.body is not None
        body = copy.deepcopy(write.body)
        if write.resource.endswith("/status"):
            assert set(body) == {"status"}
        else:
            assert body["metadata"].pop("resourceVersion") == current["metadata"]["resourceVersion"]
        merged = _merge(current, body)
        self.rv += 1
        merged["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = merged
        if merged["metadata"].get("deletionTimestamp") and not merged["metadata"].get("finalizers"):
            self._remove(key)

    def _remove(self, key: tuple[str, str, str]) -> None:
        gone = self.objects.pop(key)
        if (
            key[0] == "daemonsets" and not self.stuck_pods
        ):  # Background propagation: its pods go, then their cliques
            uid = gone["metadata"]["labels"][LABEL]
            for pod in self.of("pods", uid):
                self.objects.pop(("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]))

    def converge(self, uid: str, *, limit: int = 30) -> int:
        """Plan and apply until the plan is empty; the writes it took."""
        for count in itertools.count():
            writes = plan(uid, self.observed(uid), SETTINGS)
            if not writes:
                return count
            assert count < limit, f"no convergence: {writes}"
            for write in writes:
                self.apply(write)
        raise AssertionError("unreachable")


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def created(cluster: Cluster, **kw: Any) -> str:
    return str(cluster.add("computedomains", domain(**kw))["metadata"]["uid"])


def daemon_set_of(cluster: Cluster, uid: str) -> Obj:
    """The domain's DaemonSet, made: its pods are what a node counts by."""
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    return ds


def total(cluster: Cluster) -> int:
    return len(cluster.writes)


# -- the objects -----------------------------------------------------------------------------


def test_a_new_domain_gets_its_finalizer_then_nvidias_objects_with_its_status_before_its_channel(
    cluster: Cluster,
) -> None:
    """The status before the workload template: a create of it that fails for good (its name
    taken, or refused) must not keep the user from seeing the status that says so."""
    uid = created(cluster, num_nodes=2)
    writes = plan(uid, cluster.observed(uid), SETTINGS)
    assert [(w.verb, w.resource) for w in writes] == [
        ("patch", "computedomains"),
        ("create", "resourceclaimtemplates"),
        ("create", "daemonsets"),
        ("patch", "computedomains/status"),
        ("create", "resourceclaimtemplates"),
    ]
    assert writes[0].body == {
        "metadata": {"finalizers": [names.FINALIZER], "resourceVersion": "101"}
    }
    assert writes[3].body == {"status": {"status": "NotReady"}}


def test_a_channel_problem_is_a_condition_until_the_template_is_there(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=0)
    cluster.converge(uid)
    problem = ("NameTaken", "ResourceClaimTemplate default/cd1-channel exists ...")
    observed = cluster.observed(uid)
    # The template is in the view: the problem was a view behind the server, nothing to say.
    fine = dataclasses.replace(observed, channel_problem=problem)
    assert plan(uid, fine, SETTINGS) == ()
    workload = ("resourceclaimtemplates", "default", "cd1-channel")
    del cluster.objects[workload]
    observed = dataclasses.replace(cluster.observed(uid), channel_problem=problem)
    status_write, create = plan(uid, observed, SETTINGS)
    assert status_write.body == {
        "status": {
            "status": "NotReady",
            "conditions": [
                {"type": "ChannelTemplate", "status": "False", "reason": problem[0],
                 "message": problem[1]}
            ],
        }
    }  # fmt: skip
    assert (create.verb, create.name) == ("create", "cd1-channel")


def test_the_daemon_template_is_nvidias() -> None:
    cd = domain(uid="u-1")
    assert objects.daemon_template(cd, SETTINGS) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "computedomain-daemon-u-1",
            "namespace": DRIVER_NAMESPACE,
            "labels": {LABEL: "u-1", names.TARGET_LABEL: "Daemon"},
            "finalizers": [names.FINALIZER],
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "daemon",
                            "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"},
                        }
                    ],
                    "config": [
                        {
                            "requests": ["daemon"],
                            "opaque": {
                                "driver": "compute-domain.nvidia.com",
                                "parameters": {
                                    "apiVersion": "resource.nvidia.com/v1beta1",
                                    "kind": "ComputeDomainDaemonConfig",
                                    "domainID": "u-1",
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


@pytest.mark.parametrize(
    ("mode", "expected"), [(None, "Single"), ("Single", "Single"), ("All", "All")]
)
def test_the_workload_template_is_nvidias_in_the_domains_namespace(
    mode: str | None, expected: str
) -> None:
    cd = domain(uid="u-1", namespace="team-a", template="imex-channel-0", mode=mode)
    template = objects.workload_template(cd)
    assert template["metadata"] == {
        "name": "imex-channel-0",
        "namespace": "team-a",
        "labels": {LABEL: "u-1", names.TARGET_LABEL: "Workload"},
        "finalizers": [names.FINALIZER],
    }
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"},
        }
    ]
    assert devices["config"][0]["opaque"] == {
        "driver": "compute-domain.nvidia.com",
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig",
            "domainID": "u-1",
            "allocationMode": expected,
        },
    }


def test_the_daemonset_is_nvidias_shape_running_our_daemon() -> None:
    ds = objects.daemon_set(domain(uid="u-1"), SETTINGS)
    assert ds["metadata"] == {
        "name": "computedomain-daemon-u-1",
        "namespace": DRIVER_NAMESPACE,
        "labels": {LABEL: "u-1"},
        "finalizers": [names.FINALIZER],
    }
    assert "ownerReferences" not in ds["metadata"]  # NVIDIA sets none; cross-namespace anyway
    spec = ds["spec"]
    assert spec["selector"] == {"matchLabels": {LABEL: "u-1"}}
    assert spec["template"]["metadata"] == {"labels": {LABEL: "u-1"}}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "compute-domain-daemon-service-account"
    assert pod["nodeSelector"] == {LABEL: "u-1"}
    assert pod["resourceClaims"] == [
        {"name": "compute-domain-daemon", "resourceClaimTemplateName": "computedomain-daemon-u-1"}
    ]
    assert pod["tolerations"] == [
        {"operator": "Exists", "effect": e} for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")
    ]
    assert "imagePullSecrets" not in pod
    [container] = pod["containers"]
    assert container["name"] == "compute-domain-daemon"
    assert container["image"] == SETTINGS.image
    assert container["command"] == ["gpu-dra", "compute-domain-daemon", "run"]
    assert container["resources"] == {"claims": [{"name": "compute-domain-daemon"}]}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["MAX_NODES_PER_IMEX_DOMAIN"] == "18"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {"POD_UID", "POD_NAME", "POD_NAMESPACE", "GPU_DRA_LOG_LEVEL"} <= env.keys()
    probes = {p: container[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    for probe in probes.values():
        assert probe["exec"] == {"command": ["gpu-dra", "compute-domain-daemon", "check"]}
    assert [(p["periodSeconds"], p["failureThreshold"]) for p in probes.values()] == [
        (1, 1200),
        (60, 20),
        (10, 1),
    ]


def test_pull_settings_reach_the_daemonset() -> None:
    settings = objects.DaemonSettings(
        namespace="x",
        image="i",
        image_pull_policy="Never",
        image_pull_secrets=("a", "b"),
        max_nodes=9,
    )
    pod = objects.daemon_set(domain(uid="u"), settings)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": "9"} in pod["containers"][0]["env"]


# -- at rest ----------------------------------------------------------------------------------


def test_a_converged_domain_plans_nothing(cluster: Cluster) -> None:
    uid = created(cluster)
    assert cluster.converge(uid) == 1  # one plan of five writes, then an empty one
    assert total(cluster) == 5
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()


def test_server_defaults_are_not_drift(cluster: Cluster) -> None:
    uid = created(cluster)
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    ds["spec"]["revisionHistoryLimit"] = 10
    ds["spec"]["updateStrategy"] = {"type": "RollingUpdate"}
    pod = ds["spec"]["template"]["spec"]
    pod["dnsPolicy"] = "ClusterFirst"
    container = pod["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    container["env"][3]["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    container["startupProbe"]["successThreshold"] = 1
    [template, _] = cluster.of("resourceclaimtemplates", uid)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
        allocationMode="ExactCount", count=1
    )
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()


def test_covers() -> None:
    assert covers({"a": 1, "b": 2}, {"a": 1})
    assert not covers({"a": 1}, {"a": 2})
    assert covers({}, {"a": 0, "b": "", "c": [], "d": {}})
    assert not covers([1, 2], [1])
    assert covers([{"x": 1, "y": 2}], [{"x": 1}])
    assert not covers(None, {"a": 1})
    assert not covers("1", 1)


# -- drift and someone else's hand ---------------------------------------------------------------


def test_a_drifted_daemonset_spec_is_patched_back(cluster: Cluster) -> None:
    uid = created(cluster)
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:2"
    writes = plan(uid, cluster.observed(uid), SETTINGS)
    assert [(w.verb, w.resource) for w in writes] == [("patch", "daemonsets")]
    assert writes[0].body is not None
    assert writes[0].body["metadata"] == {"resourceVersion": ds["metadata"]["resourceVersion"]}
    assert writes[0].body["spec"]["template"]["spec"]["containers"][0]["image"] == SETTINGS.image
    cluster.apply(writes[0])
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()


def test_a_changed_selector_is_immutable_so_the_daemonset_is_made_again(cluster: Cluster) -> None:
    uid = created(cluster)
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    ds["spec"]["selector"] = {"matchLabels": {LABEL: uid, "extra": "1"}}
    before = total(cluster)
    cluster.converge(uid)
    verbs = [(w.verb, w.resource) for w in cluster.writes[before:]]
    assert verbs == [("delete", "daemonsets"), ("patch", "daemonsets"), ("create", "daemonsets")]
    [ds] = cluster.of("daemonsets", uid)
    assert ds["spec"]["selector"] == {"matchLabels": {LABEL: uid}}


def test_lost_labels_and_finalizers_are_restored(cluster: Cluster) -> None:
    uid = created(cluster)
    cluster.converge(uid)
    workload = cluster.get("resourceclaimtemplates", "default", "cd1-channel")
    assert workload is not None
    workload["metadata"]["labels"][names.TARGET_LABEL] = "Other"
    workload["metadata"]["finalizers"] = ["someone.else/hold"]
    writes = plan(uid, cluster.observed(uid), SETTINGS)
    # Any target but Daemon is the workload's template (as at deletion): restored in place.
    assert [(w.verb, w.name) for w in writes] == [("patch", "cd1-channel")]
    assert writes[0].body is not None
    assert writes[0].body["metadata"]["finalizers"] == ["someone.else/hold", names.FINALIZER]
    assert writes[0].body["metadata"]["labels"][names.TARGET_LABEL] == "Workload"


def test_an_object_someone_deletes_is_let_go_and_made_again(cluster: Cluster) -> None:
    uid = created(cluster)
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    old = ds["metadata"]["uid"]
    ds["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    before = total(cluster)
    cluster.converge(uid)
    assert [(w.verb, w.resource) for w in cluster.writes[before:]] == [
        ("patch", "daemonsets"),
        ("create", "daemonsets"),
    ]
    [ds] = cluster.of("daemonsets", uid)
    assert ds["metadata"]["uid"] != old


def test_a_domain_without_a_template_name_gets_no_workload_template(cluster: Cluster) -> None:
    uid = created(cluster, template="")
    cluster.converge(uid)
    assert [t["metadata"]["name"] for t in cluster.of("resourceclaimtemplates", uid)] == [
        f"computedomain-daemon-{uid}"
    ]


def test_the_domains_own_other_finalizers_are_kept(cluster: Cluster) -> None:
    uid = created(cluster, finalizers=["someone.else/hold"])
    cluster.converge(uid)
    cd = cluster.observed(uid).domain
    assert cd is not None
    assert cd["metadata"]["finalizers"] == ["someone.else/hold", names.FINALIZER]


# -- status -----------------------------------------------------------------------------------


def status_of(cluster: Cluster, uid: str) -> Obj:
    cd = cluster.observed(uid).domain
    assert cd is not None
    return dict(cd.get("status") or {})


@pytest.mark.parametrize(
    ("num_nodes", "ready", "expected"),
    [
        (2, [True, True], "Ready"),
        (2, [True, False], "NotReady"),
        (2, [True], "NotReady"),
        (1, [True, True], "Ready"),
        (0, [], "Ready"),
        (None, [], "Ready"),
        (0, [False], "NotReady"),
        (0, [True, True], "Ready"),
    ],
)
def test_overall_status_is_nvidias_rule(
    cluster: Cluster, num_nodes: int | None, ready: list[bool], expected: str
) -> None:
    uid = created(cluster, num_nodes=num_nodes)
    nodes = [f"node-{i}" for i in range(len(ready))]
    for node in nodes:
        cluster.add("pods", daemon_pod(uid, node))
    if ready:
        cluster.add(
            "computedomaincliques",
            clique(
                uid,
                "c1.0",
                [
                    daemon(n, f"10.0.0.{i}", i, ready=r)
                    for i, (n, r) in enumerate(zip(nodes, ready, strict=True))
                ],
            ),
        )
    cluster.converge(uid)
    assert status_of(cluster, uid)["status"] == expected


def test_nodes_come_from_cliques_and_from_pods_without_a_clique(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=3)
    ds = daemon_set_of(cluster, uid)
    cluster.add("pods", daemon_pod(uid, "gb-1", owner=ds))
    cluster.add("pods", daemon_pod(uid, "gb-2", clique="c2.7", owner=ds))
    cluster.add("pods", daemon_pod(uid, "plain", clique="", ip="10.1.0.9", ready=False, owner=ds))
    cluster.add("pods", daemon_pod(uid, "plain-no-ip", clique="", owner=ds))
    cluster.add("computedomaincliques", clique(uid, "c1.0", [daemon("gb-1", "10.0.0.1", 0)]))
    cluster.add(
        "computedomaincliques",
        clique(uid, "c2.7", [daemon("gb-2", "10.0.0.2", 0, clique_id="c2.7")]),
    )
    cluster.converge(uid)
    found = status_of(cluster, uid)
    assert found == {
        "status": "NotReady",
        "nodes": [
            {
                "name": "gb-1",
                "ipAddress": "10.0.0.1",
                "cliqueID": "c1.0",
                "index": 0,
                "status": "Ready",
            },
            {
                "name": "gb-2",
                "ipAddress": "10.0.0.2",
                "cliqueID": "c2.7",
                "index": 0,
                "status": "Ready",
            },
            {
                "name": "plain",
                "ipAddress": "10.1.0.9",
                "cliqueID": "",
                "index": -1,
                "status": "NotReady",
            },
        ],
    }


def test_a_status_change_is_one_write_and_the_same_status_none(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=1)
    ds = daemon_set_of(cluster, uid)
    pod = cluster.add(
        "pods", daemon_pod(uid, "n1", clique="", ip="10.0.0.1", ready=False, owner=ds)
    )
    cluster.converge(uid)
    assert status_of(cluster, uid)["status"] == "NotReady"
    before = total(cluster)
    pod["status"]["conditions"][0]["status"] = "True"
    cluster.converge(uid)
    assert [w.resource for w in cluster.writes[before:]] == ["computedomains/status"]
    assert status_of(cluster, uid)["status"] == "Ready"
    pod["metadata"]["annotations"] = {"unrelated": "change"}
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()


def test_nodes_leaving_clear_the_list(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=0)
    ds = daemon_set_of(cluster, uid)
    pod = cluster.add("pods", daemon_pod(uid, "n1", clique="", ip="10.0.0.1", owner=ds))
    cluster.converge(uid)
    assert len(status_of(cluster, uid)["nodes"]) == 1
    del cluster.objects[("pods", DRIVER_NAMESPACE, pod["metadata"]["name"])]
    writes = plan(uid, cluster.observed(uid), SETTINGS)
    assert [w.body for w in writes] == [{"status": {"status": "Ready", "nodes": None}}]


def test_a_pod_counts_only_when_the_domains_daemon_set_controls_it(cluster: Cluster) -> None:
    """The domain's label is anyone's to set who may make a pod in the driver's namespace (a
    node's kubelet plugin may make its MPS daemon pods there): a Ready pod so labelled, of no
    DaemonSet, or of a DaemonSet of that name gone since, or owned without control, adds no
    node; the DaemonSet's own pod does."""
    uid = created(cluster, num_nodes=1)
    ds = daemon_set_of(cluster, uid)
    gone = copy.deepcopy(ds)
    gone["metadata"]["uid"] = new_uid()
    not_controlling = daemon_pod(uid, "not-controlling", clique="", ip="10.0.0.4", owner=ds)
    not_controlling["metadata"]["ownerReferences"][0]["controller"] = False
    for pod in (
        daemon_pod(uid, "squatter", clique="", ip="10.0.0.2"),
        daemon_pod(uid, "old", clique="", ip="10.0.0.3", owner=gone),
        not_controlling,
    ):
        cluster.add("pods", pod)
    cluster.converge(uid)
    assert status_of(cluster, uid) == {"status": "NotReady"}
    cluster.add("pods", daemon_pod(uid, "n1", clique="", ip="10.0.0.1", owner=ds))
    cluster.converge(uid)
    assert [(n["name"], n["status"]) for n in status_of(cluster, uid)["nodes"]] == [("n1", "Ready")]
    assert status_of(cluster, uid)["status"] == "Ready"


def test_an_entry_without_status_counts_as_the_crds_default(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=1)
    cluster.add("pods", daemon_pod(uid, "n1"))
    entry = daemon("n1", "10.0.0.1", 0)
    del entry["status"]
    cluster.add("computedomaincliques", clique(uid, "c1.0", [entry]))
    cluster.converge(uid)
    assert status_of(cluster, uid)["nodes"][0]["status"] == "NotReady"
    assert status_of(cluster, uid)["status"] == "NotReady"


# -- cliques ----------------------------------------------------------------------------------


def test_entries_of_daemons_without_a_pod_are_removed(cluster: Cluster) -> None:
    uid = created(cluster, num_nodes=1)
    cluster.add("pods", daemon_pod(uid, "n1"))
    cluster.add(
        "computedomaincliques",
        clique(uid, "c1.0", [daemon("n1", "10.0.0.1", 0), daemon("dead", "10.0.0.2", 1)]),
    )
    cluster.converge(uid)
    [found] = cluster.of("computedomaincliques", uid)
    assert [d["nodeName"] for d in found["daemons"]] == ["n1"]
    assert [n["name"] for n in status_of(cluster, uid)["nodes"]] == ["n1"]


def test_entries_are_kept_while_the_pod_watch_is_behind_the_clique() -> None:
    uid = new_uid()
    fresh = clique(uid, "c1.0", [daemon("n1", "10.0.0.1", 0)])
    fresh["metadata"]["resourceVersion"] = "500"
    assert status.stale_daemons(fresh, [], pods_seen=499) == set()
    assert status.stale_daemons(fresh, [], pods_seen=500) == {"n1"}


# -- deletion ---------------------------------------------------------------------------------


def built(cluster: Cluster) -> str:
    uid = created(cluster, num_nodes=1)
    cluster.converge(uid)
    [ds] = cluster.of("daemonsets", uid)
    pod = cluster.add("pods", daemon_pod(uid, "n1", owner=ds))
    cluster.add(
        "computedomaincliques", clique(uid, "c1.0", [daemon("n1", "10.0.0.1", 0)], owners=(pod,))
    )
    cluster.add("nodes", {"metadata": {"name": "n1", "labels": {LABEL: uid}}})
    cluster.add("nodes", {"metadata": {"name": "n2", "labels": {LABEL: "another-domain"}}})
    cluster.converge(uid)
    return uid


def mark_deleted(cluster: Cluster, uid: str) -> None:
    cd = cluster.observed(uid).domain
    assert cd is not None
    cd["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"


def leftovers(cluster: Cluster, uid: str) -> list[tuple[str, str, str]]:
    return [
        k
        for k, o in cluster.objects.items()
        if (o["metadata"].get("labels") or {}).get(LABEL) == uid or o["metadata"]["uid"] == uid
    ]


def test_deletion_goes_in_nvidias_order_and_leaves_nothing(cluster: Cluster) -> None:
    uid = built(cluster)
    mark_deleted(cluster, uid)
    before = total(cluster)
    cluster.converge(uid)
    steps = [(w.verb, w.resource, w.why.split(" ")[0]) for w in cluster.writes[before:]]
    assert steps == [
        ("delete", "resourceclaimtemplates", "delete"),  # the workload template
        ("delete", "resourceclaimtemplates", "daemon"),  # the daemon template
        ("delete", "daemonsets", "daemon"),
        ("patch", "nodes", "remove"),
        ("patch", "resourceclaimtemplates", "release"),  # the workload template's finalizer
        ("patch", "resourceclaimtemplates", "release"),  # then the daemon objects'
        ("patch", "daemonsets", "release"),
        ("delete", "computedomaincliques", "clique"),  # its pods went with the DaemonSet
        ("patch", "computedomains", "release"),
    ]
    assert leftovers(cluster, uid) == []
    other = cluster.get("nodes", "", "n2")
    assert other is not None and other["metadata"]["labels"] == {LABEL: "another-domain"}


def test_a_node_label_of_another_domain_is_never_removed(cluster: Cluster) -> None:
    uid = built(cluster)
    mark_deleted(cluster, uid)
    writes = plan(uid, cluster.observed(uid), SETTINGS)
    assert [w.name for w in writes if w.resource == "nodes"] == ["n1"]


def test_the_domain_is_released_without_waiting_for_its_daemon_pods(cluster: Cluster) -> None:
    uid = built(cluster)
    mark_deleted(cluster, uid)
    # Pods that do not go (a node that is down): the domain is released all the same, and the
    # clique those pods own is left to the garbage collector.
    cluster.stuck_pods = True
    cluster.converge(uid)
    assert cluster.observed(uid).domain is None
    assert [k[0] for k in leftovers(cluster, uid)] == ["pods", "computedomaincliques"]


def test_objects_of_a_domain_that_is_gone_are_cleaned_up(cluster: Cluster) -> None:
    """All but the workload template, whose namespace the gone domain no longer tells (it
    may be a tenant's): it is let go once someone deletes it."""
    uid = built(cluster)
    del cluster.objects[("computedomains", "default", "cd1")]  # its finalizer removed by hand
    cluster.converge(uid)
    workload = ("resourceclaimtemplates", "default", "cd1-channel")
    assert leftovers(cluster, uid) == [workload]
    template = cluster.objects[workload]
    cluster.apply(
        Write(
            "delete",
            "resourceclaimtemplates",
            "default",
            "cd1-channel",
            "the user",
            preconditions={
                "uid": template["metadata"]["uid"],
                "resourceVersion": template["metadata"]["resourceVersion"],
            },
        )
    )
    cluster.converge(uid)
    assert leftovers(cluster, uid) == []


def test_templates_outside_the_domains_and_drivers_namespaces_count_for_nothing(
    cluster: Cluster,
) -> None:
    uid = built(cluster)
    for target in (names.TARGET_WORKLOAD, names.TARGET_DAEMON):
        decoy = {
            "metadata": {
                "name": f"decoy-{target}",
                "namespace": "team-b",
                "labels": {LABEL: uid, names.TARGET_LABEL: target},
                "finalizers": [names.FINALIZER, "example.com/hold"],
            }
        }
        cluster.add("resourceclaimtemplates", decoy)
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()  # no stray to delete
    mark_deleted(cluster, uid)
    cluster.converge(uid)
    assert cluster.observed(uid).domain is None
    assert {k[1] for k in leftovers(cluster, uid)} == {"team-b"}
    assert all(w.namespace != "team-b" for w in cluster.writes)


def test_deleting_a_domain_that_never_got_objects(cluster: Cluster) -> None:
    uid = created(cluster)
    mark_deleted(cluster, uid)
    assert plan(uid, cluster.observed(uid), SETTINGS) == ()  # no finalizer: the server removes it


# -- killed between writes ---------------------------------------------------------------------


@pytest.mark.parametrize("cut", range(6))
def test_creation_cut_after_any_write_converges_to_the_same_state(cut: int) -> None:
    reference = Cluster()
    ref_uid = created(reference, uid="u-1")
    reference.converge(ref_uid)

    cluster = Cluster()
    uid = created(cluster, uid="u-1")
    for write in plan(uid, cluster.observed(uid), SETTINGS)[:cut]:
        cluster.apply(write)
    cluster.converge(uid)  # a fresh controller: plans from what the server shows
    assert total(cluster) == total(reference)  # nothing written twice
    assert _shapes(cluster) == _shapes(reference)


@pytest.mark.parametrize("cut", range(10))
def test_deletion_cut_after_any_write_converges_and_leaves_nothing(cut: int) -> None:
    cluster = Cluster()
    uid = built(cluster)
    mark_deleted(cluster, uid)
    done = 0
    while done < cut:
        writes = plan(uid, cluster.observed(uid), SETTINGS)
        if not writes:
            break
        for write in writes[: cut - done]:
            cluster.apply(write)
        done += min(len(writes), cut - done)
    cluster.converge(uid)
    assert leftovers(cluster, uid) == []


def _shapes(cluster: Cluster) -> dict[tuple[str, str, str], Obj]:
    return {k: _shape(o) for k, o in cluster.objects.items()}


def _shape(obj: Obj) -> Obj:
    """An object without what differs between two runs."""
    out = copy.deepcopy(obj)
    for field in ("uid", "resourceVersion"):
        out["metadata"].pop(field, None)
    return out
