"""The ComputeDomain node driver under test: a real plugin process serving both drivers, a
simulated GB200 node (fabric cluster per node from the fault file), and the objects a
ComputeDomain's controller and daemons would write, put into the local API server."""

import uuid
from pathlib import Path
from typing import Any

from driver.common.wire import Obj
from driver.nvml.profile import load_profile
from drivers.computedomain import names
from kubeletplugin.sockets import SocketPaths, socket_paths
from sandbox.apiserver import LocalApiServer
from tests.computedomains import DRIVER_NAMESPACE, clique, daemon, domain
from tests.pluginharness import NodeDirs, PluginProcess, create_claim

PROFILE = "p6e-gb200.36xlarge"
NODE = "gb-a"
CD_UID = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
OTHER_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
IMEX_CHANNELS_MAJOR = 507  # what the simulated driver root's /proc/devices lists
CAPS_MAJOR = 508


def clique_id(rack: str) -> str:
    """The clique NVML reports on a simulated GB200 node of fabric cluster ``rack``."""
    profile = load_profile(PROFILE)
    return f"{uuid.UUID(bytes=profile.fabric_cluster_uuid(rack))}.{profile.fabric_clique_id}"


def cd_paths(dirs: NodeDirs) -> SocketPaths:
    return socket_paths(
        registrar_dir=dirs.registry,
        plugins_dir=dirs.plugins,
        driver_name=names.DRIVER_NAME,
        pod_uid=None,
    )


def start(
    dirs: NodeDirs,
    kubeconfig: Path,
    *,
    rack: str | None = "rack-a",
    crashpoint: str | None = None,
    extra_env: dict[str, str] | None = None,
    profile: str = PROFILE,
) -> PluginProcess:
    """The node process with ``--compute-domains``; ``rack`` None: no fabric (no clique)."""
    state = dirs.root / "fabric.yaml"
    state.write_text(f"fabricCluster: {rack}\n" if rack else "fabric: zero\n")
    return PluginProcess(
        dirs,
        kubeconfig=kubeconfig,
        node_name=NODE,
        profile=profile,
        crashpoint=crashpoint,
        extra_env={"GPU_DRA_SIM_STATE": str(state), **(extra_env or {})},
        extra_args=("--compute-domains", f"--driver-namespace={DRIVER_NAMESPACE}"),
    )


def seed(apiserver: LocalApiServer, *, namespace: str = "default") -> None:
    apiserver.seed(
        *(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            for name in (DRIVER_NAMESPACE, "team-b")
            if not any(n["metadata"]["name"] == name for n in apiserver.objects("namespaces"))
        ),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}},
        domain("cd1", namespace=namespace, uid=CD_UID, num_nodes=1),
    )


def ready(apiserver: LocalApiServer, rack: str = "rack-a") -> None:
    """This node's daemon Ready in its clique of the domain, as the daemon writes it."""
    cid = clique_id(rack)
    apiserver.put(clique(CD_UID, cid, [daemon(NODE, "10.0.0.1", 0, clique_id=cid)]))


def node_label(apiserver: LocalApiServer) -> str | None:
    node = next(n for n in apiserver.objects("nodes") if n["metadata"]["name"] == NODE)
    labels: dict[str, str] = node["metadata"].get("labels") or {}
    return labels.get(names.COMPUTE_DOMAIN_LABEL)


def clique_label(apiserver: LocalApiServer) -> str | None:
    node = next(n for n in apiserver.objects("nodes") if n["metadata"]["name"] == NODE)
    labels: dict[str, str] = node["metadata"].get("labels") or {}
    return labels.get(names.GPU_CLIQUE_NODE_LABEL)


def config(kind: str, uid: str = CD_UID, **extra: Any) -> list[Obj]:
    return [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": names.DRIVER_NAME,
                "parameters": {
                    "apiVersion": names.API_VERSION,
                    "kind": kind,
                    "domainID": uid,
                    **extra,
                },
            },
        }
    ]


async def channel_claim(
    api: Any, name: str = "work", *, namespace: str = "default", uid: str = CD_UID, **extra: Any
) -> Any:
    return await create_claim(
        api,
        name,
        node=NODE,
        devices=[names.CHANNEL_DEVICE],
        namespace=namespace,
        driver=names.DRIVER_NAME,
        config=config(names.CHANNEL_CONFIG_KIND, uid, **extra),
    )


async def daemon_claim(
    api: Any, name: str = "daemon", *, uid: str = CD_UID, namespace: str = DRIVER_NAMESPACE
) -> Any:
    return await create_claim(
        api,
        name,
        node=NODE,
        devices=[names.DAEMON_DEVICE],
        namespace=namespace,
        driver=names.DRIVER_NAME,
        config=config(names.DAEMON_CONFIG_KIND, uid),
    )
