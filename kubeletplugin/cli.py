"""``gpu-dra``: the one command-line entry.

It lives in the top layer because it is the only place that sees every other
layer; each subcommand registers itself from the module that owns it.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence

# module path -> each exposes register(subparsers); order is the order in --help.
_COMMANDS = (
    "driver.commands.discover",
    "driver.commands.controller",
    "driver.commands.explain",
    "driver.commands.validate",
    "kubeletplugin.commands.plugin",
    "kubeletplugin.commands.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-dra",
        description="Kubernetes DRA driver for NVIDIA GPUs (resource.k8s.io/v1).",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        importlib.import_module(name).register(subparsers)
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
