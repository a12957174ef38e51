"""A fresh node, as NVIDIA's users meet it (kubernetes-sigs/dra-driver-nvidia-gpu #1380).

Where no NVIDIA client has run yet, ``/dev/nvidia*`` do not exist when the plugin starts. A
prepare then must not answer success with a spec whose device nodes the host lacks (the
container would get no GPU): it makes them as NVIDIA's tools do, or fails the claim with the
reason, and the toolkit's edits had at start are had again once the nodes are there.

The driver root is a directory whose ``dev/`` fills late; its tools are stand-ins that make
regular files where the real ones make character devices, and refuse the arguments the real
ones refuse: ``nvidia-ctk`` (``cdi generate``, which like the real one names only the nodes
it finds, and ``system create-device-nodes``), the driver's ``nvidia-modprobe``, run under
``chroot`` (a stand-in on PATH: it runs the root's command with the root named).
"""

import asyncio
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from driver.common.errors import RetryableError
from driver.kube.session import Session
from kubeletplugin import cdi
from kubeletplugin.containertoolkit import (
    DeviceNodesError,
    Toolkit,
    creation_plan,
    node_names,
)
from kubeletplugin.state import DeviceState
from tests.simroot import ctk_binary
from tests.test_state import Node, _config, _inventory

CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

_CTK = r"""#!/bin/sh
echo "$@" >> @LOG@
case "$1 $2" in
"cdi generate")
  root=
  for a in "$@"; do case "$a" in --driver-root=*) root="${a#--driver-root=}";; esac; done
  nodes=
  for n in "$root"/dev/nvidia*; do
    if [ -e "$n" ] && [ ! -d "$n" ]; then nodes="$nodes{\"path\":\"/dev/${n##*/}\"},"; fi
  done
  lib=/usr/lib64/libcuda.so.1
  printf '{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[],"containerEdits":'
  printf '{"deviceNodes":[%s],"mounts":[{"hostPath":"%s","containerPath":"%s"}]}}\n' \
    "${nodes%,}" "$root$lib" "$lib"
  ;;
"system create-device-nodes")
  shift 2
  root=/; dev=; control=
  for a in "$@"; do case "$a" in
    --control-devices) control=1;;
    --load-kernel-modules|--dry-run) ;;
    --driver-root=*|--root=*) root="${a#*=}";;
    --dev-root=*) dev="${a#*=}";;
    *) echo "Incorrect Usage: flag provided but not defined: ${a%%=*}" >&2; exit 1;;
  esac; done
  if [ -e @FAIL@ ]; then
    echo 'failed to load NVIDIA kernel modules: failed to load module nvidia' >&2; exit 1
  fi
  if [ -n "$control" ]; then
    for n in nvidiactl nvidia-modeset nvidia-uvm nvidia-uvm-tools; do
      touch "${dev:-$root}/dev/$n"
    done
  fi
  ;;
*) echo "No help topic for '$1'" >&2; exit 3;;
esac
"""

_MODPROBE = r"""#!/bin/sh
echo "$@" >> @LOG@
if [ -z "$STANDIN_ROOT" ]; then echo "not run under the driver root" >&2; exit 2; fi
dev="$STANDIN_ROOT/dev"; uvm=; modeset=; minors=
while [ $# -gt 0 ]; do case "$1" in
  -u|--unified-memory) uvm=1;;
  -m|--modeset) modeset=1;;
  -c) shift; minors="$minors $1";;
  --create-nvidia-device-file=*) minors="$minors ${1#*=}";;
  *) echo "nvidia-modprobe: Unrecognized option: \"$1\"" >&2; exit 1;;
esac; shift; done
for m in $minors; do
  if grep -qx "$m" @FAIL@ 2>/dev/null; then
    echo "nvidia-modprobe: failed to create /dev/nvidia$m" >&2; exit 1
  fi
  if [ -n "$uvm" ]; then touch "$dev/nvidia-uvm" "$dev/nvidia-uvm-tools"
  elif [ "$m" = 255 ]; then touch "$dev/nvidiactl"
  else touch "$dev/nvidia$m"; fi
done
if [ -n "$modeset" ]; then touch "$dev/nvidia-modeset"; fi
"""

