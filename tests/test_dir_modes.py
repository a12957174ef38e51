"""Directory modes do not depend on the umask: a real plugin process started with umask 000."""

import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.common.fsutil import ensure_dir
from kubeletplugin import dirs as plugin_dirs
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, PluginProcess, api_client, create_claim, create_node

NODE = "node-u"


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="du") as name:
        yield NodeDirs(Path(name) / "host")  # nothing below exists: the plugin makes it all


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def test_directories_get_explicit_modes_under_umask_000(
    apiserver: LocalApiServer, dirs: NodeDirs
) -> None:
    dirs.root.mkdir()
    kubeconfig = dirs.root / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    api = await api_client(kubeconfig)
    plugin = None
    try:
        await create_node(api, NODE)
        claim = await create_claim(api, "c", node=NODE, devices=["gpu-0"])
        plugin = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, umask=0)
        await plugin.wait_ready()
        async with await KubeletSim.register(plugin.paths.registration) as kubelet:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        assert {
            "registry": _mode(dirs.registry),
            "plugins": _mode(dirs.plugins),
            "plugin": _mode(dirs.plugin_data),
            "cdi": _mode(dirs.cdi),
        } == {
            "registry": plugin_dirs.PRIVATE,
            "plugins": plugin_dirs.PRIVATE,
            "plugin": plugin_dirs.PRIVATE,
            "cdi": plugin_dirs.CDI_ROOT,
        }
        # Nothing the plugin made is writable by group or others (sockets: group, for
        # the kubelet's group, by design).
        for top in (dirs.registry, dirs.plugins, dirs.cdi):
            for path in (top, *top.rglob("*")):
                if path.is_symlink():  # a device reservation: Linux ignores a link's mode
                    continue
                allowed = 0o020 if stat.S_ISSOCK(path.lstat().st_mode) else 0
                assert _mode(path) & 0o022 & ~allowed == 0, f"{path}: {oct(_mode(path))}"
    finally:
        if plugin is not None:
            plugin.kill()
        await api.close()


def test_an_existing_directory_of_ours_is_narrowed_and_a_shared_one_kept(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    ours.chmod(0o777)
    ensure_dir(ours, plugin_dirs.PRIVATE, ours=True)
    assert _mode(ours) == plugin_dirs.PRIVATE
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    ensure_dir(shared / "a" / "b", plugin_dirs.CDI_ROOT)
    assert _mode(shared) == 0o775
    assert _mode(shared / "a") == _mode(shared / "a" / "b") == plugin_dirs.CDI_ROOT
