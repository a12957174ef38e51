"""The IMEX daemon in-process, over the stand-in IMEX: started on the first peers, signalled
once per change of the mapping and never otherwise, restarted with backoff when it dies, and
idle on a node without a clique."""

import asyncio
import logging
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cluster.imexdaemon.daemon import DaemonConfig, ImexDaemon
from cluster.imexdaemon.peers import Peer
from cluster.imexdaemon.process import Backoff
from cluster.imexdaemon.sources import MemorySource
from driver.common.errors import PermanentError
from tests import imexstandin
from tests.imexharness import CLIQUE, count, events, hosts_mapping, loopback_block, wait_for

OTHER_CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.1"


class Node:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ip: str) -> None:
        self.imex, self.ctl = imexstandin.install(tmp_path / "bin")
        self.hosts = tmp_path / "hosts"
        self.hosts.write_text("127.0.0.1\tlocalhost\n")
        self.events = tmp_path / "events"
        self.ip = ip
        self.tmp = tmp_path
        # The stand-in, a child of the daemon, finds its files through the environment.
        monkeypatch.setenv("IMEX_STANDIN_HOSTS", str(self.hosts))
        monkeypatch.setenv("IMEX_STANDIN_EVENTS", str(self.events))

    def config(self, **overrides: object) -> DaemonConfig:
        fields: dict[str, object] = {
            "clique_id": CLIQUE,
            "pod_ip": self.ip,
            "node_name": "node-a",
            "config_dir": self.tmp / "imexd",
            "hosts_file": self.hosts,
            "imex": str(self.imex),
            "backoff": Backoff(first=0.1, most=0.4),
            "stop_timeout": 5.0,
        }
        fields.update(overrides)
        return DaemonConfig(**fields)  # type: ignore[arg-type]


