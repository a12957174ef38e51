"""``gpu-dra compute-domain-daemon [run|check]``: a ComputeDomain's IMEX daemon on one node.

``run`` (the default) is the DaemonSet's container; ``check`` is its probes, as NVIDIA's daemon
has the two. The driver version is read here, through NVML, and handed to the cluster code as
text: the daemon itself imports no node code.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli import _nvmlargs as nvml_args
from cli import flags, flagtable

if TYPE_CHECKING:  # imported inside the command, so `gpu-dra --help` stays fast
    from cluster.imexdaemon.daemon import DaemonConfig
    from cluster.imexdaemon.membership import Member

COMMAND = "compute-domain-daemon"
FLAG_NAMES = (
    "--node-name",
    "--clique-id",
    "--compute-domain-uuid",
    "--pod-ip",
    "--max-nodes-per-imex-domain",
    "--imex-config-dir",
    "--hosts-file",
    "--nvidia-imex",
    "--nvidia-imex-ctl",
    "--peers-file",
    "--kubeconfig",
    "--driver-namespace",
    "--pod-name",
    "--pod-uid",
    *nvml_args.FLAG_NAMES,
)
EXIT_FAILURE = 1
# NVIDIA's words: the variable comes only from the daemon claim's CDI edits.
NO_CDI = "CDI container edits did not apply -- is CDI enabled in your container runtime?"


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="run a ComputeDomain's IMEX daemon on this node, or check that it is ready",
        description=(
            "run: write the IMEX config and a static nodes.cfg of compute-domain-daemon-NNNN "
            "names, map the domain's peers (this clique's daemons) to those names in the hosts "
            "file, start and supervise nvidia-imex (restarted with backoff when it exits), and "
            "send it SIGUSR1 when the mapping changes. On a node without a clique it starts "
            "nothing and waits. Refuses to start on an NVIDIA driver older than 570.158.01. "
            "SIGTERM stops IMEX and exits 0. check: exit 0 when IMEX answers READY to "
            "nvidia-imex-ctl -q (or the node has no clique), else print why and exit 1. Every "
            "flag can also be set through the environment variables named in its help."
        ),
    )
    parser.add_argument(
        "action", nargs="?", choices=("run", "check"), default="run", help="default: run"
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=True)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import asyncio

    if args.action == "check":
        return asyncio.run(_check(args))
    if not args.compute_domain_uuid:
        print(f"gpu-dra {COMMAND}: {NO_CDI}", file=sys.stderr)
        return EXIT_FAILURE
    _require_driver(args)
    return asyncio.run(_run(args))


def _require_driver(args: argparse.Namespace) -> None:
    """NVIDIA's floor for IMEX with DNS names, from NVML's driver version."""
    import pynvml

    from driver.common.driverversion import require_floor
    from driver.common.errors import PermanentError

    with nvml_args.open_backend(args, nvml_args.node_name(args)) as (nvml, _):
        try:
            nvml.nvmlInit()
            try:
                found = nvml.nvmlSystemGetDriverVersion()
            finally:
                nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            raise PermanentError(f"cannot read the NVIDIA driver version (NVML: {exc})") from exc
    require_floor(found)


def _member(args: argparse.Namespace) -> "Member":
    from cluster.imexdaemon.membership import Member
    from driver.common.errors import PermanentError

    missing = [
        flag
        for flag, value in (
            ("--driver-namespace (POD_NAMESPACE)", args.driver_namespace),
            ("--pod-name (POD_NAME)", args.pod_name),
            ("--pod-uid (POD_UID)", args.pod_uid),
        )
        if not value
    ]
    if missing:
        raise PermanentError(
            f"{', '.join(missing)} required: the daemon writes itself into its clique in the "
            "API server (or give --peers-file to follow a file instead)"
        )
    return Member(
        namespace=args.driver_namespace,
        domain_uid=args.compute_domain_uuid,
        clique_id=args.clique_id or "",
        node_name=nvml_args.node_name(args),
        pod_name=args.pod_name,
        pod_uid=args.pod_uid,
        pod_ip=args.pod_ip or "",
        max_nodes=args.max_nodes_per_imex_domain,
    )


async def _run(args: argparse.Namespace) -> int:
    from cli._running import until_stopped
    from cluster.imexdaemon.daemon import DaemonConfig, ImexDaemon
    from cluster.imexdaemon.sources import FileSource

    config = DaemonConfig(
        clique_id=args.clique_id or "",
        pod_ip=args.pod_ip or "",
        node_name=nvml_args.node_name(args),
        max_nodes=args.max_nodes_per_imex_domain,
        config_dir=Path(args.imex_config_dir),
        hosts_file=Path(args.hosts_file),
        imex=args.nvidia_imex,
    )
    if args.peers_file:
        daemon = ImexDaemon(config, FileSource(Path(args.peers_file)))
        await until_stopped(daemon.run(), COMMAND)
        return 0
    await _run_with_api(args, config)
    return 0


async def _run_with_api(args: argparse.Namespace, config: "DaemonConfig") -> None:
    """NVIDIA's daemon: its pod labelled with the clique, itself listed in the clique (which
    gives its peers), and its entry removed at stop."""
    from cli._running import until_stopped
    from cluster.imexdaemon.cliquesource import CliqueSource, label_pod
    from cluster.imexdaemon.daemon import ImexDaemon
    from cluster.imexdaemon.peers import has_clique
    from cluster.imexdaemon.sources import MemorySource
    from driver.kube import client as kubeclient
    from driver.kube.rest import Client

    member = _member(args)
    api_client = await kubeclient.api_client(
        args.kubeconfig or os.environ.get("KUBECONFIG"), component=COMMAND
    )
    try:
        client = Client(api_client)
        # A node without a clique runs no IMEX and joins no clique: the daemon idles.
        source = CliqueSource(client, member) if has_clique(member.clique_id) else None
        daemon = ImexDaemon(config, source or MemorySource())

        async def serve() -> None:
            await label_pod(client, member)
            await daemon.run()

        try:
            await until_stopped(serve(), COMMAND)
        finally:
            if source is not None:
                await source.leave()
    finally:
        await kubeclient.close(api_client)


async def _check(args: argparse.Namespace) -> int:
    from cluster.imexdaemon.check import check
    from cluster.imexdaemon.imexconfig import CONFIG_NAME

    result = await check(
        clique_id=args.clique_id or "",
        ctl=args.nvidia_imex_ctl,
        config=Path(args.imex_config_dir) / CONFIG_NAME,
    )
    print(result.line, file=sys.stdout if result.ready else sys.stderr)
    return 0 if result.ready else EXIT_FAILURE
