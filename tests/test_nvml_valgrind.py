"""The simulated libnvidia-ml.so.1 under valgrind: no invalid access nor leak, good or bad input.

A small C program (tests/data/nvml_exercise.c) drives the library directly, so valgrind
watches the library and not an interpreter.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from driver.nvml.faults import Faults, XidEvent
from driver.nvml.sim.build import library
from driver.nvml.simulated import SimulatedNode

EXERCISE = Path(__file__).resolve().parent / "data" / "nvml_exercise.c"
MALFORMED = {
    "a link type out of range": "link 999999 zz\n",
    "a line longer than the buffer": "name " + "x" * 2000 + "\n",
    "a GPU minor out of range": "gpu 99999\n",
    "a fault before any GPU, with no code": "fail 0 nvmlDeviceGetUUID\n",
    "text where a number goes": "cuda thirteen\n",
}


def test_library_is_clean_under_valgrind(tmp_path: Path) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    exercise = tmp_path / "nvml_exercise"
    subprocess.run(["cc", "-g", "-o", str(exercise), str(EXERCISE), "-ldl"], check=True)
    xid = Faults(xid_events=(XidEvent(gpu=3, xid=79),))
    node = SimulatedNode("p6e-gb200.36xlarge", "vg", tmp_path / "root", faults=xid)
    good = node.nvml.render()
    malformed = []
    for number, bad in enumerate(MALFORMED.values()):
        malformed.append(tmp_path / f"malformed-{number}")
        malformed[-1].write_text(good.read_text() + bad)
    result = subprocess.run(
        [valgrind, "-q", "--error-exitcode=9", "--leak-check=full",
         "--errors-for-leak-kinds=definite", str(exercise), str(library()), str(good),
         *map(str, malformed)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("is malformed") == len(MALFORMED)


MIG_EXERCISE = Path(__file__).resolve().parent / "data" / "nvml_mig_exercise.c"


def test_mig_calls_are_clean_under_valgrind(tmp_path: Path) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    exercise = tmp_path / "nvml_mig_exercise"
    subprocess.run(["cc", "-g", "-o", str(exercise), str(MIG_EXERCISE), "-ldl"], check=True)
    profile = tmp_path / "mig-on.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: [0]}\n")
    node = SimulatedNode(profile, "vg", tmp_path / "root")
    result = subprocess.run(
        [valgrind, "-q", "--error-exitcode=9", "--leak-check=full",
         "--errors-for-leak-kinds=definite", str(exercise), str(library()),
         str(node.nvml.render())],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # What it created and destroyed left no capability files behind.
    assert not list((node.root / "proc").rglob("access"))
