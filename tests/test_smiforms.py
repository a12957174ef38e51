"""The nvidia-smi forms the stand-ins take and refuse are the real tool's (tests.smiforms)."""

import subprocess
from pathlib import Path

import pytest

from drivers.gpu.model.nvidiasmi import TIMESLICE_LEVELS, NvidiaSmi, NvidiaSmiError
from tests.smiforms import (
    BAD_DISPLAY,
    BAD_FORMAT,
    BAD_TIMESLICE,
    DISPLAY_WITH_XML,
    HELP,
    INVALID,
    Refusal,
    refusal,
)
from tests.test_timeslicing import Smi

UUID = "GPU-b7ce442e-8038-7675-6b31-06dbd373c7f5"
RECORDED = Path(__file__).resolve().parent / "data" / "nvidia-smi-forms-h200.txt"

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
    # Recorded: "=" after a short option, lower-case display flags, no --format, and a bare
    # compute-policy (it prints its help).
    f"-i={UUID} -q -d COMPUTE",
    "-q -d compute",
    "--query-gpu=compute_mode",
    f"compute-policy -i {UUID}",
]

REFUSED = [  # what the real tool answered (tests/data/nvidia-smi-forms-h200.txt), or (*) not
    ("-q -d FABRIC", 2, BAD_DISPLAY),
    (f"-i {UUID} -c BOGUS", 2, f"ERROR: Option BOGUS is invalid for -c. {HELP}"),
    (f"-i {UUID} -c", 255, f"ERROR: Option -c is missing its value. {HELP}"),
    ("-i", 255, f"ERROR: Option -i is missing its value. {HELP}"),
    ("--bogus", 255, "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'."),
    ("-L -q", 2, f"ERROR: Option -q is not valid for this command. {HELP}"),
    (f"-i {UUID} -c DEFAULT -pm 1", 2, f"ERROR: Option -pm is not valid for this command. {HELP}"),
    (f"-i {UUID} -c DEFAULT -c DEFAULT", 2, INVALID),  # (*)
    (f"compute-policy -i {UUID} --set-timeslice 4", 2, BAD_TIMESLICE),
    (f"compute-policy -i {UUID} --set-timeslice=SHORT", 2, BAD_TIMESLICE),  # (*) 0-3 only
    (f"compute-policy -i {UUID} --set-timeslice", 2,
     'Option "--set-timeslice" is missing its value.'),
    (f"compute-policy -i {UUID} -l --set-timeslice 1", 2, INVALID),  # (*)
    (f"compute-policy -i {UUID} -c DEFAULT -l", 2, 'Option "-c" is not recognized.'),
    (f"--set-timeslice 1 -i {UUID}", 255,
     "ERROR: Option --set-timeslice is not recognized. Please run 'nvidia-smi -h'."),
    ("--query-gpu=compute_mode --format=json", 2, BAD_FORMAT),
    ("-x -d COMPUTE -q", 2, DISPLAY_WITH_XML),
]  # fmt: skip


@pytest.mark.parametrize("argv", ACCEPTED)
def test_forms_the_real_tool_accepts(argv: str) -> None:
    assert refusal(argv.split()) is None


@pytest.mark.parametrize(("argv", "code", "message"), REFUSED)
def test_forms_the_real_tool_refuses(argv: str, code: int, message: str) -> None:
    assert refusal(argv.split()) == Refusal(code, message)


def test_every_answer_recorded_on_a_real_h200() -> None:
    """Each form asked of the real nvidia-smi: accepted (rc 0) or refused as it refused it."""
    blocks = RECORDED.read_text().split("===== nvidia-smi")[1:]
    for block in blocks:
        argv, *output, rc = block.strip("\n").split("\n")
        code = int(rc.removeprefix("rc="))
        refused = refusal(argv.split())
        if code == 0:
            assert refused is None, argv
        else:
            assert refused is not None, argv
            assert (refused.exit_code, refused.message) == (code, "\n".join(filter(None, output)))
    assert len(blocks) == 28


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
        tool.run("-i", UUID, "-c", "DEFAULT", "-c", "DEFAULT")
    assert smi.calls() == ["-q -d FABRIC", f"-i {UUID} -c DEFAULT -c DEFAULT"]


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
    forms = ACCEPTED + [argv for argv, _, _ in REFUSED] + NEAR_MISSES
    for argv in forms:
        done = subprocess.run([smi.path, *argv.split()], capture_output=True, text=True)
        refused = refusal(argv.split())
        expected = (0, "") if refused is None else (refused.exit_code, refused.message)
        assert (done.returncode, done.stdout.strip()) == expected, argv
    assert len(smi.calls()) == len(forms)  # refused or not, every call is recorded
