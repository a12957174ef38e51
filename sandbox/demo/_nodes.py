"""Simulated nodes: each a real ``gpu-dra kubelet-plugin`` subprocess on its own host dirs.

Every node gets a short directory under the demo's work directory (unix socket paths
are limited: gRPC binds 105 bytes, the MPS daemon 106) holding the kubelet's registrar
and plugins directories, the CDI root, the plugin's log, and its TMPDIR, so whatever
the plugin leaves behind is removed with the work directory.
"""

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from driver.common.errors import PermanentError, RetryableError
from driver.common.limits import is_dns_label
from kubeletplugin.sockets import SocketPaths, socket_paths

_MAX_NODE_NAME = 32  # the demo's own bound, below a DNS label's 63
_POLL_S = 0.05
# The environment variables behind the plugin flags the demo leaves unset: a value
# inherited from the caller's shell must not reach the simulated nodes.
_DROPPED_ENV = (
    "NODE_NAME",
    "POD_UID",
    "GPU_DRA_NODE_NAME",
    "GPU_DRA_POD_UID",
    "GPU_DRA_KUBECONFIG",
    "GPU_DRA_SIM_STATE",
    "GPU_DRA_CRASHPOINT",
    "KUBECONFIG",
)


class DemoError(PermanentError):
    """The demo cannot go on; the message says why."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str


def parse_nodes(text: str, known_profiles: list[str]) -> list[NodeSpec]:
    """``node-a=p5.48xlarge,node-b=g6e.12xlarge`` -> node specs, checked."""
    specs: list[NodeSpec] = []
    for item in (part.strip() for part in text.split(",")):
        name, sep, profile = item.partition("=")
        if not sep or not name or not profile:
            raise DemoError(f"--nodes: {item!r} is not NAME=PROFILE")
        if not is_dns_label(name) or len(name) > _MAX_NODE_NAME:
            raise DemoError(
                f"--nodes: node name {name!r} must be a DNS label of at most 32 characters "
                "(lowercase letters, digits, '-')"
            )
        if profile not in known_profiles:
            raise DemoError(
                f"--nodes: unknown profile {profile!r}; known: {', '.join(known_profiles)}"
            )
        if any(s.name == name for s in specs):
            raise DemoError(f"--nodes: node {name!r} appears twice")
        specs.append(NodeSpec(name, profile))
    return specs


class NodePlugin:
    """One simulated node's kubelet plugin process and host directories."""

    def __init__(self, spec: NodeSpec, root: Path, *, kubeconfig: Path, driver: str) -> None:
        self.spec = spec
        self.root = root
        self.driver = driver
        self.registry = root / "registry"
        self.plugins = root / "plugins"
        self.cdi_root = root / "cdi"
        self.log_path = root / "plugin.log"
        self.paths: SocketPaths = socket_paths(
            registrar_dir=self.registry, plugins_dir=self.plugins, driver_name=driver, pod_uid=None
        )
        self._kubeconfig = kubeconfig
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("plugin not started")
        return self._proc.pid

    async def start(self) -> None:
        tmp = self.root / "tmp"
        for path in (self.registry, self.plugins, self.cdi_root, tmp):
            path.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env["TMPDIR"] = str(tmp)
        args = [
            sys.executable,
            "-m",
            "cli",
            "kubelet-plugin",
            f"--node-name={self.name}",
            f"--driver-name={self.driver}",
            f"--kubeconfig={self._kubeconfig}",
            f"--kubelet-registrar-directory-path={self.registry}",
            f"--kubelet-plugins-directory-path={self.plugins}",
            f"--cdi-root={self.cdi_root}",
            f"--container-driver-root={self.root / 'driver-root'}",
            "--nvml=simulated",
            f"--profile={self.spec.profile}",
            "--healthcheck-port=0",
        ]
        with self.log_path.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *args, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
            )

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def check_alive(self, what: str) -> None:
        if self._proc is not None and self._proc.returncode is not None:
            raise DemoError(
                f"the plugin of node {self.name} exited ({self._proc.returncode}) "
                f"before {what}; its log ends with:\n{self.log_tail()}"
            )

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the registration socket is served (the DRA socket comes up before it)."""
        deadline = time.monotonic() + timeout_s
        while not self.paths.registration.is_socket():
            self.check_alive("serving its registration socket")
            if time.monotonic() > deadline:
                raise RetryableError(
                    f"the plugin of node {self.name} did not serve "
                    f"{self.paths.registration} within {timeout_s:g}s; its log ends with:\n"
                    f"{self.log_tail()}"
                )
            await asyncio.sleep(_POLL_S)

    async def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (the plugin's clean shutdown), SIGKILL after ``timeout_s``; the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(proc.wait(), timeout_s)
            except ProcessLookupError:
                pass
            except TimeoutError:
                proc.kill()
                await proc.wait()
            except asyncio.CancelledError:
                # Interrupted again while stopping: no waiting any more, but no orphan either.
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                raise
        return proc.returncode
