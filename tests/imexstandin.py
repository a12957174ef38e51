"""Stand-ins for ``nvidia-imex`` and ``nvidia-imex-ctl`` with the real command-line contract.

Standard library only, so it runs under any Python 3.11 (and can be copied into an image):
``python imexstandin.py nvidia-imex -c <config>`` or ``... nvidia-imex-ctl -c <config> -q``;
:func:`install` writes the two as executables that run this file.

``nvidia-imex -c <config>``
  reads its config as the real one does (``KEY=value`` lines, ``#`` comments) and refuses to
  start, exiting 1 with a message, on a missing key of those below, a port that is not a
  number from 0 to 65535, ``DAEMONIZE`` other than 0, an unreadable node config file, or a
  port it cannot bind. The real daemon defaults some keys; the stand-in requires the ones the
  compute-domain daemon's config sets, so a config that lost one fails here first.
  It listens on ``SERVER_PORT`` (peers) and, with ``IMEX_CMD_ENABLED=1``, on ``IMEX_CMD_PORT``
  (the command service). Its own address is ``BIND_INTERFACE_IP``, else
  ``IMEX_CMD_BIND_INTERFACE_IP`` (the real one matches the node file against its interfaces;
  on one host every 127.0.0.x is local, so that cannot tell the daemons apart).
  At start and on SIGUSR1 it reads the node config file and resolves each name through the
  hosts file (``$IMEX_STANDIN_HOSTS``, default ``/etc/hosts``); a name that does not resolve
  is an unused slot. SIGTERM ends it with status 0.
  Ready when every resolved peer but itself accepts a TCP connection on ``SERVER_PORT``.
  Connections go to loopback addresses only: any other peer counts as unreachable.

``nvidia-imex-ctl [-c <config> | -i <ip> <port>] -q``
  asks the command service once and prints ``READY`` or ``NOT_READY``, exit 0; when the
  service cannot be reached it prints why on stderr and exits 1.

``$IMEX_STANDIN_EVENTS``, when set, is a file the daemon appends one JSON object a line to:
``start`` (with its pid and peers), ``reread`` (SIGUSR1, with the peers now) and ``exit``.
"""

import asyncio
import ipaddress
import json
import os
import signal
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

REQUIRED = (
    "SERVER_PORT",
    "BIND_INTERFACE_IP",
    "IMEX_NODE_CONFIG_FILE",
    "DAEMONIZE",
    "IMEX_CMD_ENABLED",
    "IMEX_CMD_BIND_INTERFACE_IP",
    "IMEX_CMD_PORT",
)
DEFAULT_CONFIG = "/etc/nvidia-imex/config.cfg"
CONNECT_TIMEOUT = 0.5


class Refused(Exception):
    """What the real daemon would refuse to start with."""


def read_config(path: str) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise Refused(f"cannot read config file {path}: {exc.strerror}") from exc
    config: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise Refused(f"{path}:{number}: not KEY=value: {line!r}")
        config[key.strip()] = value.strip()
    return config


def port(config: dict[str, str], key: str) -> int:
    text = config[key]
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise Refused(f"{key}={text!r}: expected a port number from 0 to 65535")
    return int(text)


def validate(config: dict[str, str]) -> None:
    missing = [key for key in REQUIRED if key not in config]
    if missing:
        raise Refused(f"missing config key(s): {', '.join(missing)}")
    port(config, "SERVER_PORT")
    port(config, "IMEX_CMD_PORT")
    if config["DAEMONIZE"] != "0":
        raise Refused(f"DAEMONIZE={config['DAEMONIZE']!r}: the stand-in runs in the foreground")
    if config["IMEX_CMD_ENABLED"] not in ("0", "1"):
        raise Refused(f"IMEX_CMD_ENABLED={config['IMEX_CMD_ENABLED']!r}: expected 0 or 1")


