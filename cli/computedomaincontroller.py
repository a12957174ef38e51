"""``gpu-dra compute-domain-controller``: the cluster's ComputeDomain controller, the chart's
Deployment (two replicas, one leading by a Lease)."""

import argparse
from typing import TYPE_CHECKING

from cli import flags, flagtable

if TYPE_CHECKING:
    from cluster.computedomain.objects import DaemonSettings

COMMAND = "compute-domain-controller"
FLAG_NAMES = (
    "--kubeconfig",
    "--driver-namespace",
    "--pod-name",
    "--image",
    "--image-pull-policy",
    "--image-pull-secrets",
    "--max-nodes-per-imex-domain",
    "--daemon-log-level",
    "--leader-elect",
    "--leader-elect-lease-duration",
    "--leader-elect-renew-deadline",
    "--leader-elect-retry-period",
    "--metrics-port",
    "--metrics-address",
)
EXIT_PERMANENT = 1


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="run the ComputeDomain controller: IMEX daemons, claim templates, status",
        description=(
            "For each ComputeDomain (resource.nvidia.com/v1beta1): add its finalizer; create "
            "the DaemonSet of IMEX daemons (gpu-dra compute-domain-daemon from --image) and its "
            "daemon ResourceClaimTemplate in the driver's namespace, and the workload "
            "ResourceClaimTemplate the domain names in its own; keep its status (nodes, Ready "
            "or NotReady) from the daemons; on deletion, remove those in NVIDIA's order and the "
            "domain's Node labels, then the finalizer. Works from watches, writes only on a "
            "change. With --leader-elect (the default) one replica leads by a Lease in the "
            "driver's namespace. Every flag can also be set through the environment variables "
            "named in its help. SIGTERM or SIGINT releases the Lease and exits 0; exit status "
            f"{EXIT_PERMANENT} when the controller cannot work (bad arguments, no kubeconfig)."
        ),
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cli._running import run_main

    return run_main(COMMAND, lambda: _main(args))


async def _main(args: argparse.Namespace) -> int:
    import os
    import socket
    import uuid

    from cli._running import until_stopped
    from cluster.computedomain.controller import ComputeDomainController
    from cluster.computedomain.metrics import ControllerMetrics
    from driver.common.errors import PermanentError
    from driver.common.metricsserver import MetricsServer
    from driver.kube import client as kubeclient

    if not args.image:
        raise PermanentError("--image (IMAGE_NAME) is required: the IMEX daemon pods run it")
    if not args.driver_namespace:
        raise PermanentError("--driver-namespace (POD_NAMESPACE) is required")
    if not args.leader_elect_retry_period < args.leader_elect_renew_deadline:
        raise PermanentError("--leader-elect-retry-period must be less than the renew deadline")
    if not args.leader_elect_renew_deadline < args.leader_elect_lease_duration:
        raise PermanentError("--leader-elect-renew-deadline must be less than the lease duration")
    settings = daemon_settings(args, args.driver_namespace)
    # NVIDIA's identity: the pod's name and a UUID, unique across restarts of one pod.
    identity = f"{args.pod_name or socket.gethostname()}-{uuid.uuid4()}"
    api_client = await kubeclient.api_client(
        args.kubeconfig or os.environ.get("KUBECONFIG"), component=COMMAND
    )
    try:
        controller = ComputeDomainController(
            api_client,
            settings=settings,
            identity=identity,
            leader_elect=args.leader_elect,
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
        )
        server = None
        if args.metrics_port is not None:
            metrics = ControllerMetrics(
                domains=controller.domains_by_status,
                leading=lambda: controller.leading,
                writes=lambda: controller.stats.writes,
                write_failures=lambda: controller.stats.failures,
                api_errors=lambda: api_client.errors,
            )
            server = MetricsServer(metrics, port=args.metrics_port, host=args.metrics_address)
            await server.start()
        try:
            await until_stopped(controller.run(), COMMAND)
        finally:
            if server is not None:
                await server.stop()
    finally:
        await kubeclient.close(api_client)
    return 0


def daemon_settings(args: argparse.Namespace, namespace: str) -> "DaemonSettings":
    """What the IMEX daemons' DaemonSets are made with, from the controller's command line."""
    from cluster.computedomain.objects import DaemonSettings

    return DaemonSettings(
        namespace=namespace,
        image=args.image,
        image_pull_policy=args.image_pull_policy,
        image_pull_secrets=args.image_pull_secrets,
        max_nodes=args.max_nodes_per_imex_domain,
        log_level=args.daemon_log_level,
        log_format=args.log_format,
    )
