"""``gpu-dra doctor``: read-only checks of a GPU node, each ok or what is wrong and the one
command that fixes it. Looking is :mod:`cli._doctorfound`, judging :mod:`cli._doctorchecks`."""

import argparse
import json
import sys

from cli import _nvmlargs as nvml_args
from cli import flags, flagtable

COMMAND = "doctor"
FLAG_NAMES = (
    *nvml_args.FLAG_NAMES,
    "--node-name",
    "--driver-name",
    "--kubeconfig",
    "--kubelet-registrar-directory-path",
    "--kubelet-plugins-directory-path",
    "--cdi-root",
    "--mps-control",
    "--containerd-config",
    "--output",
)
EXIT_PROBLEM = 1

_EPILOG = """\
where to run it:
  in the plugin's pod, which sees the node as the plugin does:
    kubectl -n gpu-dra-driver exec ds/gpu-dra-driver-kubelet-plugin -- \\
      gpu-dra doctor --container-driver-root=/driver-root
  or on the node itself (as root, to read the kubelet's directories).

checks: nvml (the driver root and the NVML library, which file, which driver version);
  devices (/dev/nvidiactl and one /dev/nvidia<N> per GPU); toolkit (nvidia-ctk found, and
  `nvidia-ctk cdi generate` to stdout works); containerd-cdi (its config: enable_cdi,
  cdi_spec_dirs); kubelet-dirs (the plugin directories, and the longest socket path the
  plugin binds within 105 bytes); device-plugin (NVIDIA's device plugin serving the same
  GPUs); mps (the MPS binaries); kubernetes (the API server's and this node's kubelet's
  versions, resource.k8s.io/v1 served; needs a kubeconfig or a pod's service account);
  registration (the plugin's registration and DRA sockets); slices (this node's
  ResourceSlices). Nothing is written or changed.

exit status: 0 nothing failed (ok, warn, skip); 1 a check failed; 2 usage error.
"""


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="check a node for what the driver needs, and say how to fix what is missing",
        description="Read-only checks of a GPU node: each prints ok, or what is wrong and "
        "the one command that fixes it.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags.add(parser, COMMAND, flagtable.pick(*FLAG_NAMES), environment=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cli._doctorchecks import Status, judge
    from cli._doctorfound import gather

    found = gather(args)
    verdicts = judge(found)
    failed = any(v.status is Status.FAIL for v in verdicts)
    if args.output == "table":
        width = max(len(v.name) for v in verdicts)
        print(f"node {found.node}, driver {found.driver_name}, driver root {found.driver_root}")
        for v in verdicts:
            print(f"{v.status.value:<4}  {v.name:<{width}}  {v.detail}")
            if v.fix and v.status in (Status.FAIL, Status.WARN):
                print(f"{'':<4}  {'':<{width}}  fix: {v.fix}")
    else:
        body = {
            "node": found.node,
            "driver": found.driver_name,
            "ok": not failed,
            "checks": [
                {"name": v.name, "status": v.status.value, "detail": v.detail, "fix": v.fix}
                for v in verdicts
            ],
        }
        if args.output == "json":
            json.dump(body, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            import yaml

            sys.stdout.write(yaml.safe_dump(body, sort_keys=False))
    return EXIT_PROBLEM if failed else 0