_CHROOT = r"""#!/bin/sh
if [ $# -lt 2 ]; then echo "chroot: missing operand" >&2; exit 125; fi
root="$1"; shift; cmd="$1"; shift
case "$cmd" in /*) ;; *) echo "chroot stand-in: $cmd is no path in the root" >&2; exit 125;; esac
if [ ! -x "$root$cmd" ]; then
  echo "chroot: failed to run command '$cmd': No such file or directory" >&2; exit 127
fi
STANDIN_ROOT="$root" exec "$root$cmd" "$@"
"""


@dataclass
class Tool:
    path: Path
    log: Path
    fail: Path

    def calls(self) -> list[str]:
        calls = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return calls


def _tool(path: Path, script: str, state: Path) -> Tool:
    path.parent.mkdir(parents=True, exist_ok=True)
    log, fail = state / f"{path.name}.calls", state / f"{path.name}.fail"
    path.write_text(script.replace("@LOG@", str(log)).replace("@FAIL@", str(fail)))
    path.chmod(0o755)
    return Tool(path, log, fail)


@dataclass
class FreshNode:
    node: Node
    root: Path
    ctk: Tool
    modprobe: Tool

    def appear(self, *names: str) -> None:
        """The driver (udev, another NVIDIA client) makes these nodes."""
        for name in names:
            (self.root / "dev" / name).touch()

    def on_host(self, spec: dict[str, Any]) -> dict[str, bool]:
        """Each device node the spec names that the host must hold -> whether it does."""
        return {p: (self.root / p.lstrip("/")).exists() for p in cdi.host_device_nodes(spec)}

    def minor(self, device: str) -> int:
        return self.node.inventory.by_device_name()[device].minor


