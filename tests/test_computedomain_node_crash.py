"""SIGKILL of the node process at each step of a ComputeDomain claim's prepare and unprepare,
then a restart: a claim that is gone leaves no node label, domain directory, record or
reservation; one that is still there is prepared by the kubelet's retry (NVIDIA's
PrepareAborted: a stale entry retried), and never half-prepared."""

import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests import cdnode
from tests.cdnode import CD_UID
from tests.pluginharness import UNPREPARE_STEPS, NodeDirs, PluginProcess, wait_for

CHANNEL_STEPS = ["after-claim-record", "cd-after-label", "after-side-effects", "after-cdi-write"]
DAEMON_STEPS = ["after-claim-record", "cd-after-domain-dir", "after-cdi-write"]


def _leftovers(dirs: NodeDirs) -> list[str]:
    """Every record, reservation, spec and domain directory of the ComputeDomain driver."""
    data = dirs.plugins / names.DRIVER_NAME
    found = [
        str(p.relative_to(data)) for sub in ("claims", "devices") for p in (data / sub).iterdir()
    ]
    found += [str(p.relative_to(data)) for p in (data / "domains").glob("*")]
    found += [p.name for p in dirs.cdi.glob("k8s.compute-domain.nvidia.com-*")]
    return sorted(found)


async def _die_at(plugin: PluginProcess, dirs: NodeDirs, step: str, claim: Any) -> None:
    await plugin.wait_ready(60)
    async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
        if step in UNPREPARE_STEPS:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
            with pytest.raises(grpc.aio.AioRpcError):
                await kubelet.unprepare([claim])
        else:
            with pytest.raises(grpc.aio.AioRpcError):
                await kubelet.prepare([claim])
    assert await plugin.wait_exit() == -signal.SIGKILL


async def _restart(dirs: NodeDirs, kubeconfig: Path, processes: list[Any]) -> PluginProcess:
    plugin = cdnode.start(dirs, kubeconfig)
    processes.append(plugin)
    await plugin.wait_ready(60)
    return plugin


@pytest.mark.parametrize(
    ("kind", "step"),
    [
        *(("channel", s) for s in CHANNEL_STEPS + UNPREPARE_STEPS),
        *(("daemon", s) for s in DAEMON_STEPS),
    ],
)
async def test_a_claim_gone_after_a_kill_leaves_nothing(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    processes: list[Any],
    kind: str,
    step: str,
) -> None:
    cdnode.seed(apiserver)
    cdnode.ready(apiserver)
    api, kubeconfig = kube
    claim = await (cdnode.channel_claim(api) if kind == "channel" else cdnode.daemon_claim(api))
    doomed = cdnode.start(dirs, kubeconfig, crashpoint=step)
    processes.append(doomed)
    await _die_at(doomed, dirs, step, claim)
    if step == "cd-after-label":
        assert cdnode.node_label(apiserver) == CD_UID
    apiserver.delete("resourceclaims", claim.name, claim.namespace)
    plugin = await _restart(dirs, kubeconfig, processes)
    # Recovery undoes an interrupted claim's side effects; the reconciler (at start) the rest.
    await wait_for(lambda: not _leftovers(dirs), f"nothing left, not {_leftovers(dirs)}", 30)
    assert cdnode.node_label(apiserver) is None
    assert await plugin.terminate() == 0


@pytest.mark.parametrize("step", ["after-claim-record", "cd-after-label"])
async def test_a_prepare_killed_and_retried_is_prepared_whole(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    processes: list[Any],
    step: str,
) -> None:
    cdnode.seed(apiserver)
    cdnode.ready(apiserver)
    api, kubeconfig = kube
    claim = await cdnode.channel_claim(api)
    doomed = cdnode.start(dirs, kubeconfig, crashpoint=step)
    processes.append(doomed)
    await _die_at(doomed, dirs, step, claim)
    plugin = await _restart(dirs, kubeconfig, processes)
    async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
        result = (await kubelet.prepare([claim])).claims[claim.uid]
        assert result.error == ""
        assert cdnode.node_label(apiserver) == CD_UID
        assert f"k8s.compute-domain.nvidia.com-claim_{claim.uid}.json" in _leftovers(dirs)
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert _leftovers(dirs) == [] and cdnode.node_label(apiserver) is None
    assert await plugin.terminate() == 0
