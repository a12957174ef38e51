"""``gpu-dra``: the one command-line entry.

It lives in the top layer because it is the only place that sees every other
layer. Each subcommand is one module here exposing ``register(subparsers)``; the
parser it adds sets ``func`` to a callable taking the parsed namespace and
returning an exit code. Heavy imports happen inside that callable so
``gpu-dra --help`` stays fast.
"""

import argparse
import sys
from collections.abc import Sequence

from kubeletplugin.cli import controller, demo, discover, explain, plugin, validate

# Order is the order in --help.
_COMMANDS = (discover, controller, explain, validate, plugin, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-dra",
        description="Kubernetes DRA driver for NVIDIA GPUs (resource.k8s.io/v1).",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from driver import logs

    args = build_parser().parse_args(argv)
    logs.setup(args.log_level)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