@pytest.fixture
def fresh(
    api_client: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FreshNode]:
    """A node whose driver root (the host's /, nvidiaDriverRoot=/) has no device node yet."""
    root, state = tmp_path / "host", tmp_path / "tools"
    (root / "dev").mkdir(parents=True)
    state.mkdir()
    ctk = _tool(root / "usr" / "bin" / "nvidia-ctk", _CTK, state)
    modprobe = _tool(root / "usr" / "bin" / "nvidia-modprobe", _MODPROBE, state)
    _tool(tmp_path / "bin" / "chroot", _CHROOT, state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    config = _config(
        tmp_path, nvml_mode="system", container_driver_root=root, nvidia_driver_root=Path("/")
    )
    inventory = _inventory("p5.48xlarge", tmp_path)
    # Opened by each test (_open), when its node is as it wants it.
    unopened = cast(DeviceState, None)
    yield FreshNode(Node(api_client, config, inventory, unopened), root, ctk, modprobe)


async def _open(fresh: FreshNode) -> DeviceState:
    return await fresh.node.restart()


async def test_first_prepare_on_a_fresh_node_makes_the_device_nodes(fresh: FreshNode) -> None:
    await _open(fresh)
    assert fresh.ctk.calls()[0].startswith("cdi generate")  # the edits, had with no node
    ref = await fresh.node.claim("first", ["gpu-1"])
    result = (await fresh.node.state.prepare([ref]))[ref.uid]
    assert result.error == ""
    spec = fresh.node.spec(ref.uid)
    minor = fresh.minor("gpu-1")
    on_host = fresh.on_host(spec)
    assert set(on_host) >= {f"/dev/nvidia{minor}", *(f"/dev/{n}" for n in CONTROL)}
    assert all(on_host.values()), f"the spec names device nodes the host lacks: {on_host}"
    # Made as the toolkit makes them: the control nodes by nvidia-ctk, the GPU's by the
    # driver's nvidia-modprobe under the driver root; then the toolkit's edits again.
    calls = fresh.ctk.calls()
    assert calls[0] == (
        "system create-device-nodes --control-devices --load-kernel-modules "
        f"--driver-root={fresh.root} --dev-root={fresh.root}"
    )
    assert calls[1].startswith("cdi generate") and len(calls) == 2
    assert fresh.modprobe.calls() == [f"-c {minor}"]
    # What the toolkit's edits hold now that it found the nodes (nvidia-modeset, its own).
    assert {"path": "/dev/nvidia-modeset"} in spec["containerEdits"]["deviceNodes"]


async def test_nodes_that_cannot_be_made_fail_the_claim_with_the_reason(
    fresh: FreshNode,
) -> None:
    await _open(fresh)
    fresh.ctk.fail.touch()  # the kernel module does not load yet
    ref = await fresh.node.claim("early", ["gpu-2"])
    result = (await fresh.node.state.prepare([ref]))[ref.uid]
    assert "/dev/nvidiactl" in result.error and "are not on the host" in result.error
    assert "failed to load NVIDIA kernel modules" in result.error  # what the tool said
    assert "nvidia-ctk system create-device-nodes" in result.error  # what to do
    assert not fresh.node.spec_path(ref.uid).exists()
    assert fresh.node.reservations() == {}
    assert issubclass(DeviceNodesError, RetryableError)
    # The driver loads; the kubelet's retry succeeds, with the toolkit's edits had again.
    fresh.ctk.fail.unlink()
    fresh.ctk.calls()
    result = (await fresh.node.state.prepare([ref]))[ref.uid]
    assert result.error == ""
    spec = fresh.node.spec(ref.uid)
    assert all(fresh.on_host(spec).values())
    assert {"path": "/dev/nvidia-modeset"} in spec["containerEdits"]["deviceNodes"]


async def test_a_claim_whose_node_cannot_be_made_fails_alone(fresh: FreshNode) -> None:
    fresh.appear(*CONTROL, f"nvidia{fresh.minor('gpu-0')}")
    await _open(fresh)
    fresh.modprobe.fail.write_text(f"{fresh.minor('gpu-3')}\n")
    ok, bad = await fresh.node.claim("ok", ["gpu-0"]), await fresh.node.claim("bad", ["gpu-3"])
    results = await fresh.node.state.prepare([ok, bad])
    assert results[ok.uid].error == ""
    assert f"/dev/nvidia{fresh.minor('gpu-3')} are not on the host" in results[bad.uid].error
    assert "nvidia-modprobe: failed to create" in results[bad.uid].error
    assert fresh.node.reservations() == {"gpu-0": ok.uid}


async def test_edits_had_at_start_are_had_again_once_the_nodes_appear(fresh: FreshNode) -> None:
    await _open(fresh)
    fresh.ctk.calls()
    # The driver makes every node (udev) before the first claim: nothing to make, but the
    # toolkit's edits had without them are stale.
    fresh.appear(
        *CONTROL, "nvidia-modeset", *(f"nvidia{g.minor}" for g in fresh.node.inventory.gpus)
    )
    first, second = await fresh.node.claim("a", ["gpu-0"]), await fresh.node.claim("b", ["gpu-1"])
    assert (await fresh.node.state.prepare([first]))[first.uid].error == ""
    assert (await fresh.node.state.prepare([second]))[second.uid].error == ""
    assert [c.split()[:2] for c in fresh.ctk.calls()] == [["cdi", "generate"]]  # once
    assert fresh.modprobe.calls() == []
    for ref in (first, second):
        spec = fresh.node.spec(ref.uid)
        assert {"path": "/dev/nvidia-modeset"} in spec["containerEdits"]["deviceNodes"]
        assert all(fresh.on_host(spec).values())


async def test_a_driver_containers_nodes_are_found_once_it_makes_them(
    api_client: Session, tmp_path: Path
) -> None:
    """The GPU Operator's driver root (/run/nvidia/driver): where its dev/ holds no node
    yet the host's /dev is where the toolkit looks; once the driver container makes its
    nodes, specs name those (the dev root had at start is had again)."""
    root, state = tmp_path / "driver", tmp_path / "tools"
    (root / "dev").mkdir(parents=True)
    state.mkdir()
    ctk = _tool(root / "usr" / "bin" / "nvidia-ctk", _CTK, state)
    host_root = Path("/run/nvidia/driver")
    config = _config(
        tmp_path, nvml_mode="system", container_driver_root=root, nvidia_driver_root=host_root
    )
    node = Node(api_client, config, _inventory("p5.48xlarge", tmp_path), cast(DeviceState, None))
    await node.restart()
    early = await node.claim("early", ["gpu-0"])
    assert (await node.state.prepare([early]))[early.uid].error == ""
    # The host's /dev, which this container does not see live: named as the toolkit would.
    minors = {name: g.minor for name, g in node.inventory.by_device_name().items()}
    nodes = cdi.host_device_nodes(node.spec(early.uid))
    assert f"/dev/nvidia{minors['gpu-0']}" in nodes and "/dev/nvidiactl" in nodes
    assert all(p.startswith("/dev/") for p in nodes), nodes
    for name in (*CONTROL, *(f"nvidia{g.minor}" for g in node.inventory.gpus)):
        (root / "dev" / name).touch()
    ctk.calls()
    late = await node.claim("late", ["gpu-1"])
    assert (await node.state.prepare([late]))[late.uid].error == ""
    nodes = cdi.host_device_nodes(node.spec(late.uid))
    assert f"{host_root}/dev/nvidia{minors['gpu-1']}" in nodes
    assert f"{host_root}/dev/nvidiactl" in nodes
    assert all(p.startswith(f"{host_root}/dev/") for p in nodes), nodes
    assert [c.split()[:2] for c in ctk.calls()] == [["cdi", "generate"]]


def test_nodes_the_runtime_makes_itself_need_none_on_the_host() -> None:
    spec = {
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
        "devices": [
            {
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"},
                        {"path": "/dev/nvidiactl"},
                        {
                            "path": "/dev/nvidia-caps-imex-channels/channel0",
                            "type": "c",
                            "major": 234,
                        },
                    ]
                }
            }
        ],
    }
    assert cdi.host_device_nodes(spec) == ["/dev/nvidiactl", "/run/nvidia/driver/dev/nvidia0"]