def resolve(names: Sequence[str], hosts_text: str) -> dict[str, str]:
    """Name to address, the first line naming it winning, as the resolver reads hosts files."""
    wanted = set(names)
    found: dict[str, str] = {}
    for raw in hosts_text.splitlines():
        fields = raw.split("#", 1)[0].split()
        for name in fields[1:]:
            if name in wanted and name not in found:
                found[name] = fields[0]
    return found


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Imex:
    def __init__(self, config: dict[str, str]) -> None:
        self.config = config
        self.address = config["BIND_INTERFACE_IP"] or config["IMEX_CMD_BIND_INTERFACE_IP"]
        self.port = port(config, "SERVER_PORT")
        self.cmd_port = port(config, "IMEX_CMD_PORT")
        self.peers: dict[str, str] = {}
        self.events = os.environ.get("IMEX_STANDIN_EVENTS")
        self.hosts = os.environ.get("IMEX_STANDIN_HOSTS", "/etc/hosts")

    def record(self, event: str, **fields: object) -> None:
        if self.events:
            line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
            with Path(self.events).open("a") as out:
                out.write(line)

    def read_peers(self) -> None:
        nodes_file = self.config["IMEX_NODE_CONFIG_FILE"]
        try:
            names = Path(nodes_file).read_text().split()
        except OSError as exc:
            raise Refused(f"cannot read node config file {nodes_file}: {exc.strerror}") from exc
        try:
            hosts = Path(self.hosts).read_text()
        except OSError:
            hosts = ""
        self.peers = resolve(names, hosts)

    async def reachable(self, address: str) -> bool:
        if not _loopback(address):
            return False
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(address, self.port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    async def ready(self) -> bool:
        others = [ip for ip in self.peers.values() if ip != self.address]
        return all(await asyncio.gather(*(self.reachable(ip) for ip in others)))

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def _command(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readline()
            if request.strip() == b"q":
                writer.write(b"READY\n" if await self.ready() else b"NOT_READY\n")
            else:
                writer.write(b"UNKNOWN_COMMAND\n")
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self._reread)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
        try:
            servers = [await asyncio.start_server(self._peer, self.address, self.port)]
            if self.config["IMEX_CMD_ENABLED"] == "1":
                servers.append(
                    await asyncio.start_server(self._command, self.address, self.cmd_port)
                )
        except OSError as exc:
            raise Refused(f"cannot listen on {self.address}: {exc.strerror}") from exc
        self.record("start", peers=self.peers, address=self.address)
        await stop.wait()
        for server in servers:
            server.close()
        self.record("exit")
        return 0

    def _reread(self) -> None:
        try:
            self.read_peers()
        except Refused as exc:
            print(f"nvidia-imex: {exc}", file=sys.stderr)
        self.record("reread", peers=self.peers)


def imex_main(argv: Sequence[str]) -> int:
    config_path = DEFAULT_CONFIG
    if len(argv) == 2 and argv[0] == "-c":
        config_path = argv[1]
    elif argv:
        print("usage: nvidia-imex [-c <config>]", file=sys.stderr)
        return 2
    try:
        config = read_config(config_path)
        validate(config)
        imex = Imex(config)
        imex.read_peers()
        return asyncio.run(imex.serve())
    except Refused as exc:
        print(f"nvidia-imex: {exc}", file=sys.stderr)
        return 1


async def _query(address: str, cmd_port: int) -> str:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(address, cmd_port), CONNECT_TIMEOUT * 4
    )
    writer.write(b"q\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.readline(), 5.0)
    writer.close()
    return answer.decode()


def ctl_main(argv: Sequence[str]) -> int:
    args = list(argv)
    if "-q" not in args:
        print("usage: nvidia-imex-ctl [-c <config> | -i <ip> <port>] -q", file=sys.stderr)
        return 2
    args.remove("-q")
    try:
        if args[:1] == ["-i"] and len(args) == 3:
            address, cmd_port = args[1], int(args[2])
        else:
            config = read_config(args[1] if args[:1] == ["-c"] else DEFAULT_CONFIG)
            if config.get("IMEX_CMD_ENABLED") != "1":
                raise Refused("the command service is not enabled (IMEX_CMD_ENABLED)")
            address = config.get("IMEX_CMD_BIND_INTERFACE_IP") or "127.0.0.1"
            cmd_port = port(config, "IMEX_CMD_PORT")
        answer = asyncio.run(_query(address, cmd_port))
    except (Refused, KeyError, ValueError) as exc:
        print(f"nvidia-imex-ctl: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"nvidia-imex-ctl: cannot reach the IMEX command service: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(answer)
    return 0


def main(argv: Sequence[str]) -> int:
    # Blocked from the first instruction: a SIGUSR1 before the handler is in place must wait
    # for it, not end the process (the default action).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
    name, *rest = argv
    if name == "nvidia-imex":
        return imex_main(rest)
    if name == "nvidia-imex-ctl":
        return ctl_main(rest)
    print(f"unknown stand-in {name!r}", file=sys.stderr)
    return 2


def install(
    directory: Path, python: str = sys.executable, *, copy: bool = False
) -> tuple[Path, Path]:
    """``directory/nvidia-imex`` and ``directory/nvidia-imex-ctl``, executables running this
    file; returns their paths. ``copy``: each is this file itself under ``python``, for a
    container (the project's image has Python but no shell) that cannot see this checkout."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        path = directory / name
        if copy:
            path.write_text(f"#!{python}\n" + Path(__file__).read_text())
        else:
            path.write_text(
                f'#!/bin/sh\nexec "{python}" "{Path(__file__).resolve()}" {name} "$@"\n'
            )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        paths.append(path)
    return paths[0], paths[1]


if __name__ == "__main__":
    invoked = Path(sys.argv[0]).name  # a copy made by install() is named for what it stands in
    named = [invoked] if invoked in ("nvidia-imex", "nvidia-imex-ctl") else []
    sys.exit(main([*named, *sys.argv[1:]]))
