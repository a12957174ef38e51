"""``gpu-dra controller``: publish this node's GPUs as ResourceSlices, standalone.

The same controller runs inside ``gpu-dra kubelet-plugin``; this command is for
nodes (or tests) that want publishing without the kubelet plugin.
"""

import argparse
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

from cli import _nvmlargs as nvml_args
from cli import flags, flagtable

if TYPE_CHECKING:  # imported inside the command, so `gpu-dra --help` stays fast
    from driver.slices import SliceController

COMMAND = "controller"
# No --dynamic-mig: only the plugin knows which MIG instances its claims made.
FLAG_NAMES = (
    "--node-name",
    "--driver-name",
    "--kubeconfig",
    "--namespace",
    *nvml_args.FLAG_NAMES,
    "--consumable-capacity",
    "--resync-period",
)
EXIT_PERMANENT = 1


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="publish this node's GPUs as ResourceSlices and keep them current",
        description=(
            "Discover this node's NVIDIA GPUs and keep its resource.k8s.io/v1 "
            "ResourceSlices in the API server equal to what was found: publish once, "
            "update when the hardware changes, restore slices others edit or delete. "
            "Rediscovers every --resync-period seconds; SIGHUP also re-reads the slices "
            "from the API server before comparing. SIGTERM or SIGINT "
            "stops it and leaves the slices in place. Exit status: 0 after a signal, "
            f"{EXIT_PERMANENT} when publishing cannot work (no resource.k8s.io/v1, "
            "unknown node, bad arguments). Dynamic MIG is published by kubelet-plugin "
            "alone: only it knows which MIG instances its claims made, and a publisher "
            "without its records would take them for out-of-band ones."
        ),
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cli._running import run_main

    return run_main(COMMAND, lambda: _main(args))


async def _main(args: argparse.Namespace) -> int:
    import asyncio

    from driver.common.errors import PermanentError
    from driver.kube import client as kubeclient
    from driver.slices import SliceController
    from drivers.gpu.kinds import GpuNode, gpu_kinds, node_devices
    from drivers.gpu.model.discovery import discover
    from drivers.gpu.model.inventory import Inventory

    node_name = nvml_args.node_name(args)
    if args.resync_period <= 0:
        raise PermanentError("--resync-period must be a positive number of seconds")
    with nvml_args.open_backend(args, node_name) as (backend, sysfs_root):

        async def discover_now() -> Inventory:
            # NVML calls block: keep them off the event loop.
            return await asyncio.to_thread(discover, backend, sysfs_root=sysfs_root)

        api_client = await kubeclient.api_client(
            args.kubeconfig or os.environ.get("KUBECONFIG"), component="controller"
        )
        kinds = gpu_kinds(GpuNode(consumable_capacity=args.consumable_capacity))
        devices = node_devices(discover_now, node_name=node_name, kinds=kinds)
        try:
            controller = SliceController(
                api_client,
                node_name=node_name,
                driver_name=args.driver_name,
                devices=devices.published,
                counter_sets=devices.counter_sets,
                resync_period=args.resync_period,
                namespace=args.namespace,
            )
            await _run_until_signal(controller)
        finally:
            close = cast(Callable[[], Awaitable[None]], api_client.close)
            await close()
    return 0


async def _run_until_signal(controller: "SliceController") -> None:
    """SIGHUP rediscovers and relists; SIGTERM and SIGINT stop, leaving the slices in place."""
    from cli._running import until_stopped

    await until_stopped(
        controller.run(), "slice-controller", hup=lambda: controller.trigger(relist=True)
    )
