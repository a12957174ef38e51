"""The README's quick-start commands, extracted from the marked shell blocks and run as a user
on a fresh clone would, without a cluster. Commands that need a real EKS cluster (or a
registry) are skipped with that reason; each run prints how long it took."""

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = "<!-- quick-start:"
NEEDS_CLUSTER = "needs an EKS cluster"

# What a command needs that a fresh clone without a cluster lacks, by its first word.
_CLUSTER_TOOLS = {
    "kubectl": "needs a real EKS cluster",
    "helm": "needs a real EKS cluster",
    "eksctl": "needs a real EKS cluster",
    "docker": "needs a container engine and a registry the nodes pull from",
    "aws": "needs an AWS account",
    "skopeo": "pushes to a registry the nodes pull from (ECR)",
}


# What a user should see, for the commands that print something to check.
_SHOWS = {
    "gpu-dra discover --nvml simulated --profile p5.48xlarge -o table": "8 device(s)",
    "gpu-dra demo": "problems: 0",
    "make demo": "problems: 0",
    "gpu-dra validate charts/examples/tensor-parallel.yaml": "objects, no problems",
    "gpu-dra discover --nvml simulated --profile p5.48xlarge -o yaml >": "allocatable on 1 of 1",
    "make chart": "kind: DaemonSet",
}


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """Each marked block: its marker line and its commands (continuations joined, comments
    and blank lines dropped)."""
    found = []
    for match in re.finditer(r"^(<!-- quick-start:[^\n]*-->)\n```sh\n(.*?)^```", text, re.M | re.S):
        joined = match[2].replace("\\\n", " ")
        commands = [
            " ".join(line.split())
            for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        found.append((match[1], commands))
    return found


def skip_reason(command: str) -> str | None:
    words = shlex.split(command)
    if command.startswith(("make venv", "python3 -m venv")):
        return "the test runs in the project's virtualenv already (a fresh clone installs its own)"
    if command.startswith("make image"):
        return "built and checked by the e2e tier (tests/e2e/test_image.py): minutes, as root"
    if words[0] in _CLUSTER_TOOLS:
        return _CLUSTER_TOOLS[words[0]]
    if words[0] == "gpu-dra" and "--cluster" in words:
        return "reads a real cluster (--cluster)"
    return None


def make_recipe(target: str, gpu_dra: Path, assigned: Sequence[str] = ()) -> str:
    """The Makefile's recipe for ``target`` with this interpreter, never make itself: make
    would (re)install the virtualenv first. ``assigned``: the command's ``NAME=value`` words,
    over the Makefile's ``NAME ?= default``."""
    makefile = (ROOT / "Makefile").read_text()
    lines = makefile.splitlines()
    values = dict(re.findall(r"^(\w+) \?= ?(.*)$", makefile, re.M))
    values.update(word.partition("=")[::2] for word in assigned)
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{re.escape(target)}:", line))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line[1:].lstrip("@"))
    text = " && ".join(recipe)
    text = text.replace("$(VENV)/bin/gpu-dra", str(gpu_dra)).replace("$(PY)", sys.executable)
    text = text.replace("$(DEMO_ARGS)", "")
    # $(foreach x,$(LIST),... $(x)): each word of LIST, as make expands it.
    text = re.sub(
        r"\$\(foreach (\w+),\$\((\w+)\),(.*?\$\(\1\))\)",
        lambda m: " ".join(
            m[3].replace(f"$({m[1]})", word) for word in values.get(m[2], "").split()
        ),
        text,
    )
    for name, value in values.items():
        text = text.replace(f"$({name})", value)
    assert "$(" not in text, f"make {target}: unknown variable in {text!r}"
    return text


COMMANDS = [
    (marker, command) for marker, commands in blocks(README.read_text()) for command in commands
]


def test_the_readme_has_a_runnable_quick_start_and_a_cluster_one() -> None:
    runnable = [c for m, c in COMMANDS if NEEDS_CLUSTER not in m and skip_reason(c) is None]
    assert len(runnable) >= 3, COMMANDS
    assert any(c.startswith("helm install") for m, c in COMMANDS if NEEDS_CLUSTER in m)


def test_a_block_marked_for_a_cluster_holds_only_commands_that_need_one() -> None:
    for marker, command in COMMANDS:
        if NEEDS_CLUSTER in marker:
            assert skip_reason(command) is not None, command


@pytest.fixture(scope="module")
def gpu_dra(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gpu-dra`` as this checkout's code (the virtualenv's may be installed from another)."""
    path = tmp_path_factory.mktemp("bin") / "gpu-dra"
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cli "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("marker", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_quick_start_command(
    marker: str, command: str, gpu_dra: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = skip_reason(command)
    if reason is not None:
        pytest.skip(reason)
    words = shlex.split(command)
    script = make_recipe(words[1], gpu_dra, words[2:]) if words[0] == "make" else command
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_DRA_")}
    env["PATH"] = f"{gpu_dra.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(f"\nquick start: {command}: {elapsed:.1f} s")
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    for prefix, shown in _SHOWS.items():
        if command.startswith(prefix):
            assert shown in done.stdout, f"{command}: no {shown!r} in its output"
