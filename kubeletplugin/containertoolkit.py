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

On a node where no NVIDIA client has run yet the device nodes may not exist (NVIDIA's
issue 1380): nothing makes them but a user-space client of the driver. A spec naming a node
the host lacks starts no container, and the toolkit's edits made then lack the nodes it
found missing. So a prepare checks the nodes its spec names (:meth:`Toolkit.check_nodes`),
makes the missing ones as the toolkit does (:meth:`Toolkit.create_nodes`: ``nvidia-ctk
system create-device-nodes`` for the control nodes, the driver's ``nvidia-modprobe`` for a
GPU's, both under the driver root), and the edits are made again once the host's nodes
differ from those they were made with.
"""

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from driver.common.errors import PermanentError, RetryableError
from driver.common.logs import kv

log = logging.getLogger(__name__)

_CTK_LOCATIONS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/toolkit")
_MODPROBE_LOCATIONS = ("usr/bin", "usr/sbin", "bin", "sbin")
_TIMEOUT_S = 120.0
_NODE_TIMEOUT_S = 30.0
# Spec-level edits only (toolkit v1.19 on); what a toolkit before that says of the flag.
_NO_DEVICE = "--device-id=none"
_UNKNOWN_FLAG = "flag provided but not defined"

# What ``nvidia-ctk system create-device-nodes --control-devices`` makes (its nvdevices).
CONTROL_NODES = frozenset({"nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"})
# nvidia-modprobe's arguments for each control node, where the toolkit is not there.
_MODPROBE_CONTROL = {
    "nvidiactl": ("-c", "255"),
    "nvidia-uvm": ("-u", "-c", "0"),
    "nvidia-uvm-tools": ("-u", "-c", "0"),
    "nvidia-modeset": ("-m",),
}
_GPU_NODE = re.compile(r"nvidia(\d+)")

# (container root, host root) -> (the device nodes seen when made, the edits).
_cache: dict[tuple[str, str], tuple[frozenset[str], dict[str, Any]]] = {}


class ToolkitError(PermanentError):
    """The container toolkit is missing or failed: no usable CDI spec can be written."""


class DeviceNodesError(RetryableError):
    """Device nodes a claim's spec names are not on the host and could not be made: a
    later try succeeds once the driver is loaded and they exist."""


@dataclass(frozen=True, slots=True)
class NodeCheck:
    """The host's device nodes as a prepare finds them: where they are (``dev_root``),
    which of those asked for are missing (host paths), and what of them there is (``seen``,
    to tell whether the toolkit's edits were made with the same)."""

    dev_root: str
    missing: tuple[str, ...] = ()
    seen: frozenset[str] = frozenset()


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


def node_names(paths: Sequence[str], dev_root: str) -> tuple[list[str], list[str]]:
    """Pure: host paths of device nodes -> their names under ``<dev_root>/dev``
    (``nvidia0``, ``nvidia-caps/nvidia-cap3``), and the paths that are not under it."""
    dev = PurePosixPath(dev_root) / "dev"
    names, elsewhere = [], []
    for path in paths:
        p = PurePosixPath(path)
        if p.is_relative_to(dev) and p != dev:
            names.append(str(p.relative_to(dev)))
        else:
            elsewhere.append(path)
    return names, elsewhere


def creation_plan(
    names: Sequence[str],
    *,
    ctk: Path | None,
    modprobe: Sequence[str] | None,
    container_root: Path,
    dev_parent: Path,
) -> tuple[list[list[str]], list[str]]:
    """Pure: the commands that make the missing device nodes ``names`` (under dev/) as
    NVIDIA's tools make them, and the names none of them makes.

    Control nodes: ``nvidia-ctk system create-device-nodes --control-devices
    --load-kernel-modules`` (the GPU Operator's and ``nvidia-cdi-refresh``'s way; it loads
    nvidia-uvm, whose major exists only then), its modules from ``--driver-root`` and its
    nodes under ``--dev-root``; the driver's ``nvidia-modprobe`` where the toolkit is not
    there. A GPU's node: ``nvidia-modprobe -c <minor>`` (what libnvidia-ml runs itself);
    ``modprobe`` is its command line, run under the driver root.
    """
    commands: list[list[str]] = []
    left: list[str] = []
    control = [n for n in names if n in CONTROL_NODES]
    if control and ctk is not None:
        commands.append(
            [
                str(ctk),
                "system",
                "create-device-nodes",
                "--control-devices",
                "--load-kernel-modules",
                f"--driver-root={container_root}",
                f"--dev-root={dev_parent}",
            ]
        )
    elif control and modprobe is not None:
        commands += [[*modprobe, *a] for a in dict.fromkeys(_MODPROBE_CONTROL[n] for n in control)]
    else:
        left += control
    for name in names:
        if name in CONTROL_NODES:
            continue
        gpu = _GPU_NODE.fullmatch(name)
        if gpu is not None and modprobe is not None:
            commands.append([*modprobe, "-c", gpu.group(1)])
        else:
            left.append(name)
    return commands, left


def missing_message(missing: Sequence[str], problems: Sequence[str]) -> str:
    """Pure: why a claim's spec cannot be given, and what to do."""
    tried = f" ({'; '.join(problems)})" if problems else ""
    return (
        f"device nodes {', '.join(missing)} are not on the host and could not be made{tried}; "
        "a container given this claim would have no GPU. The NVIDIA driver may not be loaded "
        "yet (a fresh node): the kubelet retries. To make them by hand, run on the node "
        "`nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules` "
        "and `nvidia-smi` (which makes each GPU's node)"
    )


def _mtimes(dev_dir: str) -> tuple[int, int]:
    times = []
    for directory in (dev_dir, dev_dir + "/dri"):
        try:
            times.append(os.stat(directory).st_mtime_ns)  # noqa: PTH116
        except OSError:
            times.append(-1)
    return times[0], times[1]


# dev dir -> its and its dri/'s mtimes, and the NVIDIA nodes listed then.
_listed: dict[str, tuple[tuple[int, int], frozenset[str]]] = {}


def _seen(dev_dir: str) -> frozenset[str]:
    """Blocking: the NVIDIA nodes under ``dev_dir`` (and dri/), which the toolkit's edits
    depend on. Listed again only when a directory's mtime says an entry came or went: two
    stats at most prepares, where a host's /dev takes a tenth of a millisecond to list.
    Strings, not paths, here and in what calls it at every prepare: a path costs more than
    a stat."""
    mtimes = _mtimes(dev_dir)
    last = _listed.get(dev_dir)
    if last is not None and last[0] == mtimes:
        return last[1]
    try:
        names = [n for n in os.listdir(dev_dir) if n.startswith("nvidia")]  # noqa: PTH208
    except OSError:
        names = []
    with contextlib.suppress(OSError):
        names += ["dri/" + n for n in os.listdir(dev_dir + "/dri")]  # noqa: PTH208
    seen = frozenset(names)
    _listed[dev_dir] = (mtimes, seen)
    return seen


def _dev_dir(container_root: Path, host_root: Path, root: str | None = None) -> str:
    """Blocking (a stat, unless ``root`` is given): the host's device directory as this
    container sees it."""
    root = dev_root(container_root, host_root) if root is None else root
    return _in_container(root.rstrip("/") + "/dev", container_root, host_root) or (
        root.rstrip("/") + "/dev"
    )


def _in_container(host_path: str, container_root: Path, host_root: Path) -> str | None:
    """Pure: where this container sees ``host_path``: under the driver root's mount, which
    holds the host's ``/dev``, live, when that root is ``/``; None when the path is not
    under the driver root (this container's own ``/dev`` is a copy made at its start)."""
    host = str(host_root).rstrip("/") + "/"
    if not host_path.startswith(host):
        return None
    return str(container_root).rstrip("/") + "/" + host_path[len(host) :]


def _find_modprobe(container_root: Path) -> PurePosixPath | None:
    """The driver's nvidia-modprobe, as a path inside the driver root."""
    for location in _MODPROBE_LOCATIONS:
        if (container_root / location / "nvidia-modprobe").is_file():
            return PurePosixPath("/") / location / "nvidia-modprobe"
    return None


async def _run(argv: Sequence[str], timeout_s: float) -> tuple[bytes, str]:
    """Run one of the toolkit's or the driver's commands: what it printed on stdout, and ""
    when it exited 0, else why not (with the last lines it wrote on stderr)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        return b"", f"{' '.join(argv)}: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()  # a modprobe stuck in the kernel, a toolkit stuck on a GPU: it says so
        await proc.wait()
        return b"", f"{' '.join(argv)}: no answer in {timeout_s:g}s"
    if proc.returncode != 0:
        said = (err or out).decode(errors="replace").strip().splitlines()
        return out, f"{' '.join(argv)} exited with {proc.returncode}: {' '.join(said[-3:])}"
    return out, ""


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
    # The spec-level edits alone: with no device asked for, the toolkit asks NVML for no GPU,
    # so a GPU fallen off the bus (its handle answers GPU_IS_LOST, and the toolkit exits 1)
    # cannot keep the whole node from serving; each claim spec adds its GPUs' nodes itself.
    stdout, failed = await _run([*argv, _NO_DEVICE], _TIMEOUT_S)
    if _UNKNOWN_FLAG in failed:
        log.warning(
            "nvidia-ctk predates --device-id (toolkit v1.19): it visits every GPU, and one "
            "lost GPU fails it",
            extra=kv(ctk=str(ctk)),
        )
        stdout, failed = await _run(argv, _TIMEOUT_S)
    if failed:
        raise ToolkitError(failed)
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
    """Spec-level container edits every claim spec gets; computed once per process, and
    again when the host's NVIDIA device nodes differ from those they were computed with (a
    node missing then is missing from them: the toolkit skips what it does not find)."""
    if nvml_mode == "simulated":
        # Simulated GPUs have no driver install to expose: the spec's device nodes and
        # environment are the whole contract tests and the demo observe.
        return {}
    key = (str(container_root), str(host_root))
    # Seen before the toolkit looks: a node that appears meanwhile makes the next check
    # differ, and the edits are made again then.
    seen = await asyncio.to_thread(lambda: _seen(_dev_dir(container_root, host_root)))
    cached = _cache.get(key)
    if cached is None or cached[0] != seen:
        if cached is not None:
            log.info(
                "the host's NVIDIA device nodes changed; making the toolkit's edits again",
                extra=kv(
                    appeared=",".join(sorted(seen - cached[0])),
                    gone=",".join(sorted(cached[0] - seen)),
                ),
            )
        cached = (seen, await _generate(container_root, host_root, own_node))
        _cache[key] = cached
    return cached[1]


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

    def check_nodes(self, paths: Sequence[str]) -> NodeCheck:
        """Blocking (stats and one listing): which of the host paths ``paths`` of device
        nodes the host lacks, as of now. Only what this container sees live is checked: the
        driver root's mount, which holds the host's ``/dev`` when that root is ``/``; its
        own ``/dev`` is a copy made at its start, which a node made since is missing from.
        A simulated node's nodes are those under its own root: with none there, there is
        nothing of the host's to check."""
        root = self.dev_root()
        if self.simulated and root == "/":
            return NodeCheck(root)
        missing = []
        for p in paths:
            seen_at = _in_container(p, self.container_root, self.host_root)
            if seen_at is not None and not os.path.exists(seen_at):  # noqa: PTH110
                missing.append(p)
        return NodeCheck(
            root, tuple(missing), _seen(_dev_dir(self.container_root, self.host_root, root))
        )

    async def create_nodes(self, paths: Sequence[str]) -> list[str]:
        """Make the missing device nodes ``paths`` (host paths, under the driver root) as
        NVIDIA's tools do; returns what could not be tried or failed, [] when every command
        succeeded."""
        if self.simulated:
            return ["a simulated node's device nodes are made by its simulation alone"]
        root = await asyncio.to_thread(self.dev_root)
        dev_dir = _dev_dir(self.container_root, self.host_root, root)
        names, elsewhere = node_names(paths, root)
        ctk = await asyncio.to_thread(_find_ctk, self.container_root)
        inside = await asyncio.to_thread(_find_modprobe, self.container_root)
        chroot = shutil.which("chroot")
        # It makes its nodes at /dev: chrooted into the driver root, that is the driver
        # root's, which is the host's when the root is / (the toolkit loads modules so too).
        modprobe = (
            None
            if inside is None or chroot is None
            else [chroot, str(self.container_root), str(inside)]
        )
        commands, left = creation_plan(
            names,
            ctk=ctk,
            modprobe=modprobe,
            container_root=self.container_root,
            dev_parent=Path(dev_dir).parent,
        )
        problems = [f"no tool makes {', '.join(left + elsewhere)}"] if left or elsewhere else []
        for argv in commands:
            _, problem = await _run(argv, _NODE_TIMEOUT_S)
            log.info(
                "making missing device nodes",
                extra=kv(command=" ".join(argv), **({"error": problem} if problem else {})),
            )
            if problem:
                problems.append(problem)
        return problems
