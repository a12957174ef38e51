"""Hostile claim references over the real DRA socket of a real ``gpu-dra kubelet-plugin``.

Anyone who can reach the socket can send any uid, namespace and name. None of them may
reach the file system or the API server's URL space unchecked: a traversal through the
uid once deleted a file outside the CDI root. The fuzz test sends random and boundary
references and checks that no file around the plugin's directories changed and that
the plugin still prepares a valid claim afterwards.
"""

import hashlib
import os
import random
import string
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from kubeletplugin import names
from kubeletplugin.state import ClaimRef
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, PluginProcess, api_client, create_claim, create_node

NODE = "node-h"
TRAVERSAL = "x/../../victim/x"  # with cdi/k8s.gpu.nvidia.com-claim_x/ present: <root>/victim/x.json


class Node:
    """The local API server, one node, and one plugin process serving it."""

    def __init__(self, api: Any, plugin: PluginProcess) -> None:
        self.api = api
        self.plugin = plugin


@pytest.fixture
async def node(apiserver: LocalApiServer, dirs: NodeDirs) -> AsyncIterator[Node]:
    kubeconfig = dirs.root / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    api = await api_client(kubeconfig)
    await create_node(api, NODE)
    _plant_decoys(dirs)
    plugin = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE)
    try:
        await plugin.wait_ready()
        yield Node(api, plugin)
    finally:
        plugin.kill()
        await api.close()


def _plant_decoys(dirs: NodeDirs) -> None:
    """Files a traversal would reach: next to and above the plugin's directories, and
    directories inside the CDI root whose names a uid can complete."""
    for path in (
        dirs.root / "victim" / "x.json",
        dirs.root / "victim.json",
        dirs.root / "x.json",
        dirs.root / "sentinel" / "deep" / "file",
        dirs.cdi / "k8s.gpu.nvidia.com-claim_x" / "keep.json",
        dirs.cdi / "k8s.gpu.nvidia.com-claim_" / "keep.json",
        dirs.plugins / "other-driver" / "checkpoint.json",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"decoy {path.name}\n")


def _snapshot(dirs: NodeDirs) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under the node's root, except what the plugin owns."""
    owned = {
        dirs.registry,
        dirs.plugin_data,
        dirs.root / "driver-root",
    }
    seen: dict[str, tuple[int, int, str]] = {}
    for top, subdirs, files in os.walk(dirs.root):
        here = Path(top)
        subdirs[:] = [d for d in subdirs if here / d not in owned]
        for name in files:
            path = here / name
            if path.parent == dirs.root and name.startswith("plugin-"):
                continue  # the plugin's log, written by the harness
            if path.parent == dirs.cdi and name.endswith(".json"):
                continue  # the plugin's own specs
            info = path.lstat()
            seen[str(path)] = (
                info.st_mode,
                info.st_size,
                hashlib.sha256(path.read_bytes()).hexdigest(),
            )
        for name in subdirs:
            info = (here / name).lstat()
            seen[str(here / name) + "/"] = (info.st_mode, 0, "")
    return seen


def _our_specs(dirs: NodeDirs) -> list[str]:
    return sorted(p.name for p in dirs.cdi.glob("*.json"))


async def test_a_uid_cannot_traverse_out_of_the_cdi_root(node: Node, dirs: NodeDirs) -> None:
    victim = dirs.root / "victim" / "x.json"
    before = _snapshot(dirs)
    async with await KubeletSim.register(node.plugin.paths.registration) as kubelet:
        out = await kubelet.unprepare([ClaimRef(uid=TRAVERSAL, namespace="default", name="c")])
        assert victim.read_text() == "decoy x.json\n"
        # Never prepared (prepare refuses such a uid): nothing to do.
        assert out.claims[TRAVERSAL].error == ""
        long_uid = "a" * 300  # over NAME_MAX
        out = await kubelet.unprepare([ClaimRef(uid=long_uid, namespace="default", name="c")])
        assert out.claims[long_uid].error == ""
    assert victim.read_text() == "decoy x.json\n"
    assert _snapshot(dirs) == before


async def test_an_invalid_claim_is_an_error_for_that_claim_only(node: Node, dirs: NodeDirs) -> None:
    good = await create_claim(node.api, "good", node=NODE, devices=["gpu-0"])
    hostile = [
        ClaimRef(uid=TRAVERSAL, namespace="default", name="good"),
        ClaimRef(uid=good.uid.upper(), namespace="default", name="good"),
        ClaimRef(uid="0f8fad5b-d9cb-469f-a165-70867728950e", namespace="../x", name="good"),
        ClaimRef(uid="1f8fad5b-d9cb-469f-a165-70867728950e", namespace="default", name="a/b"),
    ]
    async with await KubeletSim.register(node.plugin.paths.registration) as kubelet:
        response = await kubelet.prepare([*hostile, good])
        assert response.claims[good.uid].error == ""
        assert [d.device_name for d in response.claims[good.uid].devices] == ["gpu-0"]
        for ref, problem in zip(hostile, ("uid", "uid", "namespace", "name"), strict=True):
            entry = response.claims[ref.uid]
            assert entry.error.startswith(f"invalid claim {problem}"), entry.error
            assert not entry.devices
    assert _our_specs(dirs) == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]


