"""The domain's peers to IMEX's names: which peers count, which index names them, and what
changed between two mappings (pure)."""

import itertools
import logging

import pytest

from cluster.imexdaemon.peers import (
    Change,
    Peer,
    diff,
    has_clique,
    mapping,
    peers_from_clique,
)
from driver.common.errors import PermanentError

CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.32766"
OTHER = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.1"


def _peer(index: int, ip: str, clique: str = CLIQUE) -> Peer:
    return Peer(node_name=f"node-{index}", ip=ip, clique_id=clique, index=index)


@pytest.mark.parametrize(
    ("clique", "expected"),
    [
        ("", False),
        ("00000000-0000-0000-0000-000000000000.0", False),
        (CLIQUE, True),
    ],
)
def test_no_clique_is_empty_or_the_zero_cluster_uuid(clique: str, expected: bool) -> None:
    assert has_clique(clique) is expected


def test_a_clique_objects_daemons_become_peers() -> None:
    clique = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainClique",
        "daemons": [
            {"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": 0},
            {"nodeName": "b", "ipAddress": "10.0.0.2", "cliqueID": CLIQUE, "status": "Ready"},
        ],
    }
    assert peers_from_clique(clique) == (
        Peer("a", "10.0.0.1", CLIQUE, 0),
        Peer("b", "10.0.0.2", CLIQUE, -1),  # index is optional in the CRD
    )
    assert peers_from_clique({"daemons": None}) == ()


@pytest.mark.parametrize(
    "entry",
    [
        {"nodeName": "a", "cliqueID": CLIQUE, "index": 0},
        {"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": "0"},
        {"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": True},
        "a",
    ],
)
def test_a_malformed_daemon_entry_is_a_permanent_error(entry: object) -> None:
    with pytest.raises(PermanentError, match=r"daemons\[0\]"):
        peers_from_clique({"daemons": [entry]})


def test_only_this_cliques_peers_are_mapped_by_index() -> None:
    peers = [_peer(0, "10.0.0.1"), _peer(1, "10.0.0.2"), _peer(0, "10.0.9.9", OTHER)]
    assert mapping(peers, CLIQUE, 18) == {
        "10.0.0.1": "compute-domain-daemon-0000",
        "10.0.0.2": "compute-domain-daemon-0001",
    }


def test_every_order_of_the_list_gives_one_mapping() -> None:
    peers = [_peer(2, "10.0.0.3"), _peer(0, "10.0.0.1"), _peer(1, "10.0.0.2")]
    mappings = {
        tuple(sorted(mapping(order, CLIQUE, 18).items())) for order in itertools.permutations(peers)
    }
    assert len(mappings) == 1


def test_an_unusable_index_leaves_that_peer_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    peers = [_peer(0, "10.0.0.1"), _peer(-1, "10.0.0.2"), _peer(18, "10.0.0.3")]
    with caplog.at_level(logging.WARNING):
        assert mapping(peers, CLIQUE, 18) == {"10.0.0.1": "compute-domain-daemon-0000"}
    assert [r.getMessage() for r in caplog.records].count(
        "peer has no usable index: left out of the mapping"
    ) == 2


def test_two_addresses_of_one_index_keep_the_lower_on_every_daemon() -> None:
    peers = [_peer(3, "10.0.0.9"), _peer(3, "10.0.0.4")]
    assert mapping(peers, CLIQUE, 18) == {"10.0.0.4": "compute-domain-daemon-0003"}
    assert mapping(reversed(peers), CLIQUE, 18) == {"10.0.0.4": "compute-domain-daemon-0003"}


def test_one_address_under_two_indices_keeps_the_lower_index() -> None:
    peers = [_peer(5, "10.0.0.1"), _peer(2, "10.0.0.1")]
    assert mapping(peers, CLIQUE, 18) == {"10.0.0.1": "compute-domain-daemon-0002"}


def test_the_diff_names_what_joined_left_and_moved() -> None:
    old = {"10.0.0.1": "compute-domain-daemon-0000", "10.0.0.2": "compute-domain-daemon-0001"}
    new = {"10.0.0.7": "compute-domain-daemon-0001", "10.0.0.3": "compute-domain-daemon-0002"}
    new["10.0.0.1"] = "compute-domain-daemon-0000"
    change = diff(old, new)
    assert change == Change(
        added=(("compute-domain-daemon-0002", "10.0.0.3"),),
        moved=(("compute-domain-daemon-0001", "10.0.0.2", "10.0.0.7"),),
    )
    assert change.describe() == (
        "+compute-domain-daemon-0002=10.0.0.3 compute-domain-daemon-0001:10.0.0.2->10.0.0.7"
    )
    assert diff(new, {}).removed == tuple(sorted((n, ip) for ip, n in new.items()))


def test_the_same_mapping_is_no_change() -> None:
    same = {"10.0.0.1": "compute-domain-daemon-0000"}
    assert not diff(same, dict(same))
    assert not diff({}, {})
