"""``gpu-dra``: the one command-line entry.

It lives in the top layer because it is the only place that sees every other
layer. Each subcommand is one module here exposing ``register(subparsers)``; the
parser it adds sets ``func`` to a callable taking the parsed namespace and
returning an exit code. Heavy imports happen inside that callable so
``gpu-dra --help`` stays fast.

Global options are accepted before and after the subcommand: each subparser
carries them too, with suppressed defaults so that an option given before the
subcommand is not overwritten by the subparser's default.
"""

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cli import (
    computedomaincontroller,
    computedomaindaemon,
    controller,
    demo,
    discover,
    doctor,
    explain,
    flags,
    flagtable,
    plugin,
    validate,
)
from cli._usererrors import one_line

# Order is the order in --help.
_COMMANDS = (
    discover, controller, explain, validate, doctor, plugin, computedomaindaemon,
    computedomaincontroller, demo,
)  # fmt: skip

_GLOBAL = flagtable.pick(*flagtable.GLOBAL)

EXIT_USAGE = 2

_EPILOG = """\
Global options may also come after the subcommand (gpu-dra validate --log-level DEBUG F).
Every option of `kubelet-plugin` can also be set through the environment variable named in
its help (GPU_DRA_<OPTION>), as the Helm chart's DaemonSet does.

exit status: 0 success; 2 usage error (unknown option, bad value); otherwise as each
command's --help says. Every error is one line on stderr, never a traceback."""


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    group = parser.add_argument_group("global options")
    for flag in _GLOBAL:
        group.add_argument(
            flag.name,
            type=flag.type,
            choices=flag.choices,
            # Suppressed on subparsers: a value given before the subcommand must survive.
            default=flags.from_environment(flag, flag.default) if defaults else argparse.SUPPRESS,
            help=flags.help_text(flag, flag.default, environment=True),
        )


class _Version(argparse.Action):
    """``--version``, the release looked up only when asked: the lookup reads the installed
    package's metadata, which no other command needs."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from driver.kube.client import release

        print(f"gpu-dra {release()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Usage errors on one line, pointing to --help, instead of the usage block first."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpu-dra",
        description="Kubernetes DRA driver for NVIDIA GPUs (resource.k8s.io/v1).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global_options(parser, defaults=True)
    parser.add_argument("--version", action=_Version)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.register(subparsers)
    for subparser in subparsers.choices.values():
        _add_global_options(subparser, defaults=False)
    return parser


def _check_environment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    # argparse checks choices of command-line values only, not of defaults from the environment.
    for flag in _GLOBAL:
        value = flag.type(getattr(args, flag.dest))
        setattr(args, flag.dest, value)
        if value not in flag.choices:
            parser.error(
                f"{flag.env}={value!r}: invalid choice (choose from {', '.join(flag.choices)})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    from driver.common import logs

    parser = build_parser()
    args = parser.parse_args(argv)
    _check_environment(parser, args)
    logs.setup(args.log_level, args.log_format)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # here, so a reader that left is seen by the handler below
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpu-dra validate ... | head`: the reader left, which is no error of the user's
        # or ours. Python would print a traceback flushing stdout at exit: point it at
        # /dev/null and end as a process killed by SIGPIPE does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        # A user mistake (bad kubeconfig, unreachable server, no permission) is one line;
        # anything else is a bug of ours and keeps its traceback.
        line = one_line(exc)
        if line is None:
            raise
        print(f"gpu-dra {args.command}: {line.text}", file=sys.stderr)
        return line.exit_code
    return code


if __name__ == "__main__":
    sys.exit(main())
