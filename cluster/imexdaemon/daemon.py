"""The IMEX daemon of one ComputeDomain on one node: files, peers, and the supervised IMEX.

At start it writes the IMEX config and the static ``nodes.cfg`` (every possible peer by name,
NVIDIA's DNS-names mode). Then, for each list of peers its source yields, it maps this clique's
peers' addresses to their names in the hosts file; on the first list it starts ``nvidia-imex``,
and on each later change of the mapping (not of the list: a peer's status changing maps nothing
new) it sends SIGUSR1 so IMEX resolves the names again. A node without a clique runs nothing
and waits to be stopped, as NVIDIA's daemon does.

The peer source is the seam to the API: anything with ``updates()`` (:class:`PeerSource`).
"""

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from cluster.imexdaemon import hostsfile, imexconfig
from cluster.imexdaemon.peers import PeerSource, diff, has_clique, mapping
from cluster.imexdaemon.process import Backoff, ImexProcess
from driver.common import fsutil
from driver.common.errors import PermanentError, RetryableError
from driver.common.logs import kv

log = logging.getLogger(__name__)

MAX_NODES_LIMIT = 10_000  # the names have four digits
WRITE_RETRY = 1.0  # seconds between tries of a hosts file write that failed


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    clique_id: str
    pod_ip: str
    node_name: str = ""
    max_nodes: int = 18
    config_dir: Path = Path("/imexd")
    hosts_file: Path = Path("/etc/hosts")
    imex: str = "nvidia-imex"
    backoff: Backoff = field(default_factory=Backoff)
    stop_timeout: float = 10.0

    @property
    def config_path(self) -> Path:
        return self.config_dir / imexconfig.CONFIG_NAME

    @property
    def nodes_path(self) -> Path:
        return self.config_dir / imexconfig.NODES_NAME

    def validate(self) -> None:
        if not 0 < self.max_nodes < MAX_NODES_LIMIT:
            raise PermanentError(
                f"max nodes per IMEX domain {self.max_nodes}: expected 1 to {MAX_NODES_LIMIT - 1}"
            )
        if has_clique(self.clique_id) and not self.pod_ip:
            raise PermanentError("no pod IP: IMEX's command service needs an address to bind")


class ImexDaemon:
    def __init__(self, config: DaemonConfig, peers: PeerSource) -> None:
        config.validate()
        self.config = config
        self._peers = peers
        self.mapping: dict[str, str] = {}  # IP to name, as the hosts file has it
        self.updates = 0  # peer lists taken
        self.changes = 0  # of them, the ones that changed the mapping
        self.process = ImexProcess(
            (config.imex, "-c", str(config.config_path)),
            backoff=config.backoff,
            stop_timeout=config.stop_timeout,
        )

    @property
    def signals(self) -> int:
        return self.process.signals

    async def run(self) -> None:
        """Until cancelled; raises :class:`PermanentError` when IMEX cannot run at all."""
        if not has_clique(self.config.clique_id):
            log.info(
                "no clique ID: IMEX is not started on this node; waiting to be stopped",
                extra=kv(node=self.config.node_name, clique_id=self.config.clique_id),
            )
            await asyncio.Event().wait()
        self._write_config()
        supervisor = asyncio.create_task(self.process.run(), name="nvidia-imex")
        follower = asyncio.create_task(self._follow(), name="peers")
        tasks = {supervisor, follower}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # the one that ended raised; re-raise it here
            raise PermanentError("the peer source ended")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _write_config(self) -> None:
        config = self.config
        try:
            fsutil.ensure_dir(config.config_dir, 0o755)
            fsutil.write_atomic(
                config.config_path,
                imexconfig.render_config(
                    cmd_bind_ip=config.pod_ip, nodes_config_path=str(config.nodes_path)
                ),
            )
            fsutil.write_atomic(config.nodes_path, imexconfig.render_nodes(config.max_nodes))
        except OSError as exc:
            # The domain's directory is the daemon claim's mount: without it nothing can run.
            raise PermanentError(
                f"{config.config_dir}: cannot write the IMEX config: {exc.strerror}"
            ) from exc
        log.info(
            "IMEX config written",
            extra=kv(
                config=str(config.config_path),
                nodes=str(config.nodes_path),
                names=config.max_nodes,
                cmd_bind_ip=config.pod_ip,
                clique_id=config.clique_id,
            ),
        )

    async def _follow(self) -> None:
        async for peers in self._peers.updates():
            self.updates += 1
            wanted = mapping(peers, self.config.clique_id, self.config.max_nodes)
            change = diff(self.mapping, wanted)
            if not change and self.updates > 1:
                log.debug("peers updated, mapping unchanged", extra=kv(peers=len(peers)))
                continue
            await self._write_hosts(wanted)
            self.mapping = wanted
            self.changes += 1
            self.process.ensure_started()
            signalled = self.process.reread()
            log.info(
                "peer mapping changed",
                extra=kv(
                    change=change.describe() or "(none)",
                    peers=len(wanted),
                    sigusr1=signalled,
                    signals=self.process.signals,
                    hosts_file=str(self.config.hosts_file),
                ),
            )

    async def _write_hosts(self, wanted: dict[str, str]) -> None:
        """Until written: a source yields a list once, so a failed write must be retried here."""
        failing = ""
        while True:
            try:
                await asyncio.to_thread(hostsfile.write, self.config.hosts_file, wanted)
            except RetryableError as exc:
                if str(exc) != failing:
                    log.error("hosts file not written: retrying", extra=kv(error=str(exc)))
                    failing = str(exc)
                await asyncio.sleep(WRITE_RETRY)
                continue
            if failing:
                log.info("hosts file written again", extra=kv(path=str(self.config.hosts_file)))
            return
