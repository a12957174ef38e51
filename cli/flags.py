"""The one description of a command-line flag, and the one way a subcommand adds its flags.

Every node-side subcommand (``kubelet-plugin``, ``discover``, ``controller``) and the global
options draw their flags from :data:`cli.flagtable.FLAGS` by name, so a flag has one help
text, one value parser and one default everywhere it appears. A default that must differ by
subcommand is written in the table beside the flag, with the reason, never in a subcommand.
"""

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "GPU_DRA_"


@dataclass(frozen=True)
class Flag:
    """A flag as the user meets it: on the command line and, for the daemon, in the environment.

    ``default`` is text, parsed by ``type`` as a value given on the command line would be, so
    an environment variable and the default go through the same checks. A ``switch`` is a
    boolean that takes ``--x``, ``--x=true`` or ``--x=false`` (the chart writes the second).
    """

    name: str
    help: str
    type: Callable[[str], Any] = str
    default: str | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    switch: bool = False
    short: str | None = None
    # The conventional variable (the downward API's, kubectl's) also read after ours.
    also_env: str | None = None
    # Subcommand -> its default, where one default cannot serve every subcommand.
    default_by_command: Mapping[str, str] = field(default_factory=dict)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.removeprefix("--").upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def default_for(self, command: str) -> str | None:
        return self.default_by_command.get(command, self.default)

    def env_names(self) -> str:
        return self.env + (f" or {self.also_env}" if self.also_env else "")


def from_environment(flag: Flag, default: str | None) -> str | None:
    """The flag's variable, else its conventional one, else ``default``; empty counts as unset."""
    return (
        os.environ.get(flag.env)
        or (os.environ.get(flag.also_env) if flag.also_env else None)
        or default
    )


def help_text(flag: Flag, default: str | None, *, environment: bool) -> str:
    where = [f"env {flag.env_names()}"] if environment else []
    if default is not None:
        where.append(f"default {default or '(empty)'}")
    return flag.help + (f" [{', '.join(where)}]" if where else "")


def add(
    parser: argparse.ArgumentParser,
    command: str,
    flags: Iterable[Flag],
    *,
    environment: bool,
) -> None:
    """Add ``flags`` as ``command`` takes them; with ``environment``, each defaults to its
    environment variable (the DaemonSet's way), else to the table's default alone."""
    for flag in flags:
        default = flag.default_for(command)
        value = from_environment(flag, default) if environment else default
        options: dict[str, Any] = {
            "default": value,
            "type": flag.type,
            "help": help_text(flag, default, environment=environment),
        }
        if flag.choices:
            options["choices"] = flag.choices
        if flag.metavar:
            options["metavar"] = flag.metavar
        if flag.switch:
            # A bare switch is on; const is not passed through type, so it is the value itself.
            options.update(nargs="?", const=True, metavar="true|false")
        names = (flag.short, flag.name) if flag.short else (flag.name,)
        parser.add_argument(*names, **options)
