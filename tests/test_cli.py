"""The ``gpu-dra`` command line as a user meets it: global options anywhere, ``--version``,
the environment, and one line (never a traceback) with the right exit status for each
mistake a user makes."""

import os
import re
import socket
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from cli import build_parser
from sandbox.apiserver import LocalApiServer

EXAMPLE = str(Path(__file__).parent.parent / "charts" / "examples" / "single-gpu.yaml")


def test_help_lists_every_built_command() -> None:
    text = build_parser().format_help()
    for command in (
        "discover",
        "controller",
        "explain",
        "validate",
        "doctor",
        "kubelet-plugin",
        "compute-domain-daemon",
        "demo",
    ):
        assert re.search(rf"\n    {command}\s", text), command


def test_console_entry_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "COMMAND" in out.stdout


def gpu_dra(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the real command in a clean environment: no kubeconfig, no home directory."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_DRA_", "KUBE"))}
    base.pop("NODE_NAME", None)
    with tempfile.TemporaryDirectory() as tmp:
        # A home that does not exist, under a directory the test removes: whatever the
        # command creates there (a build cache) goes with it.
        base["HOME"] = str(Path(tmp) / "absent")
        out = subprocess.run(
            [sys.executable, "-m", "cli", *args],
            capture_output=True,
            text=True,
            env={**base, **(env or {})},
            timeout=120,
        )
    return out.returncode, out.stdout, out.stderr


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_global_options_before_or_after_the_subcommand() -> None:
    before = build_parser().parse_args(["--log-level", "debug", "validate", "f"])
    after = build_parser().parse_args(["validate", "f", "--log-level", "DEBUG"])
    neither = build_parser().parse_args(["validate", "f"])
    assert before.log_level == after.log_level == "DEBUG"
    assert neither.log_level == "INFO" and neither.log_format == "kv"
    fmt = build_parser().parse_args(["validate", "--log-format", "json", "f"])
    assert fmt.log_format == "json"


def test_version_comes_from_the_package_metadata() -> None:
    code, out, _ = gpu_dra("--version")
    assert (code, out) == (0, f"gpu-dra {version('gpu-dra-driver')}\n")


def test_every_help_names_its_environment_and_never_a_source_file() -> None:
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        texts += [sub.format_help() for sub in getattr(action, "choices", {}).values()]
    assert len(texts) == 10  # the top level and its nine subcommands
    for text in texts:
        assert ".py" not in text and "driver/" not in text, text
        assert "--log-level" in text
    plugin_help = next(t for t in texts if "kubelet-plugin" in t.splitlines()[0])
    flat = " ".join(plugin_help.split())
    for env in (
        "GPU_DRA_NODE_NAME or NODE_NAME",
        "GPU_DRA_POD_UID or POD_UID",
        "GPU_DRA_DRIVER_NAME",
        "GPU_DRA_KUBELET_REGISTRAR_DIRECTORY_PATH",
        "GPU_DRA_KUBELET_PLUGINS_DIRECTORY_PATH",
        "GPU_DRA_CDI_ROOT",
        "GPU_DRA_NVIDIA_DRIVER_ROOT",
        "GPU_DRA_CONTAINER_DRIVER_ROOT",
        "GPU_DRA_NVML",
        "GPU_DRA_PROFILE",
        "GPU_DRA_HEALTHCHECK_PORT",
        "GPU_DRA_FEATURE_GATES",
        "GPU_DRA_LOG_LEVEL",
        "GPU_DRA_LOG_FORMAT",
    ):
        assert env in flat, env
    daemon_help = next(t for t in texts if "compute-domain-daemon" in t.splitlines()[0])
    flat = " ".join(daemon_help.split())
    for env in ("CLIQUE_ID", "COMPUTE_DOMAIN_UUID", "POD_IP", "MAX_NODES_PER_IMEX_DOMAIN"):
        assert f"GPU_DRA_{env} or {env}" in flat, env


