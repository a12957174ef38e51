"""``gpu-dra discover``: print what this node would publish."""

import argparse
import sys
from typing import Any

from cli import _nvmlargs as nvml_args
from cli import flags, flagtable
from driver.common.errors import PermanentError, RetryableError

COMMAND = "discover"
FLAG_NAMES = (
    *nvml_args.FLAG_NAMES,
    "--consumable-capacity",
    "--dynamic-mig",
    "--list-profiles",
    "--node-name",
    "--driver-name",
    "--output",
)
EXIT_PERMANENT = 1
EXIT_RETRYABLE = 75  # EX_TEMPFAIL: try again later


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="print the ResourceSlices this node would publish",
        description=(
            "Discover this node's NVIDIA GPUs through NVML (the real library or simulated "
            "hardware) and print the resource.k8s.io/v1 ResourceSlices the driver would "
            f"publish. Exit status: 0 on success, {EXIT_PERMANENT} when NVML cannot be used "
            f"(e.g. no driver installed), {EXIT_RETRYABLE} when the driver is not ready yet."
        ),
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from drivers.gpu.model.discovery import discover

    if args.list_profiles:
        from driver.nvml.profile import profile_names

        print("\n".join(profile_names()))
        return 0
    node_name = nvml_args.node_name(args, per_profile=True)
    try:
        with nvml_args.open_backend(args, node_name) as (backend, sysfs_root):
            inventory = discover(backend, sysfs_root=sysfs_root, dynamic_mig=args.dynamic_mig)
    except RetryableError as exc:
        print(f"gpu-dra discover: {exc}", file=sys.stderr)
        return EXIT_RETRYABLE
    except PermanentError as exc:
        print(f"gpu-dra discover: {exc}", file=sys.stderr)
        return EXIT_PERMANENT

    from driver.common.limits import validate_resource_slice
    from drivers.gpu.resourceslice import build_resource_slices

    slices = build_resource_slices(
        inventory,
        driver_name=args.driver_name,
        node_name=node_name,
        consumable_capacity=args.consumable_capacity,
    )
    problems = [p for s in slices for p in validate_resource_slice(s)]
    if problems:
        print(f"gpu-dra discover: invalid ResourceSlice: {problems[0]}", file=sys.stderr)
        return EXIT_PERMANENT
    sys.stdout.write(_render(args.output, slices, inventory, node_name))
    return 0


def _render(output: str, slices: list[dict[str, Any]], inventory: Any, node_name: str) -> str:
    if output == "json":
        import json

        return json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}, indent=2) + "\n"
    if output == "yaml":
        import yaml

        return yaml.safe_dump_all(slices, sort_keys=False)
    return _table(slices, inventory, node_name)


def _table(slices: list[dict[str, Any]], inventory: Any, node_name: str) -> str:
    """One row per published device (GPU or MIG), from what the slices carry."""

    def attr(device: dict[str, Any], name: str) -> str:
        value = device["attributes"].get(name)
        return "-" if value is None else str(next(iter(value.values())))

    header = ("DEVICE", "TYPE", "MODEL", "MEMORY", "NUMA", "PCI BUS ID", "NVLINK DOMAIN")
    rows = [
        (
            device["name"],
            attr(device, "type")
            + ("" if attr(device, "profile") == "-" else f" {attr(device, 'profile')}"),
            attr(device, "model"),
            f"{int(device['capacity']['memory']['value']) // 2**20} MiB",
            attr(device, "numaNode"),
            attr(device, "resource.kubernetes.io/pciBusID"),
            attr(device, "nvlinkDomain"),
        )
        for piece in slices
        for device in piece["spec"]["devices"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    cuda = ".".join(map(str, inventory.cuda_driver_version))
    lines = [
        f"node {node_name}: {len(rows)} device(s), driver {inventory.driver_version}, CUDA {cuda}, "
        f"{len(slices)} ResourceSlice(s)",
        "",
        *(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        ),
    ]
    lines += [
        f"skipped GPU index {s.index} (PCI {s.pci_bus_id or 'unknown'}): {s.error}"
        for s in inventory.skipped
    ]
    return "\n".join(lines) + "\n"
