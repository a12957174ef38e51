"""A daemon's entry in its ComputeDomainClique (NVIDIA's clique manager), pure."""

import pytest

from cluster.imexdaemon.membership import (
    Member,
    NoIndexError,
    joined,
    left,
    new_clique,
    pod_ready,
)
from driver.common.wire import Obj
from drivers.computedomain import names

UID = "7c1e4d52-95c3-4f1f-a0a3-1f1d7a2b9e44"
CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.1"


def member(node: str = "node-a", ip: str = "10.0.0.1", pod_uid: str = "pod-a", **kw: int) -> Member:
    return Member(
        namespace="gpu-dra",
        domain_uid=UID,
        clique_id=CLIQUE,
        node_name=node,
        pod_name=f"daemon-{node}",
        pod_uid=pod_uid,
        pod_ip=ip,
        **kw,
    )


def entry(node: str, ip: str, index: int, status: str = names.NOT_READY) -> Obj:
    return {"nodeName": node, "ipAddress": ip, "cliqueID": CLIQUE, "index": index, "status": status}


def test_the_first_daemon_creates_the_clique_as_nvidia_names_and_labels_it() -> None:
    made = new_clique(member(), ready=False)
    assert made["metadata"] == {
        "name": f"{UID}.{CLIQUE}",
        "namespace": "gpu-dra",
        "labels": {names.COMPUTE_DOMAIN_LABEL: UID, names.CLIQUE_LABEL: CLIQUE},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "daemon-node-a", "uid": "pod-a"}
        ],
    }
    assert (made["apiVersion"], made["kind"]) == (
        "resource.nvidia.com/v1beta1",
        "ComputeDomainClique",
    )
    assert made["daemons"] == [entry("node-a", "10.0.0.1", 0)]


def test_a_new_node_takes_the_lowest_free_index_and_owns_the_clique_too() -> None:
    clique = new_clique(member(), ready=True)
    clique["daemons"].append(entry("node-c", "10.0.0.3", 2))
    after = joined(clique, member("node-b", "10.0.0.2", "pod-b"), ready=False)
    assert after is not None
    assert after["daemons"][-1] == entry("node-b", "10.0.0.2", 1)
    assert [o["uid"] for o in after["metadata"]["ownerReferences"]] == ["pod-a", "pod-b"]
    assert clique["daemons"][-1]["nodeName"] == "node-c"  # the input is not changed


def test_nothing_to_write_when_the_entry_is_current() -> None:
    clique = new_clique(member(), ready=True)
    assert joined(clique, member(), ready=True) is None


def test_readiness_and_a_new_pods_address_update_the_entry_in_place() -> None:
    clique = new_clique(member(), ready=False)
    ready = joined(clique, member(), ready=True)
    assert ready is not None and ready["daemons"] == [entry("node-a", "10.0.0.1", 0, names.READY)]
    moved = joined(ready, member(ip="10.0.0.9", pod_uid="pod-a2"), ready=False)
    assert moved is not None
    assert moved["daemons"] == [entry("node-a", "10.0.0.9", 0)]  # same index: same DNS name
    assert [o["uid"] for o in moved["metadata"]["ownerReferences"]] == ["pod-a", "pod-a2"]


def test_a_full_clique_is_a_retryable_error_with_nvidias_words() -> None:
    clique = new_clique(member(max_nodes=2), ready=True)
    clique["daemons"].append(entry("node-b", "10.0.0.2", 1))
    with pytest.raises(
        NoIndexError, match=r"no available indices within maxNodesPerIMEXDomain \(2\)"
    ):
        joined(clique, member("node-c", "10.0.0.3", "pod-c", max_nodes=2), ready=False)


def test_an_entry_with_an_unusable_index_gets_a_free_one() -> None:
    clique = new_clique(member(), ready=False)
    clique["daemons"][0]["index"] = 40
    after = joined(clique, member(), ready=False)
    assert after is not None and after["daemons"][0]["index"] == 0


def test_leaving_removes_the_entries_of_this_pods_address_only() -> None:
    clique = new_clique(member(), ready=True)
    clique["daemons"].append(entry("node-b", "10.0.0.2", 1))
    after = left(clique, member())
    assert after is not None and after["daemons"] == [entry("node-b", "10.0.0.2", 1)]
    assert left(after, member()) is None


def test_leaving_never_touches_another_nodes_entry_even_at_this_address() -> None:
    """A stale entry of another node that held this address once is the controller's to
    remove: the admission policy lets a daemon write its own node's entry only."""
    clique = new_clique(member(), ready=True)
    clique["daemons"].append(entry("node-b", "10.0.0.1", 1))
    after = left(clique, member())
    assert after is not None and after["daemons"] == [entry("node-b", "10.0.0.1", 1)]


@pytest.mark.parametrize(
    ("pod", "ready"),
    [
        (None, False),
        (
            {"status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "True"}]}},
            False,
        ),
        (
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}},
            False,
        ),
        ({"status": {"phase": "Running"}}, False),
        (
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            True,
        ),
    ],
)
def test_an_entry_is_ready_when_its_pod_runs_and_is_ready(pod: Obj | None, ready: bool) -> None:
    assert pod_ready(pod) is ready
