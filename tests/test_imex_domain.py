"""Several ``gpu-dra compute-domain-daemon`` processes of one domain, each on its own loopback
address with the stand-in IMEX: they converge on one name-to-address mapping, re-render when a
peer joins or leaves, signal their IMEX only on a change (counted by the stand-ins), report
READY when every peer is up and NOT_READY while one is gone, and restart a crashed IMEX.

The peer list is a ComputeDomainClique in a file all of them read, as the API source will give
them the clique object; the test writes what the controller would.
"""

import asyncio
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.imexharness import (
    Daemon,
    clique,
    count,
    events,
    eventually,
    hosts_mapping,
    loopback_block,
    stop_all,
    wait_for,
    write_peers,
)

OTHER_CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.1"
UNCHANGED = 'msg="peers updated, mapping unchanged"'

pytestmark = pytest.mark.timeout(240)


def _names(daemons: Sequence[Daemon]) -> dict[str, str]:
    return {f"compute-domain-daemon-{i:04d}": d.ip for i, d in enumerate(daemons)}


def _entries(daemons: Sequence[Daemon]) -> list[tuple[str, str, int]]:
    return [(d.node, d.ip, i) for i, d in enumerate(daemons)]


async def _all_ready(daemons: Sequence[Daemon]) -> bool:
    return all(await asyncio.gather(*(d.ready() for d in daemons)))


async def _converged(daemons: Sequence[Daemon], members: Sequence[Daemon]) -> float:
    """Until every daemon maps exactly ``members`` (the seconds that took, returned) and every
    IMEX answers READY."""
    wanted = _names(members)
    mapped = await wait_for(
        lambda: all(hosts_mapping(d.hosts) == wanted for d in daemons), "one mapping", 30
    )
    await eventually(lambda: _all_ready(daemons), "every IMEX READY")
    return mapped


def _signals(daemons: Sequence[Daemon]) -> list[int]:
    return [count(d.events, "reread") for d in daemons]


async def test_one_domains_daemons_converge_and_signal_only_on_change(tmp_path: Path) -> None:
    ips = loopback_block(4)
    daemons = [Daemon(tmp_path, node=f"node-{i}", ip=ip) for i, ip in enumerate(ips)]
    first, joiner = daemons[:3], daemons[3]
    peers = tmp_path / "clique.json"
    figures: dict[str, float] = {}
    try:
        write_peers(peers, clique(_entries(first)))
        started = time.monotonic()
        await asyncio.gather(*(d.start(peers) for d in first))
        await _converged(first, first)
        figures["processes started to converged, 3 daemons"] = time.monotonic() - started
        assert _signals(first) == [0, 0, 0]  # each IMEX started after its hosts file was written
        for daemon in first:
            assert [e["peers"] for e in events(daemon.events)] == [_names(first)]

        # A fourth node joins: the three signal once, the newcomer starts with the full map.
        changed = time.monotonic()
        write_peers(peers, clique(_entries(daemons)))
        await joiner.start(peers)
        figures["join: file written to every hosts file mapped"] = await _converged(
            daemons, daemons
        )
        figures["join: file written to every IMEX READY (a process started)"] = (
            time.monotonic() - changed
        )
        assert _signals(daemons) == [1, 1, 1, 0]
        for daemon in first:
            assert events(daemon.events)[-1] == {
                "event": "reread",
                "pid": events(daemon.events)[0]["pid"],
                "peers": _names(daemons),
            }

        # Statuses change and a daemon of another clique appears: no name maps anew.
        before = [d.hosts.read_text() for d in daemons]
        write_peers(
            peers,
            clique(
                _entries(daemons),
                status="Ready",
                others=[("node-x", "127.0.0.1", 5, OTHER_CLIQUE)],
            ),
        )
        await wait_for(lambda: all(d.logged(UNCHANGED) == 1 for d in daemons), "the updates")
        assert _signals(daemons) == [1, 1, 1, 0]
        assert [d.hosts.read_text() for d in daemons] == before

        # One daemon is stopped: its peers still resolve its name and cannot reach it.
        assert await joiner.stop() == 0
        assert count(joiner.events, "exit") == 1
        await eventually(lambda: _none_ready(first), "NOT_READY on the others", 15)
        for daemon in first:
            assert await daemon.check() == (1, "IMEX daemon not ready: NOT_READY\n")

        # It leaves the clique: the rest re-render, signal once more, and are READY again.
        left = time.monotonic()
        write_peers(peers, clique(_entries(first)))
        figures["leave: file written to every hosts file mapped"] = await _converged(first, first)
        figures["leave: file written to every IMEX READY"] = time.monotonic() - left
        assert _signals(daemons) == [2, 2, 2, 0]
        assert all(d.logged("nvidia-imex started") == 1 for d in daemons)

        # Every stop is clean: exit 0, IMEX stopped.
        for daemon in first:
            assert await daemon.stop() == 0
            assert count(daemon.events, "exit") == 1
    finally:
        await stop_all(daemons)
    print("\nfigures:", {k: round(v, 2) for k, v in figures.items()})


async def _none_ready(daemons: Sequence[Daemon]) -> bool:
    return not any(await asyncio.gather(*(d.ready() for d in daemons)))


async def test_a_crashed_imex_is_restarted_and_the_domain_recovers(tmp_path: Path) -> None:
    ips = loopback_block(2)
    daemons = [Daemon(tmp_path, node=f"node-{i}", ip=ip) for i, ip in enumerate(ips)]
    peers = tmp_path / "clique.json"
    try:
        write_peers(peers, clique(_entries(daemons)))
        await asyncio.gather(*(d.start(peers) for d in daemons))
        await _converged(daemons, daemons)
        crashed = daemons[0]
        pid = crashed.imex_pid()
        assert pid is not None
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: count(crashed.events, "start") == 2, "the restart", 15)
        restart = time.monotonic() - killed
        await eventually(lambda: _all_ready(daemons), "READY again")
        log = crashed.log.read_text()
        assert 'msg="nvidia-imex exited: restarting it" signal=SIGKILL' in log
        assert "restart_in_s=1.0" in log
        assert restart >= 1.0  # the first backoff
        assert _signals(daemons) == [0, 0]  # a restart reads the hosts file itself
        assert await daemons[1].stop() == 0 and await crashed.stop() == 0
    finally:
        await stop_all(daemons)
    print(f"\nIMEX killed to restarted: {restart:.2f} s")