def test_every_flag_the_daemonset_sets_has_an_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.chart_render import render

    daemonset = next(d for d in render() if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    flags = [a.split("=", 1)[0] for a in container["args"] if a.startswith("--")]
    assert "--node-name" in flags and "--log-level" in flags
    for flag in flags:
        monkeypatch.setenv("GPU_DRA_" + flag[2:].upper().replace("-", "_"), "7")
    monkeypatch.setenv("GPU_DRA_NVML", "simulated")
    monkeypatch.setenv("GPU_DRA_LOG_LEVEL", "warning")
    monkeypatch.setenv("GPU_DRA_LOG_FORMAT", "json")
    args = build_parser().parse_args(["kubelet-plugin"])
    for flag in flags:
        dest = flag[2:].replace("-", "_")
        expected = {"nvml": "simulated", "log_level": "WARNING", "log_format": "json"}
        assert getattr(args, dest) == expected.get(dest, 7 if dest.endswith("port") else "7")


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        (["--log-level", "TRACE", "validate", EXAMPLE], {}, 2, "invalid choice: 'TRACE'"),
        (["validate", EXAMPLE, "--log-level", "TRACE"], {}, 2, "invalid choice: 'TRACE'"),
        (["validate", EXAMPLE], {"GPU_DRA_LOG_LEVEL": "loud"}, 2, "GPU_DRA_LOG_LEVEL='LOUD'"),
        (["validate", "--log-format", "xml", EXAMPLE], {}, 2, "invalid choice: 'xml'"),
        (["validate", "/no/such.yaml"], {}, 2, "/no/such.yaml: cannot read: No such file"),
        (["frobnicate"], {}, 2, "invalid choice: 'frobnicate'"),
        (["kubelet-plugin"], {}, 2, "--node-name (or GPU_DRA_NODE_NAME) is required"),
        (
            ["kubelet-plugin", "--node-name", "n"],
            {"GPU_DRA_HEALTHCHECK_PORT": "http"},
            2,
            "invalid int value: 'http'",
        ),
        (
            ["kubelet-plugin", "--node-name", "n", "--feature-gates", "DRAExtendedResource"],
            {},
            2,
            "'DRAExtendedResource': expected Name=true or Name=false",
        ),
        (
            ["kubelet-plugin", "--node-name", "n", "--recoverable-xids", "8,79"],
            {},
            2,
            "XIDs [79] are never recovered automatically",
        ),
        (
            ["kubelet-plugin", "--node-name", "n"],
            {"GPU_DRA_AUTO_RECOVER_PROBES": "-1"},
            2,
            "'-1': expected a number of probes, 0 for off",
        ),
        (
            ["kubelet-plugin", "--node-name", "n", "--auto-recover-period", "0"],
            {},
            2,
            "'0': expected seconds, more than 0",
        ),
        (
            ["kubelet-plugin", "--node-name", "n"],
            {"GPU_DRA_NVML": "fake"},
            2,
            "GPU_DRA_NVML='fake': choose system or simulated",
        ),
        (  # only the plugin knows which MIG instances its claims made
            ["controller", "--node-name", "n", "--dynamic-mig"],
            {},
            2,
            "unrecognized arguments: --dynamic-mig",
        ),
        (
            ["explain", "-f", EXAMPLE, "--cluster"],
            {},
            2,
            "no kubeconfig found ($KUBECONFIG unset or naming no file, no ~/.kube/config)",
        ),
        (
            ["explain", "-f", EXAMPLE, "--cluster", "--kubeconfig", "/no/kubeconfig"],
            {},
            2,
            "kubeconfig /no/kubeconfig: no such file",
        ),
        (
            ["controller", "--node-name", "n", "--nvml", "simulated", "--profile", "g6e.12xlarge"],
            {"KUBECONFIG": "/no/kubeconfig"},
            1,
            "kubeconfig /no/kubeconfig: no such file",
        ),
    ],
)
def test_user_mistake_is_one_line_with_its_exit_code(
    args: list[str], env: dict[str, str], code: int, says: str
) -> None:
    got, _, err = gpu_dra(*args, env=env)
    line = one_line(err)
    assert got == code, err
    assert says in line, line
    assert line.startswith("gpu-dra"), line


def _kubeconfig(path: Path, server: str) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def test_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        server = f"http://127.0.0.1:{closed.getsockname()[1]}"
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
        code, out, err = gpu_dra("explain", "-f", EXAMPLE, "--cluster", "--kubeconfig", kubeconfig)
    line = one_line(err)
    assert (code, out) == (2, "")
    assert "Cannot connect to host 127.0.0.1" in line


def test_kubeconfig_without_current_context_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    code, _, err = gpu_dra("explain", "-f", EXAMPLE, "--cluster", "--kubeconfig", str(empty))
    assert code == 2
    assert "Expected key" not in err
    assert "names no current-context" in one_line(err)


async def test_no_permission_is_one_line(apiserver: LocalApiServer, tmp_path: Path) -> None:
    import asyncio

    apiserver.faults.forbid("list", "resourceslices")
    kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    code, out, err = await asyncio.to_thread(
        gpu_dra, "explain", "-f", EXAMPLE, "--cluster", "--kubeconfig", kubeconfig
    )
    assert (code, out) == (2, "")
    assert "HTTP 403: grant list on resourceslices.resource.k8s.io" in one_line(err)


def test_the_net_under_every_command_turns_client_errors_into_one_line() -> None:
    from cli._usererrors import one_line as classify

    class ApiException(Exception):  # the kubernetes client's, matched by name
        status, reason = 403, "Forbidden"

    forbidden = classify(ApiException())
    assert forbidden is not None and forbidden.exit_code == 1
    assert "HTTP 403 (Forbidden): not allowed" in forbidden.text
    missing = classify(FileNotFoundError(2, "No such file or directory", "/x"))
    assert missing is not None and (missing.text, missing.exit_code) == (
        "/x: No such file or directory",
        2,
    )
    assert classify(ZeroDivisionError()) is None  # a bug of ours keeps its traceback


def test_a_reader_that_leaves_the_pipe_early_gets_no_traceback() -> None:
    """`gpu-dra discover | head -1`: the reader is gone before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "cli", "discover", "--nvml=simulated", "--profile=p5.48xlarge"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141
