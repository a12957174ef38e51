"""Driver libraries and hooks for CDI specs, from the host's NVIDIA container toolkit.

A CDI spec with only device nodes gives a container GPUs it cannot use: the user-space
driver (libcuda, libnvidia-ml, …) and the hooks that set up symlinks and the ld cache
come from ``nvidia-ctk cdi generate``, run once per process against the host's driver
root as the DaemonSet mounts it (``container_driver_root``). The paths it prints are
paths inside this container; the runtime that reads the spec runs on the host, so they
are translated back to ``nvidia_driver_root``.

Which device nodes a claim spec adds itself (a GPU's, its control nodes) is the driver's
knowledge: it gives :class:`Toolkit` the test (``own_node``), and the claim state a
``Toolkit`` (``kubeletplugin.state.HostEdits``).
"""

import asyncio
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from driver.common.errors import PermanentError

_CTK_LOCATIONS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/toolkit")
_TIMEOUT_S = 120.0

_cache: dict[tuple[str, str], dict[str, Any]] = {}


class ToolkitError(PermanentError):
    """The container toolkit is missing or failed: no usable CDI spec can be written."""


def _rebase(path: str, old: PurePosixPath, new: PurePosixPath) -> str:
    p = PurePosixPath(path)
    if old == new or not p.is_relative_to(old):
        return path
    return str(new / p.relative_to(old))


def translate_edits(
    edits: Mapping[str, Any],
    *,
    container_root: Path,
    host_root: Path,
    own_node: Callable[[str], bool],
) -> dict[str, Any]:
    """Pure: host paths seen from this container -> the same paths seen from the host.

    Device nodes that ``own_node`` names are dropped: every claim spec adds exactly its own.
    """
    old, new = PurePosixPath(container_root), PurePosixPath(host_root)
    out: dict[str, Any] = {}
    for key, value in edits.items():
        if key == "deviceNodes":
            nodes = []
            for node in value:
                path = str(node.get("path", ""))
                if own_node(path):
                    continue
                node = dict(node)
                if "hostPath" in node:
                    node["hostPath"] = _rebase(node["hostPath"], old, new)
                nodes.append(node)
            out[key] = nodes
        elif key == "mounts":
            out[key] = [
                {**m, "hostPath": _rebase(m["hostPath"], old, new)} if "hostPath" in m else m
                for m in value
            ]
        elif key == "hooks":
            out[key] = [{**h, "path": _rebase(h["path"], old, new)} for h in value]
        else:
            out[key] = value
    return {k: v for k, v in out.items() if v not in ([], None)}


def _find_ctk(container_root: Path) -> Path | None:
    for location in _CTK_LOCATIONS:
        candidate = container_root / location / "nvidia-ctk"
        if candidate.is_file():
            return candidate
    found = shutil.which("nvidia-ctk")
    return Path(found) if found else None


async def _generate(
    container_root: Path, host_root: Path, own_node: Callable[[str], bool]
) -> dict[str, Any]:
    ctk = await asyncio.to_thread(_find_ctk, container_root)
    if ctk is None:
        raise ToolkitError(
            f"nvidia-ctk (NVIDIA container toolkit) not found under {container_root} "
            f"({', '.join(_CTK_LOCATIONS)}) nor on PATH: install the toolkit on the host, "
            "or point --container-driver-root at where the host root is mounted"
        )
    old, new = PurePosixPath(container_root), PurePosixPath(host_root)
    hook = ctk.with_name("nvidia-cdi-hook")
    hook_flag = (
        f"--nvidia-cdi-hook-path={_rebase(str(hook), old, new)}"
        if await asyncio.to_thread(hook.is_file)
        else f"--nvidia-ctk-path={_rebase(str(ctk), old, new)}"
    )
    argv = [str(ctk), "cdi", "generate", "--format=json", f"--driver-root={container_root}"]
    argv.append(hook_flag)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), _TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise ToolkitError(f"running {' '.join(argv)} failed: {exc}") from exc
    if proc.returncode != 0:
        raise ToolkitError(
            f"{' '.join(argv)} exited with {proc.returncode}: {stderr.decode(errors='replace')}"
        )
    try:
        spec = json.loads(stdout)
        edits = spec.get("containerEdits") or {}
    except (ValueError, AttributeError) as exc:
        raise ToolkitError(f"{' '.join(argv)} printed no CDI spec: {exc}") from exc
    return translate_edits(
        edits, container_root=container_root, host_root=host_root, own_node=own_node
    )


async def base_edits(
    nvml_mode: Literal["system", "simulated"],
    *,
    container_root: Path,
    host_root: Path,
    own_node: Callable[[str], bool],
) -> dict[str, Any]:
    """Spec-level container edits every claim spec gets; computed once per process."""
    if nvml_mode == "simulated":
        # Simulated GPUs have no driver install to expose: the spec's device nodes and
        # environment are the whole contract tests and the demo observe.
        return {}
    key = (str(container_root), str(host_root))
    if key not in _cache:
        _cache[key] = await _generate(container_root, host_root, own_node)
    return _cache[key]


def dev_root(container_driver_root: Path, nvidia_driver_root: Path) -> str:
    """Where the host keeps the device nodes, as NVIDIA's container toolkit decides:
    under the driver root when that root has its own ``dev/nvidiactl`` (a driver
    container, a fake root in tests), else the host's ``/dev``. Blocking: a stat."""
    if (container_driver_root / "dev" / "nvidiactl").exists():
        return str(nvidia_driver_root)
    return "/"


@dataclass(frozen=True, slots=True)
class Toolkit:
    """The host's driver install as one driver's claim specs reach it: its root seen from
    this container and from the host, the device nodes the driver's specs add themselves
    (``own_node``), and whether there is an install at all (a simulated node has none)."""

    container_root: Path
    host_root: Path
    own_node: Callable[[str], bool]
    simulated: bool = False

    async def base_edits(self) -> Mapping[str, Any]:
        return await base_edits(
            "simulated" if self.simulated else "system",
            container_root=self.container_root,
            host_root=self.host_root,
            own_node=self.own_node,
        )

    def dev_root(self) -> str:
        return dev_root(self.container_root, self.host_root)