# ---- fuzz ---------------------------------------------------------------------------------

SEED = int(os.environ.get("GPU_DRA_FUZZ_SEED", "20261201"))
REQUESTS = 150  # seeded, so a failure replays; the test's timeout bounds the time
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"
_BOUNDARY_UIDS = (
    "",
    ".",
    "..",
    "/",
    "//",
    TRAVERSAL,
    "../victim",
    "x/../../../../../../etc/passwd",
    "a" * 255,
    "a" * 256,
    "a" * 4096,
    "\x00",
    UUID + "\x00",
    UUID.upper(),
    UUID + "/..",
    UUID[:-1],
    UUID + "0",
    " " + UUID,
    "\u2215victim",  # division slash: looks like "/"
    "\U0001f600" * 9,
)
_BOUNDARY_NAMESPACES = ("default", "", "..", "../..", "a" * 64, "Default", "kube-system", "\x00")
_BOUNDARY_NAMES = ("good", "", "..", "../../api/v1/secrets", "a/b", "a" * 254, "x?y", "%2e%2e")


def _junk(rng: random.Random) -> str:
    alphabet = string.printable + "\x00\u00e9\u2215\U0001f600/."
    return "".join(rng.choice(alphabet) for _ in range(rng.choice((1, 8, 36, 64, 300))))


def _fuzz_ref(rng: random.Random, real: ClaimRef) -> ClaimRef:
    roll = rng.random()
    if roll < 0.4:
        uid = rng.choice(_BOUNDARY_UIDS)
    elif roll < 0.6:
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))  # valid, no such claim
    elif roll < 0.7:
        uid = real.uid  # the real claim's uid under the wrong names
    else:
        uid = _junk(rng)
    namespace = rng.choice(_BOUNDARY_NAMESPACES) if rng.random() < 0.7 else _junk(rng)
    name = rng.choice(_BOUNDARY_NAMES) if rng.random() < 0.7 else _junk(rng)
    if uid == real.uid and (namespace, name) == (real.namespace, real.name):
        name = "not-" + name  # never the real claim itself: the fuzz prepares nothing
    return ClaimRef(uid=uid, namespace=namespace, name=name)


@pytest.mark.timeout(240)
async def test_fuzzed_claim_references_touch_nothing_and_the_plugin_keeps_serving(
    node: Node, dirs: NodeDirs
) -> None:
    rng = random.Random(SEED)
    real = await create_claim(node.api, "good", node=NODE, devices=["gpu-0"])
    before = _snapshot(dirs)
    registration = node.plugin.paths.registration
    async with (
        await KubeletSim.register(registration) as v1,
        await KubeletSim.register(registration, known_versions=("v1beta1.DRAPlugin",)) as v1beta1,
    ):
        for i in range(REQUESTS):
            count = rng.choice((0, 1, 1, 2, 3, 8, 40))
            refs = [_fuzz_ref(rng, real) for _ in range(count)]
            refs += rng.sample(refs, min(len(refs), rng.choice((0, 0, 1))))  # a repeated uid
            kubelet = rng.choice((v1, v1beta1))
            context = f"seed {SEED} request {i}"
            if rng.random() < 0.5:
                prepared = await kubelet.prepare(refs)
                assert set(prepared.claims) == {r.uid for r in refs}, context
                for ref in refs:
                    entry = prepared.claims[ref.uid]
                    assert entry.error and not entry.devices, f"{context}: {ref!r}"
                    if names.claim_error(ref.uid, ref.namespace, ref.name):
                        assert entry.error.startswith("invalid claim"), f"{context}: {ref!r}"
            else:
                unprepared = await kubelet.unprepare(refs)
                assert {u: e.error for u, e in unprepared.claims.items()} == {
                    r.uid: "" for r in refs
                }, context  # none of them was ever prepared: nothing to do
        assert _snapshot(dirs) == before
        assert _our_specs(dirs) == []

        # Still serving: the real claim prepares, and unprepares.
        assert await node.plugin.health() == health_pb2.HealthCheckResponse.SERVING
        entry = (await v1.prepare([real])).claims[real.uid]
        assert entry.error == ""
        assert [d.device_name for d in entry.devices] == ["gpu-0"]
        assert _our_specs(dirs) == [f"k8s.gpu.nvidia.com-claim_{real.uid}.json"]
        assert (await v1.unprepare([real])).claims[real.uid].error == ""
        assert _our_specs(dirs) == []
    assert _snapshot(dirs) == before