def test_creation_plan_is_the_toolkits_and_the_drivers() -> None:
    names, elsewhere = node_names(
        ["/dev/nvidiactl", "/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap12", "/other/x"], "/"
    )
    assert elsewhere == ["/other/x"]
    modprobe = ["chroot", "/driver-root", "/usr/bin/nvidia-modprobe"]
    commands, left = creation_plan(
        names,
        ctk=Path("/driver-root/usr/bin/nvidia-ctk"),
        modprobe=modprobe,
        container_root=Path("/driver-root"),
        dev_parent=Path("/driver-root"),
    )
    assert commands == [
        [
            "/driver-root/usr/bin/nvidia-ctk",
            "system",
            "create-device-nodes",
            "--control-devices",
            "--load-kernel-modules",
            "--driver-root=/driver-root",
            "--dev-root=/driver-root",
        ],
        [*modprobe, "-c", "3"],
    ]
    assert left == ["nvidia-caps/nvidia-cap12"]  # a MIG capability: made with its instance
    # No toolkit: the driver's nvidia-modprobe makes the control nodes too.
    commands, left = creation_plan(
        ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"],
        ctk=None,
        modprobe=modprobe,
        container_root=Path("/driver-root"),
        dev_parent=Path("/driver-root"),
    )
    assert commands == [[*modprobe, "-c", "255"], [*modprobe, "-u", "-c", "0"]]
    assert left == []
    # Neither: nothing to run, and the reason names the nodes.
    assert creation_plan(
        ["nvidia0"], ctk=None, modprobe=None, container_root=Path("/"), dev_parent=Path("/")
    ) == ([], ["nvidia0"])


def test_the_real_toolkit_takes_our_arguments(tmp_path: Path) -> None:
    """The argv of :func:`creation_plan` as NVIDIA's nvidia-ctk parses it (dry run: it loads
    and makes nothing; on a machine without the driver it then finds no NVIDIA device)."""
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    (tmp_path / "dev").mkdir()
    (argv,), _ = creation_plan(
        ["nvidiactl"], ctk=ctk, modprobe=None, container_root=tmp_path, dev_parent=tmp_path
    )
    done = subprocess.run(
        [*argv, "--dry-run"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "Incorrect Usage" not in done.stderr + done.stdout
    # It took the driver root as the root to load the modules from (logged, not run).
    assert f"Running: chroot {tmp_path} /sbin/modprobe nvidia-uvm" in done.stderr, done.stderr
    assert list((tmp_path / "dev").iterdir()) == []


async def test_a_simulated_node_without_its_own_dev_checks_nothing(tmp_path: Path) -> None:
    # A simulated root seen at the same path from the host, as the sandbox's.
    toolkit = Toolkit(tmp_path, tmp_path, lambda _: False, simulated=True)
    check = await asyncio.to_thread(toolkit.check_nodes, ["/dev/nvidia0"])
    assert check.missing == () and check.dev_root == "/"
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    check = await asyncio.to_thread(toolkit.check_nodes, [f"{tmp_path}/dev/nvidia0"])
    assert check.missing == (f"{tmp_path}/dev/nvidia0",)
