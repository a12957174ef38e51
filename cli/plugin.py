"""``gpu-dra kubelet-plugin``: the per-node daemon (kubelet plugin plus slice controller)."""

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli import flags, flagtable

if TYPE_CHECKING:
    from drivers.gpu.kinds.mpspod import MpsPodConfig
    from drivers.gpu.node import NodeConfig
    from kubeletplugin.cohost import Guest

COMMAND = "kubelet-plugin"
# In the order of --help; each also defaults from its variable, as the DaemonSet may set it.
FLAG_NAMES = (
    "--node-name",
    "--driver-name",
    "--kubeconfig",
    "--kubelet-registrar-directory-path",
    "--kubelet-plugins-directory-path",
    "--cdi-root",
    "--nvidia-driver-root",
    "--container-driver-root",
    "--sysfs-root",
    "--nvidia-smi",
    "--mps-control",
    "--mps-daemon",
    "--image",
    "--image-pull-policy",
    "--image-pull-secrets",
    "--consumable-capacity",
    "--dynamic-mig",
    "--compute-domains",
    "--driver-namespace",
    "--pod-uid",
    "--nvml",
    "--profile",
    "--sim-state",
    "--feature-gates",
    "--additional-xids-to-ignore",
    "--auto-recover-probes",
    "--auto-recover-period",
    "--recoverable-xids",
    "--metrics-port",
    "--metrics-address",
    "--healthcheck-port",
)


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="run the node daemon: kubelet DRA plugin and ResourceSlice publisher",
        description=(
            "Serve the kubelet's plugin registration and DRA (v1, v1beta1) gRPC services on "
            "unix sockets, prepare and unprepare claims (CDI specs, reservations), publish this "
            "node's ResourceSlices, and answer grpc.health.v1 probes. Every flag can also be "
            "set through the environment variable named in its help. SIGTERM shuts down "
            "cleanly: own sockets removed, slices left for the next instance."
        ),
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=True)
    parser.set_defaults(func=_run)


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _mps_pod(args: argparse.Namespace) -> "MpsPodConfig | None":
    from drivers.gpu.kinds.mpspod import MpsPodConfig

    if args.mps_daemon != "pod":
        return None
    return MpsPodConfig(
        namespace=os.environ.get("POD_NAMESPACE", ""),
        image=args.image or "",
        pull_policy=args.image_pull_policy,
        pull_secrets=tuple(args.image_pull_secrets or ()),
        driver_name=args.driver_name,
    )


def _run(args: argparse.Namespace) -> int:
    from driver.common import gcpause

    gcpause.pause_start_up()  # before the daemon's imports; the node ends it once started
    import asyncio

    from drivers.gpu import node
    from drivers.gpu.model.devicehealth import DEFAULT_IGNORED_XIDS

    if not args.node_name:
        print(
            "gpu-dra kubelet-plugin: --node-name (or GPU_DRA_NODE_NAME) is required",
            file=sys.stderr,
        )
        return 2
    if args.mps_daemon == "pod" and not (os.environ.get("POD_NAMESPACE") and args.image):
        print(
            "gpu-dra kubelet-plugin: --mps-daemon=pod needs POD_NAMESPACE (the plugin's "
            "namespace, where the daemon pods run) and --image (or IMAGE_NAME, their image)",
            file=sys.stderr,
        )
        return 2
    if args.nvml == "simulated" and not args.profile:
        print("gpu-dra kubelet-plugin: --nvml simulated needs --profile", file=sys.stderr)
        return 2
    config = node.NodeConfig(
        node_name=args.node_name,
        driver_name=args.driver_name,
        kubeconfig=_path(args.kubeconfig),
        registrar_dir=Path(args.kubelet_registrar_directory_path),
        plugins_dir=Path(args.kubelet_plugins_directory_path),
        cdi_root=Path(args.cdi_root),
        nvidia_driver_root=Path(args.nvidia_driver_root),
        container_driver_root=Path(args.container_driver_root),
        sysfs_root=Path(args.sysfs_root),
        nvidia_smi=_path(args.nvidia_smi),
        mps_control=_path(args.mps_control),
        mps_pod=_mps_pod(args),
        consumable_capacity=bool(args.consumable_capacity),
        dynamic_mig=bool(args.dynamic_mig),
        pod_uid=args.pod_uid or None,
        nvml=args.nvml,
        profile=args.profile,
        sim_state=_path(args.sim_state),
        healthcheck_port=args.healthcheck_port,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        ignored_xids=DEFAULT_IGNORED_XIDS | (args.additional_xids_to_ignore or frozenset()),
        recovery_probes=args.auto_recover_probes,
        recoverable_xids=args.recoverable_xids,
        recovery_period=args.auto_recover_period,
    )
    if args.feature_gates:
        import logging

        logging.getLogger(__name__).info(
            "feature gates",
            extra={"feature_gates": ",".join(f"{k}={v}" for k, v in args.feature_gates.items())},
        )
    if args.nvml not in ("system", "simulated"):
        print(
            f"gpu-dra kubelet-plugin: GPU_DRA_NVML={args.nvml!r}: choose system or simulated",
            file=sys.stderr,
        )
        return 2
    node.limit_malloc_arenas()
    return asyncio.run(node.main(config, _guests(args, config)))


def _guests(args: argparse.Namespace, config: "NodeConfig") -> "list[Guest]":
    """The other drivers this process serves: the ComputeDomain driver, when asked for."""
    if not args.compute_domains:
        return []
    from drivers.computedomain.node import ComputeDomainDriver, DomainConfig

    return [
        ComputeDomainDriver(
            DomainConfig(
                node_name=config.node_name,
                namespace=args.driver_namespace or "default",
                registrar_dir=config.registrar_dir,
                plugins_dir=config.plugins_dir,
                cdi_root=config.cdi_root,
                pod_uid=config.pod_uid,
            )
        )
    ]
