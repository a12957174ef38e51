"""The MPS pipe directory's budget: the stand-in daemon refuses a socket path the real
``nvidia-cuda-mps-control`` refuses, the layout fits at the chart's paths, and a plugin
whose plugins directory leaves no room is refused at start in one line."""

import asyncio
import dataclasses
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from drivers.gpu import node
from drivers.gpu.kinds import mpspaths
from tests.pluginharness import NodeDirs
from tests.standin import short_dir
from tests.test_mps import Control

# On an H200 (driver 580.159.04, MPS control 13000), with the pipe directory padded so that
# control_privileged was N bytes: 105 and 106 ran; 107, 108, 109 exited 1, printing nothing,
# leaving control_lock (a file) and log (a FIFO).
REAL_RUNS, REAL_REFUSES = 106, 107
CHART_PLUGINS = Path("/var/lib/kubelet/plugins")
UUID = "GPU-8abd4197-c2c5-76b0-6d28-4c5b250fbb1d"  # the H200 the records were taken on


def _entries(pipe: Path) -> set[str]:
    return {p.name for p in pipe.iterdir()}


@pytest.mark.parametrize("size", [REAL_RUNS, REAL_REFUSES])
def test_the_stand_in_daemon_refuses_a_socket_path_as_the_real_one(size: int) -> None:
    with short_dir() as root:
        control = Control(root / "bin")
        pad = size - len(f"{root}/") - len("/control_privileged")
        pipe = root / ("p" * pad)
        pipe.mkdir()
        assert mpspaths.socket_bytes(pipe / "control_privileged") == size
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        daemon = subprocess.Popen(
            [control.path, "-f"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 10
            while daemon.poll() is None and not (pipe / "control").exists():
                assert time.monotonic() < deadline, "the stand-in neither ran nor exited"
                time.sleep(0.02)
            if size <= mpspaths.MAX_SOCKET_PATH:
                assert daemon.poll() is None
                assert {"control", "control_privileged", "control_lock", "log"} <= _entries(pipe)
            else:
                assert daemon.wait(10) == 1 and daemon.stdout is not None
                assert daemon.stdout.read() == b""  # as the real one: not a word
                assert _entries(pipe) == {"control_lock", "log"}
        finally:
            daemon.kill()
            daemon.wait()


def test_the_layout_fits_at_the_charts_paths_and_is_stable() -> None:
    plugin_dir = CHART_PLUGINS / "gpu.nvidia.com"
    pipe = mpspaths.pipe_dir(plugin_dir, UUID)
    # A digest of the UUID alone: the same name at every start and in every release.
    assert pipe == Path("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/a75d6d8a06a3")
    sizes = {n: mpspaths.socket_bytes(pipe / n) for n in mpspaths.SOCKET_NAMES}
    assert sizes == {"control": 64, "control_privileged": 75}
    assert mpspaths.socket_bytes(mpspaths.longest_socket(plugin_dir)) == 75
    mpspaths.check(plugin_dir)
    # The last release's pipe there, which no real daemon could serve.
    legacy = plugin_dir / "kinds/gpu/mps" / UUID / "pipe/control_privileged"
    assert mpspaths.socket_bytes(legacy) == 118 > mpspaths.MAX_SOCKET_PATH


def test_the_longest_plugins_directory_that_fits_is_55_bytes() -> None:
    longest = Path("/" + "k" * 46 + "/plugins")  # a kubelet root of 47 bytes
    assert mpspaths.socket_bytes(longest) == 55
    mpspaths.check(longest / "gpu.nvidia.com")
    with pytest.raises(mpspaths.PipePathTooLongError, match="107 bytes, over the 106-byte"):
        mpspaths.check(Path("/k" + longest.as_posix()[2:] + "x") / "gpu.nvidia.com")


async def test_a_plugin_whose_plugins_directory_leaves_no_room_is_refused_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with short_dir() as root:
        dirs = NodeDirs(root)
        # Room for the gRPC sockets (105 bytes), none for MPS's: 56 bytes of plugins dir.
        plugins = root / ("d" * (56 - len(str(root)) - 1))
        assert mpspaths.socket_bytes(plugins) == 56
        config = dataclasses.replace(
            dirs.node_config(root / "kubeconfig", node_name="n", profile="p5.48xlarge"),
            plugins_dir=plugins,
        )
        with caplog.at_level(logging.INFO):
            assert await asyncio.wait_for(node.run(config, asyncio.Event()), 30) == 2
        (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
        said = f"{line.getMessage()} {getattr(line, 'error', '')}"
        plugin_dir = plugins / "gpu.nvidia.com"
        assert f"{plugin_dir} (71 bytes)" in said, said
        assert "107 bytes, over the 106-byte limit" in said, said
        assert not plugins.exists()  # refused before it made anything
