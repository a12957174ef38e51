"""``gpu-dra demo``: the whole DRA flow on one machine, no cluster and no GPU."""

import argparse
import sys

_DEFAULT_NODES = "node-a=p5.48xlarge,node-b=g6e.12xlarge"


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole DRA flow locally: API server, node plugins, allocation, prepare",
        description=(
            "Start a local API server and one real kubelet-plugin process per simulated node "
            "(simulated NVML, unix sockets in a temporary directory); wait for their "
            "ResourceSlices; apply the chart's DeviceClasses and some examples; create claims "
            "from templates, allocate them with the allocator behind `gpu-dra explain` and "
            "write status.allocation and reservedFor as the scheduler does, showing why a "
            "claim does not fit a node; then prepare and unprepare them through each "
            "plugin's sockets as the kubelet does, showing the CDI device IDs and what a "
            "container gets. Needs no network, GPU or root. Runs from a source checkout "
            "(the chart and examples live in charts/); `make demo` sets it up."
        ),
    )
    parser.add_argument(
        "--nodes",
        default=_DEFAULT_NODES,
        metavar="SPEC",
        help="simulated nodes as NAME=PROFILE,... with profiles of `gpu-dra discover` "
        f"(default {_DEFAULT_NODES})",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the API server and the plugins running after the report, and print a "
        "kubeconfig to explore them (kubectl, the Python client) until Ctrl-C",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from driver.common.errors import DriverError
    from driver.nvml.profile import profile_names
    from sandbox import demo

    try:
        nodes = demo.parse_nodes(args.nodes, profile_names())
        return demo.main(demo.Options(nodes=nodes, keep=args.keep))
    except DriverError as exc:
        print(f"gpu-dra demo: {exc}", file=sys.stderr)
        return 1
