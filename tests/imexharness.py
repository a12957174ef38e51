"""Helpers of the IMEX tests: loopback addresses of their own, waits on conditions, the
stand-in's events, and ``gpu-dra compute-domain-daemon`` as a subprocess.

Every address is in 127.0.0.0/8, which Linux routes to the loopback device without setup;
each test takes a block of its own (``127.<a>.<b>.2`` and up, the block picked at random and
checked free), so tests running in parallel never share IMEX's fixed ports.
"""

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cluster.imexdaemon.imexconfig import CMD_PORT, SERVER_PORT
from driver.common import fsutil
from tests import imexstandin

CLIQUE = "5bdf4a2c-0c6e-4a4b-9d2b-3a3c1f3d0a11.32766"
ROOT = Path(__file__).resolve().parent.parent
_POLL = 0.02


def _free(address: str) -> bool:
    for port in (SERVER_PORT, CMD_PORT):
        with socket.socket() as sock:
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def loopback_block(count: int) -> list[str]:
    """``count`` loopback addresses whose IMEX ports are free."""
    for _ in range(50):
        a, b = random.randrange(1, 255), random.randrange(1, 255)
        addresses = [f"127.{a}.{b}.{host}" for host in range(2, 2 + count)]
        if all(_free(address) for address in addresses):
            return addresses
    raise RuntimeError("no free block of loopback addresses")


async def eventually(
    condition: Callable[[], Awaitable[bool]], what: str, wait_s: float = 30.0
) -> float:
    """As :func:`wait_for`, for a condition that must be awaited (a probe run)."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > wait_s:
            raise TimeoutError(f"timed out after {wait_s:g}s waiting for {what}")
        await asyncio.sleep(_POLL)
    return time.monotonic() - start


async def wait_for(condition: Callable[[], bool], what: str, wait_s: float = 20.0) -> float:
    """Seconds it took for ``condition`` to hold; TimeoutError after ``wait_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > wait_s:
            raise TimeoutError(f"timed out after {wait_s:g}s waiting for {what}")
        await asyncio.sleep(_POLL)
    return time.monotonic() - start


def events(path: Path) -> list[dict[str, Any]]:
    """The stand-in's events so far (a line being written is left for the next look)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith("\n")]


def count(path: Path, event: str) -> int:
    return sum(1 for e in events(path) if e["event"] == event)


def clique(
    daemons: Iterable[tuple[str, str, int]],
    *,
    clique_id: str = CLIQUE,
    status: str | None = None,
    others: Iterable[tuple[str, str, int, str]] = (),
) -> str:
    """A ComputeDomainClique object of (node, ip, index) daemons, as JSON; ``others`` are
    (node, ip, index, clique) daemons of other cliques, as a status written by hand may hold."""
    entries: list[dict[str, Any]] = [
        {"nodeName": node, "ipAddress": ip, "cliqueID": clique_id, "index": index}
        for node, ip, index in daemons
    ]
    if status is not None:
        for entry in entries:
            entry["status"] = status
    entries += [
        {"nodeName": node, "ipAddress": ip, "cliqueID": other, "index": index}
        for node, ip, index, other in others
    ]
    return json.dumps(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainClique",
            "daemons": entries,
        }
    )


def write_peers(path: Path, text: str) -> None:
    fsutil.write_atomic(path, text)


def hosts_mapping(path: Path) -> dict[str, str]:
    """Our names to addresses, as the stand-in resolves them from that hosts file."""
    names = [f"compute-domain-daemon-{i:04d}" for i in range(18)]
    return imexstandin.resolve(names, path.read_text()) if path.exists() else {}


class Daemon:
    """``gpu-dra compute-domain-daemon`` over the stand-in IMEX, in a directory of its own."""

    def __init__(self, root: Path, *, node: str, ip: str, clique_id: str = CLIQUE) -> None:
        self.node, self.ip, self.clique_id = node, ip, clique_id
        self.dir = root / node
        self.dir.mkdir(parents=True)
        self.imex, self.ctl = imexstandin.install(self.dir / "bin")
        self.hosts = self.dir / "hosts"
        self.hosts.write_text("127.0.0.1\tlocalhost\n")
        self.events = self.dir / "events"
        self.log = self.dir / "daemon.log"
        self.proc: asyncio.subprocess.Process | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_DRA_")}
        for name in ("CLIQUE_ID", "COMPUTE_DOMAIN_UUID", "POD_IP", "NODE_NAME"):
            env.pop(name, None)
        env.update(
            PYTHONPATH=str(ROOT),
            IMEX_STANDIN_HOSTS=str(self.hosts),
            IMEX_STANDIN_EVENTS=str(self.events),
        )
        return env

    def _flags(self) -> list[str]:
        return [
            "--clique-id",
            self.clique_id,
            "--imex-config-dir",
            str(self.dir / "imexd"),
            "--nvidia-imex-ctl",
            str(self.ctl),
        ]

    async def start(self, peers_file: Path, *extra: str) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cli",
                "compute-domain-daemon",
                "run",
                *self._flags(),
                "--compute-domain-uuid",
                "7c1e4d52-95c3-4f1f-a0a3-1f1d7a2b9e44",
                "--node-name",
                self.node,
                "--pod-ip",
                self.ip,
                "--hosts-file",
                str(self.hosts),
                "--nvidia-imex",
                str(self.imex),
                "--peers-file",
                str(peers_file),
                "--nvml",
                "simulated",
                "--profile",
                "p6e-gb200.36xlarge",
                "--log-level",
                "DEBUG",
                *extra,
                env=self.env(),
                stdout=log,
                stderr=log,
                cwd=ROOT,
            )

    async def ready(self) -> bool:
        return (await self.check())[0] == 0

    async def check(self) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cli",
            "compute-domain-daemon",
            "check",
            *self._flags(),
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
        )
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode()

    def imex_pid(self) -> int | None:
        """The pid of the stand-in running now (its last start without an exit after it)."""
        pid = None
        for event in events(self.events):
            if event["event"] == "start":
                pid = event["pid"]
            elif event["event"] == "exit" and event["pid"] == pid:
                pid = None
        return pid

    def logged(self, text: str) -> int:
        return self.log.read_text().count(text) if self.log.exists() else 0

    async def stop(self, sig: int = signal.SIGTERM, wait_s: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), wait_s)


async def stop_all(daemons: Sequence[Daemon]) -> None:
    for daemon in daemons:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()
        pid = daemon.imex_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
