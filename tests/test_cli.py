import subprocess
import sys

from kubeletplugin.cli import build_parser


def test_help_lists_every_built_command() -> None:
    text = build_parser().format_help()
    for command in ("discover", "controller", "explain", "validate", "kubelet-plugin", "demo"):
        assert f"\n    {command} " in text, command


def test_console_entry_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "COMMAND" in out.stdout
