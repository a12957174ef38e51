"""The one flag table: every node-side subcommand takes its flags from it, so a flag means
the same everywhere; where a default differs by subcommand, the table says so and why."""

import argparse
import os
from pathlib import Path

import pytest

from cli import (
    build_parser,
    computedomaincontroller,
    computedomaindaemon,
    controller,
    discover,
    doctor,
    flagtable,
    plugin,
)
from drivers.gpu.node import NodeConfig

COMMANDS = {
    m.COMMAND: m.FLAG_NAMES
    for m in (plugin, discover, controller, computedomaindaemon, computedomaincontroller, doctor)
}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    assert parser._subparsers is not None
    choices = parser._subparsers._group_actions[0].choices
    assert isinstance(choices, dict)
    sub = choices[command]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def _options(command: str) -> dict[str, argparse.Action]:
    return {
        action.option_strings[-1]: action
        for action in _subparser(command)._actions
        if action.option_strings and action.dest != "help"
    }


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPU_DRA_") or name in (
            "NODE_NAME",
            "POD_UID",
            "KUBECONFIG",
            "CLIQUE_ID",
            "COMPUTE_DOMAIN_UUID",
            "POD_IP",
            "MAX_NODES_PER_IMEX_DOMAIN",
        ):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_a_node_command_is_in_the_table(command: str) -> None:
    options = set(_options(command))
    assert options == set(COMMANDS[command]) | set(flagtable.GLOBAL), command


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_default_is_the_tables_parsed_as_a_value_would_be(command: str) -> None:
    parsed = build_parser().parse_args([command])
    for flag in flagtable.pick(*COMMANDS[command]):
        default = flag.default_for(command)
        expected = None if default is None else flag.type(default)
        assert getattr(parsed, flag.dest) == expected, (command, flag.name)


def test_only_the_driver_root_and_doctors_output_differ_by_subcommand() -> None:
    differing = {
        f.name: dict(f.default_by_command) for f in flagtable.FLAGS if f.default_by_command
    }
    # And doctor's output, which a person reads, not a program.
    assert differing == {
        "--container-driver-root": {"kubelet-plugin": "/driver-root"},
        "--output": {"doctor": "table"},
    }
    defaults = {
        command: build_parser().parse_args([command]).container_driver_root
        for command, names in COMMANDS.items()
        if "--container-driver-root" in names
    }
    # The IMEX daemon's container gets the driver's libraries from its claim's CDI edits, at
    # the usual paths: it has no driver root mount.
    assert defaults == {
        "kubelet-plugin": "/driver-root",
        "discover": "/",
        "controller": "/",
        "compute-domain-daemon": "/",
        "doctor": "/",
    }


def test_the_plugins_driver_root_is_where_the_chart_mounts_the_host_driver() -> None:
    from tests.chart_render import render

    daemonset = next(o for o in render() if o["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    default = flagtable.BY_NAME["--container-driver-root"].default_for("kubelet-plugin")
    assert mounts["driver-root"] == default
    assert NodeConfig.__dataclass_fields__["container_driver_root"].default == Path(str(default))


def test_a_flag_shared_by_subcommands_has_one_help() -> None:
    for name in set(discover.FLAG_NAMES) & set(plugin.FLAG_NAMES):
        helps = {c: _options(c)[name].help or "" for c in ("discover", "kubelet-plugin")}
        flag = flagtable.BY_NAME[name]
        assert all(text.startswith(flag.help) for text in helps.values()), helps


def test_the_daemons_flags_name_their_variable_and_the_others_do_not() -> None:
    assert "[env GPU_DRA_CONTAINER_DRIVER_ROOT, default /driver-root]" in (
        _options("kubelet-plugin")["--container-driver-root"].help or ""
    )
    discover_help = _options("discover")["--container-driver-root"].help or ""
    assert discover_help.endswith("[default /]") and "GPU_DRA_" not in discover_help


def test_every_variable_is_the_flag_under_the_prefix() -> None:
    for flag in flagtable.FLAGS:
        assert flag.env == "GPU_DRA_" + flag.name[2:].upper().replace("-", "_")


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["discover", "--dynamic-mig"], True),
        (["discover"], False),
        (["kubelet-plugin", "--dynamic-mig=true"], True),
        (["kubelet-plugin", "--dynamic-mig", "false"], False),
    ],
)
def test_a_switch_takes_the_bare_and_the_valued_form(argv: list[str], value: bool) -> None:
    assert build_parser().parse_args(argv).dynamic_mig is value


def test_the_feature_gates_help_says_what_is_done_with_them() -> None:
    text = " ".join((_options("kubelet-plugin")["--feature-gates"].help or "").split())
    assert "checked, and logged" not in text
    assert "the syntax is checked and the gates are logged at start, nothing more" in text
