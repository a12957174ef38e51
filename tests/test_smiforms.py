"""The nvidia-smi forms the stand-ins take and refuse are the real tool's (tests.smiforms)."""

import subprocess
from pathlib import Path

import pytest

from drivers.gpu.model.nvidiasmi import TIMESLICE_LEVELS, NvidiaSmi, NvidiaSmiError
from tests.smiforms import BAD_DISPLAY, INVALID, Refusal, refusal
from tests.test_timeslicing import Smi

UUID = "GPU-b7ce442e-8038-7675-6b31-06dbd373c7f5"

ACCEPTED = [
    # What the driver sends (drivers/gpu/model/nvidiasmi.py), as recorded on a real H200.
    f"-i {UUID} -c DEFAULT",
    f"compute-policy -i {UUID} --set-timeslice 0",
    f"compute-policy -i {UUID} --set-timeslice=0",
    f"compute-policy -i {UUID} --set-timeslice 3",
    # What the real-GPU suite and the recording asked.
    "compute-policy -l",
    "--query-gpu=compute_mode --format=csv",
    "--query-gpu=compute_mode,mig.mode.current --format=csv,noheader",
    "-q -d COMPUTE",
    "-q",
    "-h",
    "compute-policy -h",
    "mig -h",
    # The same settings in the help's other spellings.
    f"-c 3 -i {UUID}",
    f"--id={UUID} --compute-mode=EXCLUSIVE_PROCESS",
    f"compute-policy --id {UUID} --set-timeslice 2",
    "compute-policy -i 0,1 --set-timeslice 1",
    "-L",
    "",
    "mig -lgip -i 0",
]

REFUSED = [
    ("-q -d FABRIC", BAD_DISPLAY),  # recorded: rc 2, "Failed to parse --display/-d flags"
    (f"-i {UUID} -c BOGUS", INVALID),
    (f"-i {UUID} -c", INVALID),  # a value missing
    (f"-i {UUID} -c DEFAULT -pm 1", INVALID),  # two modifications at once
    (f"-i {UUID} -c DEFAULT -c DEFAULT", INVALID),
    (f"-i={UUID} -c DEFAULT", INVALID),  # a short option takes its value as the next word
    (f"compute-policy -i {UUID} --set-timeslice 4", INVALID),
    (f"compute-policy -i {UUID} --set-timeslice=SHORT", INVALID),  # 0-3 only
    (f"compute-policy -i {UUID} --set-timeslice", INVALID),
    (f"compute-policy -i {UUID}", INVALID),  # no action
    (f"compute-policy -i {UUID} -l --set-timeslice 1", INVALID),
    (f"compute-policy -i {UUID} -c DEFAULT", INVALID),  # -c is not a compute-policy option
    (f"--set-timeslice 1 -i {UUID}", INVALID),  # the subcommand missing
    ("--query-gpu=compute_mode", INVALID),  # --format=csv is mandatory
    ("--query-gpu=compute_mode --format=json", INVALID),
    ("-x -d COMPUTE -q", INVALID),  # -d does not work with -x
    ("-L -q", INVALID),
    ("--bogus", INVALID),
    ("-i", INVALID),
]


@pytest.mark.parametrize("argv", ACCEPTED)
def test_forms_the_real_tool_accepts(argv: str) -> None:
    assert refusal(argv.split()) is None


@pytest.mark.parametrize(("argv", "message"), REFUSED)
def test_forms_the_real_tool_refuses(argv: str, message: str) -> None:
    assert refusal(argv.split()) == Refusal(2, message)


def test_the_driver_sends_only_accepted_forms_and_the_stand_in_refuses_as_the_tool(
    tmp_path: Path,
) -> None:
    smi = Smi(tmp_path / "smi")
    tool = NvidiaSmi(smi.path)
    for level in TIMESLICE_LEVELS:
        tool.set_timeslice(UUID, level)
    calls = smi.calls()
    assert len(calls) == 2 * len(TIMESLICE_LEVELS)
    assert [c for c in calls if refusal(c.split()) is not None] == []
    # A form the real tool refuses fails here the way it fails there: exit 2, its message.
    with pytest.raises(NvidiaSmiError, match=r"failed \(exit 2\): Failed to parse --display"):
        tool.run("-q", "-d", "FABRIC")
    with pytest.raises(NvidiaSmiError, match=r"failed \(exit 2\): Invalid combination"):
        tool.run("compute-policy", "-i", UUID, "--set-timeslice", "Short")
    assert smi.calls() == ["-q -d FABRIC", f"compute-policy -i {UUID} --set-timeslice Short"]


NEAR_MISSES = [  # the stand-in's shortcut for the driver's forms must not take these
    f"-i {UUID} -c DEFAULT -eow",
    f"-i {UUID} -c default",
    f"-i {UUID} -c 0",
    f"compute-policy -i {UUID} --set-timeslice 7",
    f"compute-policy -i {UUID} --set-timeslice=",
    "compute-policy -i -l --set-timeslice 1",
    "-i -c -c DEFAULT",
]


def test_the_stand_in_answers_every_form_as_the_checker(tmp_path: Path) -> None:
    smi = Smi(tmp_path / "smi")
    forms = ACCEPTED + [argv for argv, _ in REFUSED] + NEAR_MISSES
    for argv in forms:
        done = subprocess.run([smi.path, *argv.split()], capture_output=True, text=True)
        refused = refusal(argv.split())
        expected = (0, "") if refused is None else (refused.exit_code, refused.message)
        assert (done.returncode, done.stdout.strip()) == expected, argv
    assert len(smi.calls()) == len(forms)  # refused or not, every call is recorded
