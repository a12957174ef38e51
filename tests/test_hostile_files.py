"""`gpu-dra validate` and `explain` given hostile files (issue #38): each ends in one line on
stderr and exit status 2, never a traceback, and within bounded memory and time. The real
command runs as a process, with an address-space limit so that a regression fails here
instead of taking the machine's memory."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 2 << 30
TIMEOUT_S = 60

# 1 KB of YAML whose aliases expand to 10**9 values: the "billion laughs".
ALIAS_BOMB = "\n".join(
    [
        "apiVersion: resource.k8s.io/v1",
        "kind: ResourceClaim",
        "metadata: {name: c}",
        'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)),
        "spec: {devices: {requests: *a8}}",
    ]
)


# The limit is set by the child's own first statement, not by a preexec_fn: a test worker that
# loaded gRPC runs gRPC's fork handlers in a preexec_fn child, which aborted it once (exit -6,
# no output) in CI; a fresh interpreter then runs the command as ``python -m cli`` would.
_LIMITED = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT})); "
    "sys.argv[0] = 'gpu-dra'; runpy.run_module('cli', run_name='__main__', alter_sys=True)"
)


def gpu_dra(*args: str, stdout: bool = False) -> tuple[int, list[str]]:
    """The exit status and stderr lines of ``gpu-dra ARGS`` (``stdout``: its stdout lines,
    stderr then empty)."""
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if stdout:
        assert done.stderr == ""
        return done.returncode, done.stdout.splitlines()
    return done.returncode, done.stderr.splitlines()


def one_line(code: int, lines: list[str], *expected: str, status: int = 2) -> None:
    assert code == status, lines
    assert len(lines) == 1, lines
    for part in expected:
        assert part in lines[0], lines


@pytest.fixture
def zero(tmp_path: Path) -> Iterator[Path]:
    link = tmp_path / "claim.yaml"
    link.symlink_to("/dev/zero")
    yield link
    # Not left behind in pytest's kept temporary directories: a tool that reads what it
    # finds under /tmp (nvidia-ctk, searching a driver root there) would read it forever.
    link.unlink()


def test_validate_refuses_a_device_behind_a_symlink(zero: Path) -> None:
    one_line(*gpu_dra("validate", str(zero)), str(zero), "not a regular file")


def test_explain_refuses_a_device_behind_a_symlink(zero: Path, tmp_path: Path) -> None:
    one_line(*gpu_dra("explain", "--slices", str(zero)), str(zero), "not a regular file")
    slices = tmp_path / "slices.yaml"
    slices.write_text("")  # no slices
    code, lines = gpu_dra("explain", "--slices", str(slices), "-f", str(zero))
    one_line(code, lines, "not a regular file")


def test_a_file_over_the_size_limit_is_refused_and_the_limit_is_a_flag(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * 2_000_000 + "\n")
    one_line(*gpu_dra("validate", "--max-file-size=1Mi", str(big)), "larger than 1Mi")
    one_line(*gpu_dra("explain", "--max-file-size=1Mi", "--slices", str(big)), "larger than 1Mi")
    code, lines = gpu_dra("validate", "--max-file-size=4Mi", str(big))
    assert code == 0 and lines == []  # a comment only: nothing to check


def test_validate_refuses_a_yaml_alias_bomb_in_one_line(tmp_path: Path) -> None:
    """A document refused is one problem of the file, as invalid YAML is (exit 1)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 1100
    code, lines = gpu_dra("validate", str(bomb), stdout=True)
    one_line(code, lines, f"{bomb}: document 1:", "YAML aliases expand it past", status=1)


def test_explain_refuses_a_yaml_alias_bomb_in_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    one_line(*gpu_dra("explain", "--slices", str(bomb)), str(bomb), "aliases")


@pytest.mark.parametrize("levels", [150, 200_000])
def test_deeply_nested_json_is_refused_in_one_line(levels: int, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * levels + "]" * levels)
    one_line(*gpu_dra("explain", "--slices", str(deep)), str(deep), "nested deeper than 100")
    code, lines = gpu_dra("validate", str(deep), stdout=True)
    # Past 1000 levels libyaml's own bound says so, under ours ours does.
    why = "nested deeper than 100" if levels < 1000 else "exceeded maximum nesting depth"
    one_line(code, lines, str(deep), why, status=1)
