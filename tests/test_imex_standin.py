"""The stand-in IMEX keeps the real command-line contract and refuses what the real one
refuses, so a daemon test that passes against it is not passing against a sleep loop."""

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from cluster.imexdaemon.imexconfig import render_config, render_nodes
from tests import imexstandin
from tests.imexharness import count, events, loopback_block, wait_for

STANDIN = str(Path(imexstandin.__file__).resolve())


class Node:
    def __init__(self, root: Path, ip: str) -> None:
        self.ip = ip
        self.dir = root / ip
        self.dir.mkdir()
        self.config = self.dir / "imexd.cfg"
        self.nodes = self.dir / "nodes.cfg"
        self.hosts = self.dir / "hosts"
        self.events = self.dir / "events"
        self.config.write_text(render_config(cmd_bind_ip=ip, nodes_config_path=str(self.nodes)))
        self.nodes.write_text(render_nodes(18))
        self.hosts.write_text("127.0.0.1 localhost\n")
        self.proc: asyncio.subprocess.Process | None = None

    def env(self) -> dict[str, str]:
        return {"IMEX_STANDIN_HOSTS": str(self.hosts), "IMEX_STANDIN_EVENTS": str(self.events)}

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, STANDIN, "nvidia-imex", "-c", str(self.config), env=self.env()
        )
        await wait_for(lambda: count(self.events, "start") > 0, "the stand-in's start")

    async def query(self) -> tuple[int, str]:
        return await _run("nvidia-imex-ctl", "-c", str(self.config), "-q")

    async def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), 10)


async def _run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        STANDIN,
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    return proc.returncode or 0, out.decode()


def _edit(config: Path, key: str, value: str | None) -> None:
    lines = [line for line in config.read_text().splitlines() if not line.startswith(f"{key}=")]
    if value is not None:
        lines.append(f"{key}={value}")
    config.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("SERVER_PORT", None, "missing config key(s): SERVER_PORT"),
        ("IMEX_NODE_CONFIG_FILE", None, "missing config key(s): IMEX_NODE_CONFIG_FILE"),
        ("IMEX_CMD_PORT", None, "missing config key(s): IMEX_CMD_PORT"),
        ("SERVER_PORT", "fifty", "SERVER_PORT='fifty': expected a port number"),
        ("SERVER_PORT", "70000", "SERVER_PORT='70000': expected a port number"),
        ("IMEX_CMD_PORT", "-1", "IMEX_CMD_PORT='-1': expected a port number"),
        ("DAEMONIZE", "1", "DAEMONIZE='1'"),
        ("IMEX_NODE_CONFIG_FILE", "/nonexistent/nodes.cfg", "cannot read node config file"),
    ],
)
async def test_a_config_the_real_one_refuses_is_refused(
    tmp_path: Path, key: str, value: str | None, message: str
) -> None:
    node = Node(tmp_path, loopback_block(1)[0])
    _edit(node.config, key, value)
    code, out = await _run("nvidia-imex", "-c", str(node.config), env=node.env())
    assert code == 1
    assert out.startswith("nvidia-imex: ") and message in out
    assert not node.events.exists()


async def test_a_port_already_taken_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, loopback_block(1)[0])
    await node.start()
    try:
        (tmp_path / "again").mkdir()
        second = Node(tmp_path / "again", node.ip)
        code, out = await _run("nvidia-imex", "-c", str(second.config), env=second.env())
        assert code == 1 and "cannot listen on" in out
    finally:
        assert await node.stop() == 0


async def test_alone_it_is_ready_and_sigterm_ends_it(tmp_path: Path) -> None:
    node = Node(tmp_path, loopback_block(1)[0])
    await node.start()
    assert await node.query() == (0, "READY\n")
    assert await node.stop() == 0
    assert [e["event"] for e in events(node.events)] == ["start", "exit"]


async def test_copies_run_by_their_names_alone(tmp_path: Path) -> None:
    """As in the project's image: the two files copied where the driver installs them, with
    no shell and no checkout behind them."""
    node = Node(tmp_path, loopback_block(1)[0])
    imex, ctl = imexstandin.install(tmp_path / "bin", copy=True)
    assert "tests" not in imex.read_text().splitlines()[0]
    daemon = await asyncio.create_subprocess_exec(str(imex), "-c", str(node.config), env=node.env())
    try:
        await wait_for(lambda: count(node.events, "start") > 0, "the copy's start")
        query = await asyncio.create_subprocess_exec(
            str(ctl), "-c", str(node.config), "-q", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(query.communicate(), 20)
        assert (query.returncode, out) == (0, b"READY\n")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 10) == 0


async def test_the_ctl_without_a_daemon_fails(tmp_path: Path) -> None:
    node = Node(tmp_path, loopback_block(1)[0])
    code, out = await node.query()
    assert code == 1 and "cannot reach the IMEX command service" in out


async def test_not_ready_while_a_resolved_peer_is_unreachable(tmp_path: Path) -> None:
    a_ip, b_ip = loopback_block(2)
    a, b = Node(tmp_path, a_ip), Node(tmp_path, b_ip)
    block = f"{a_ip}\tcompute-domain-daemon-0000\n{b_ip}\tcompute-domain-daemon-0001\n"
    for node in (a, b):
        node.hosts.write_text(node.hosts.read_text() + block)
    await a.start()
    try:
        assert await a.query() == (0, "NOT_READY\n")  # b resolves, nothing listens there
        await b.start()
        assert await a.query() == (0, "READY\n")
        assert await b.query() == (0, "READY\n")
        assert await b.stop() == 0
        assert await a.query() == (0, "NOT_READY\n")
    finally:
        await a.stop()


async def test_names_are_resolved_again_only_on_sigusr1(tmp_path: Path) -> None:
    a_ip, b_ip = loopback_block(2)
    a = Node(tmp_path, a_ip)
    a.hosts.write_text(f"{a_ip}\tcompute-domain-daemon-0000\n")
    await a.start()
    try:
        assert events(a.events)[0]["peers"] == {"compute-domain-daemon-0000": a_ip}
        a.hosts.write_text(a.hosts.read_text() + f"{b_ip}\tcompute-domain-daemon-0001\n")
        assert await a.query() == (0, "READY\n")  # b unknown until IMEX re-reads
        assert a.proc is not None
        a.proc.send_signal(signal.SIGUSR1)
        await wait_for(lambda: count(a.events, "reread") == 1, "the re-read")
        assert events(a.events)[-1]["peers"] == {
            "compute-domain-daemon-0000": a_ip,
            "compute-domain-daemon-0001": b_ip,
        }
        assert await a.query() == (0, "NOT_READY\n")
    finally:
        await a.stop()


async def test_peers_off_loopback_are_never_dialled(tmp_path: Path) -> None:
    node = Node(tmp_path, loopback_block(1)[0])
    node.hosts.write_text("192.0.2.10\tcompute-domain-daemon-0001\n")  # TEST-NET-1
    await node.start()
    try:
        assert await node.query() == (0, "NOT_READY\n")
    finally:
        await node.stop()
