"""The domain's peers to IMEX's names: which peers count, which index names them, and what
changed between two mappings (pure)."""

import itertools
import logging

import pytest

from cluster.imexdaemon import hostsfile
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
    (record,) = caplog.records
    assert record.getMessage() == "peers left out of the mapping"
    assert record.__dict__["no_usable_index"] == 2


INJECTION = (
    "10.0.0.9\n# END compute-domain-daemon mappings\n6.6.6.6 kubernetes.default.svc.cluster.local"
)


@pytest.mark.parametrize(
    "address", [INJECTION, "fe80::1%eth0\n6.6.6.6 kubernetes.default", "10.0.0.300", "", "host"]
)
def test_an_address_that_is_no_ip_never_reaches_the_hosts_file(address: str) -> None:
    """A clique entry's ipAddress is the line written to /etc/hosts: one with a newline and a
    fake end marker would add host lines that stay after the peer leaves (issue #38)."""
    peers = [_peer(0, "10.0.0.1"), _peer(1, address)]
    wanted = mapping(peers, CLIQUE, 18)
    assert wanted == {"10.0.0.1": "compute-domain-daemon-0000"}
    text = hostsfile.merge("127.0.0.1\tlocalhost\n", wanted)
    assert "6.6.6.6" not in text and "kubernetes" not in text
    assert text.splitlines() == ["127.0.0.1\tlocalhost", hostsfile.BEGIN,
                                 "10.0.0.1\tcompute-domain-daemon-0000", hostsfile.END]  # fmt: skip


def test_addresses_are_written_in_their_canonical_form() -> None:
    peers = [_peer(0, "2001:DB8:0:0::1")]
    assert mapping(peers, CLIQUE, 18) == {"2001:db8::1": "compute-domain-daemon-0000"}


def test_a_clique_of_100000_bad_entries_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    peers = [_peer(i % 40, "bad" if i % 2 else f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}")
             for i in range(100_000)]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        wanted = mapping(peers, CLIQUE, 18)
    assert len(wanted) == 9  # the even indexes below 18, each its lowest address
    (record,) = caplog.records
    counts = {k: record.__dict__.get(k) for k in ("not_an_ip_address", "no_usable_index",
                                                  "index_taken")}  # fmt: skip
    assert counts == {"not_an_ip_address": 50_000, "no_usable_index": 27_500,
                      "index_taken": 22_491}  # fmt: skip


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
