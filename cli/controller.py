"""``gpu-dra controller``: publish this node's GPUs as ResourceSlices, standalone.

The same controller runs inside ``gpu-dra kubelet-plugin``; this command is for
nodes (or tests) that want publishing without the kubelet plugin.
"""

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cli import _nvmlargs as nvml_args
from driver import DEFAULT_DRIVER_NAME
from driver.kube import client as kubeclient

if TYPE_CHECKING:  # imported inside the command, so `gpu-dra --help` stays fast
    from driver.slices import SliceController

EXIT_PERMANENT = 1


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "controller",
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
    parser.add_argument(
        "--node-name",
        default=None,
        help="the Node to publish for, as the API server names it; default: $NODE_NAME, "
        "else the host name",
    )
    parser.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER_NAME,
        help=f"DRA driver name (default: {DEFAULT_DRIVER_NAME})",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file; default: $KUBECONFIG, else the in-cluster service account",
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="namespace of the per-node publisher Lease; default: $POD_NAMESPACE, else 'default'",
    )
    nvml_args.add_nvml_arguments(parser)
    nvml_args.add_consumable_capacity(parser)
    parser.add_argument(
        "--resync-period",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="rediscover the GPUs this often (default: 60)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from driver.common.errors import PermanentError

    try:
        return asyncio.run(_main(args))
    except PermanentError as exc:
        print(f"gpu-dra controller: {exc}", file=sys.stderr)
        return EXIT_PERMANENT


async def _main(args: argparse.Namespace) -> int:
    import asyncio

    from driver.common.errors import PermanentError
    from driver.gpu.discovery import discover
    from driver.gpu.inventory import Inventory
    from driver.gpu.kinds import NodeDevices
    from driver.slices import SliceController

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
        node_devices = NodeDevices(
            discover_now, node_name=node_name, consumable_capacity=args.consumable_capacity
        )
        try:
            controller = SliceController(
                api_client,
                node_name=node_name,
                driver_name=args.driver_name,
                devices=node_devices.published,
                counter_sets=node_devices.counter_sets,
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
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.create_task(controller.run(), name="slice-controller")
    loop.add_signal_handler(signal.SIGHUP, lambda: controller.trigger(relist=True))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # we were cancelled ourselves, not by a signal
    finally:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