@asynccontextmanager
async def running(daemon: ImexDaemon) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(daemon.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _peer(index: int, ip: str, clique: str = CLIQUE) -> Peer:
    return Peer(node_name=f"node-{index}", ip=ip, clique_id=clique, index=index)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return Node(tmp_path, monkeypatch, loopback_block(3)[0])


async def test_signals_only_when_the_mapping_changes(node: Node) -> None:
    a, b, c = node.ip, *loopback_block(2)
    source = MemorySource([_peer(0, a)])
    daemon = ImexDaemon(node.config(), source)
    async with running(daemon):
        await wait_for(lambda: count(node.events, "start") == 1, "IMEX started")
        assert hosts_mapping(node.hosts) == {"compute-domain-daemon-0000": a}
        assert events(node.events)[0]["peers"] == {"compute-domain-daemon-0000": a}
        assert daemon.signals == 0  # a fresh IMEX reads the hosts file itself

        # The same list again, and a peer of another clique: nothing new to resolve.
        source.publish([_peer(0, a)])
        source.publish([_peer(0, a), _peer(1, b, OTHER_CLIQUE)])
        await wait_for(lambda: daemon.updates == 3, "two more updates")
        assert (daemon.changes, daemon.signals) == (1, 0)

        source.publish([_peer(0, a), _peer(1, b)])  # joins
        await wait_for(lambda: count(node.events, "reread") == 1, "IMEX re-read")
        assert events(node.events)[-1]["peers"] == {
            "compute-domain-daemon-0000": a,
            "compute-domain-daemon-0001": b,
        }
        # One change at a time: two SIGUSR1s sent before IMEX handles the first are one pending
        # signal (standard signals do not queue), so back-to-back changes may be one re-read.
        source.publish([_peer(0, a), _peer(1, c)])  # moves
        await wait_for(lambda: count(node.events, "reread") == 2, "the move re-read")
        assert events(node.events)[-1]["peers"]["compute-domain-daemon-0001"] == c
        source.publish([_peer(0, a)])  # leaves
        await wait_for(lambda: count(node.events, "reread") == 3, "the leave re-read")
        assert events(node.events)[-1]["peers"] == {"compute-domain-daemon-0000": a}
        assert (daemon.changes, daemon.signals) == (4, 3)
        assert hosts_mapping(node.hosts) == {"compute-domain-daemon-0000": a}
        assert daemon.process.starts == 1


async def test_an_imex_that_dies_is_restarted_with_backoff_and_logged(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cluster.imexdaemon")
    daemon = ImexDaemon(node.config(), MemorySource([_peer(0, node.ip)]))
    async with running(daemon):
        for starts in range(1, 5):

            def started(n: int = starts) -> bool:
                return count(node.events, "start") == n

            await wait_for(started, f"start {starts}")
            os.kill(events(node.events)[-1]["pid"], signal.SIGKILL)
        await wait_for(lambda: count(node.events, "start") == 5, "the fifth start")
    exits = [r for r in caplog.records if r.getMessage() == "nvidia-imex exited: restarting it"]
    assert [(r.__dict__["signal"], r.__dict__["restart_in_s"]) for r in exits] == [
        ("SIGKILL", 0.1),
        ("SIGKILL", 0.2),
        ("SIGKILL", 0.4),
        ("SIGKILL", 0.4),  # at most
    ]
    assert all(r.levelno == logging.WARNING for r in exits)
    assert daemon.process.starts == 5 and daemon.signals == 0


async def test_a_change_while_imex_is_down_is_read_at_its_restart(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    b = loopback_block(1)[0]
    source = MemorySource([_peer(0, node.ip)])
    daemon = ImexDaemon(node.config(backoff=Backoff(first=0.5)), source)
    async with running(daemon):
        await wait_for(lambda: count(node.events, "start") == 1, "IMEX started")
        os.kill(events(node.events)[-1]["pid"], signal.SIGKILL)
        await wait_for(lambda: not daemon.process.running.is_set(), "IMEX gone")
        source.publish([_peer(0, node.ip), _peer(1, b)])
        await wait_for(lambda: daemon.changes == 2, "the change taken")
        assert daemon.signals == 0  # nobody to signal
        await wait_for(lambda: count(node.events, "start") == 2, "IMEX restarted")
        assert events(node.events)[-1]["peers"] == {
            "compute-domain-daemon-0000": node.ip,
            "compute-domain-daemon-0001": b,
        }
        assert daemon.signals == 0


def test_the_backoff_doubles_to_its_most_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(first=1, most=8, stable_after=60)
    delays = []
    delay = None
    for _ in range(6):
        delay = backoff.after(delay, ran_for=0.1)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 8, 8]
    assert backoff.after(8, ran_for=60) == 1


async def test_a_node_without_a_clique_runs_nothing(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cluster.imexdaemon")
    before = node.hosts.read_text()
    daemon = ImexDaemon(node.config(clique_id="", pod_ip=""), MemorySource([_peer(0, node.ip)]))
    async with running(daemon) as task:
        await wait_for(
            lambda: any(r.getMessage().startswith("no clique ID") for r in caplog.records),
            "the idle line",
        )
        assert not task.done()
    assert task.cancelled()
    assert node.hosts.read_text() == before
    assert not (node.tmp / "imexd").exists() and not node.events.exists()
    assert daemon.updates == 0


async def test_an_imex_that_cannot_start_is_permanent(node: Node) -> None:
    daemon = ImexDaemon(
        node.config(imex=str(node.tmp / "missing" / "nvidia-imex")),
        MemorySource([_peer(0, node.ip)]),
    )
    with pytest.raises(PermanentError, match=r"cannot start .*nvidia-imex: No such file"):
        await asyncio.wait_for(daemon.run(), 10)


async def test_stopping_the_daemon_stops_imex(node: Node) -> None:
    daemon = ImexDaemon(node.config(), MemorySource([_peer(0, node.ip)]))
    async with running(daemon):
        await wait_for(lambda: count(node.events, "start") == 1, "IMEX started")
    assert [e["event"] for e in events(node.events)] == ["start", "exit"]
    assert not daemon.process.running.is_set()


async def test_an_imex_deaf_to_sigterm_is_killed(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    deaf = node.tmp / "deaf-imex"
    started = node.tmp / "deaf-started"
    deaf.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    deaf.chmod(deaf.stat().st_mode | stat.S_IXUSR)
    daemon = ImexDaemon(
        node.config(imex=str(deaf), stop_timeout=0.3), MemorySource([_peer(0, node.ip)])
    )
    async with running(daemon):
        await wait_for(started.exists, "the deaf IMEX")
    assert any(r.getMessage() == "nvidia-imex ignored SIGTERM: killing it" for r in caplog.records)
    assert not daemon.process.running.is_set()


def test_a_config_without_room_for_names_or_an_address_is_refused(node: Node) -> None:
    with pytest.raises(PermanentError, match="max nodes per IMEX domain 0"):
        ImexDaemon(node.config(max_nodes=0), MemorySource())
    with pytest.raises(PermanentError, match="no pod IP"):
        ImexDaemon(node.config(pod_ip=""), MemorySource())


async def test_a_config_directory_it_cannot_write_is_permanent(node: Node) -> None:
    blocker = node.tmp / "not-a-directory"
    blocker.write_text("")
    daemon = ImexDaemon(node.config(config_dir=blocker / "imexd"), MemorySource())
    with pytest.raises(PermanentError, match="cannot write the IMEX config"):
        await asyncio.wait_for(daemon.run(), 10)
