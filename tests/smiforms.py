"""Which argv the real ``nvidia-smi`` (R580) takes, and how it refuses the rest.

``refusal(argv)`` (argv without the program name) is None for a form the real tool accepts
and a :class:`Refusal` (exit code, message) otherwise. The stand-ins of tests refuse
through it, and the real-GPU suite checks every argv the plugin sent its recording
stand-in against it. The grammar is the recorded help of nvidia-smi 580.159.04 (``-h``,
``compute-policy -h``, ``mig -h``: reference/wave4/realgpu/nvidia-tools.txt), limited to
the options this project and its tests use, so a stand-in never takes what the real tool
might not; the answers are those a real H200 gave (tests/data/nvidia-smi-forms-h200.txt,
read-only and refused forms only, and smi-syntax.txt for the driver's two setting forms).

Recorded: a value may follow an option as the next word or after "=", short options too
(``-i=<uuid>``); display flags are case-insensitive; ``--format`` is optional; a bare
``compute-policy -i <uuid>`` prints its help and exits 0; an unknown option or a missing
value exits 255 (compute-policy's: 2), a bad value or combination 2. Where no answer was
recorded (an option given twice, two actions at once) the form is refused with the tool's
general message.
"""

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

INVALID_EXIT = 2  # nvidia-smi(1): a supplied argument or flag is invalid
UNPARSED_EXIT = 255  # recorded for an unknown option and for a missing value
HELP = "Please run 'nvidia-smi -h' for help."
INVALID = f"Invalid combination of input arguments. {HELP}"  # unrecorded cases
BAD_DISPLAY = "Failed to parse --display/-d flags"
DISPLAY_WITH_XML = (
    "Invalid combination of input arguments: --display/-d flags can not be combined with "
    "-x/--xml-format flags."
)
BAD_FORMAT = "Format modifier is not recognized."
BAD_TIMESLICE = (
    "Failed to set timeslice policy with value Unknown for GPU 0 : Invalid Argument\n"
    "Failed to set timeslice for requested devices : Invalid Argument"
)

COMPUTE_MODES = frozenset(
    {"0", "1", "2", "3", "DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS"}
)  # the help's spellings; another case was not tried on the real tool
TIMESLICES = frozenset({"0", "1", "2", "3"})  # 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG
TOGGLES = frozenset({"0", "1", "DISABLED", "ENABLED"})
DISPLAY = frozenset(
    {
        "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS",
        "PERFORMANCE", "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING", "ENCODER_STATS",
        "SUPPORTED_GPU_TARGET_TEMP", "VOLTAGE", "FBC_STATS", "ROW_REMAPPER",
        "GSP_FIRMWARE_VERSION", "POWER_SMOOTHING", "POWER_PROFILES",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Refusal:
    exit_code: int
    message: str


class _Refused(Exception):
    def __init__(self, message: str = INVALID, exit_code: int = INVALID_EXIT) -> None:
        super().__init__(message)
        self.refusal = Refusal(exit_code, message)


def _not_recognized(word: str, sub: bool) -> _Refused:
    if sub:
        return _Refused(f'Option "{word}" is not recognized.')
    return _Refused(f"ERROR: Option {word} is not recognized. Please run 'nvidia-smi -h'.", 255)


def _missing(word: str, sub: bool) -> _Refused:
    if sub:
        return _Refused(f'Option "{word}" is missing its value.')
    return _Refused(f"ERROR: Option {word} is missing its value. {HELP}", UNPARSED_EXIT)


def _not_valid_here(word: str) -> _Refused:
    return _Refused(f"ERROR: Option {word} is not valid for this command. {HELP}")


_Table = Mapping[str, tuple[str | None, str, bool]]  # name -> (short, long, takes a value)
_MAIN: _Table = {
    "help": ("-h", "--help", False),
    "version": (None, "--version", False),
    "list": ("-L", "--list-gpus", False),
    "query": ("-q", "--query", False),
    "xml": ("-x", "--xml-format", False),
    "id": ("-i", "--id", True),
    "display": ("-d", "--display", True),
    "filename": ("-f", "--filename", True),
    "compute-mode": ("-c", "--compute-mode", True),
    "persistence-mode": ("-pm", "--persistence-mode", True),
    "mig": ("-mig", "--multi-instance-gpu", True),
    "query-gpu": (None, "--query-gpu", True),
    "format": (None, "--format", True),
    "error-on-warning": ("-eow", "--error-on-warning", False),
}
_COMPUTE_POLICY: _Table = {
    "help": ("-h", "--help", False),
    "id": ("-i", "--id", True),
    "list": ("-l", "--list", False),
    "set-timeslice": (None, "--set-timeslice", True),
}
_MIG: _Table = {
    "help": ("-h", "--help", False),
    "id": ("-i", "--id", True),
    "lgip": ("-lgip", "--list-gpu-instance-profiles", False),
    "lgi": ("-lgi", "--list-gpu-instances", False),
    "lci": ("-lci", "--list-compute-instances", False),
}
_MODIFY = ("compute-mode", "persistence-mode", "mig")


def _options(argv: Sequence[str], table: _Table, *, sub: bool) -> dict[str, tuple[str, str]]:
    """name -> (the word used, value; "" for a flag), in order given."""
    by_word = {w: (name, takes) for name, (s, lg, takes) in table.items() for w in (s, lg) if w}
    found: dict[str, tuple[str, str]] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        head, eq, tail = word.partition("=")
        if eq and head in by_word and by_word[head][1]:
            (name, _), used, value = by_word[head], head, tail
        elif word in by_word:
            (name, takes), used, value = by_word[word], word, ""
            if takes:
                if not words or words[0].startswith("-"):
                    raise _missing(word, sub)
                value = words.pop(0)
        else:
            raise _not_recognized(head if eq else word, sub)
        if table[name][2] and not value:
            raise _missing(used, sub)
        if name in found:
            raise _Refused
        found[name] = (used, value)
    return found


def _check_ids(opts: Mapping[str, tuple[str, str]]) -> None:
    if "id" in opts and any(not p for p in opts["id"][1].split(",")):
        raise _Refused


def _only(opts: Mapping[str, tuple[str, str]], allowed: set[str]) -> None:
    for name, (word, _) in opts.items():
        if name not in allowed:
            raise _not_valid_here(word)


def _main(argv: Sequence[str]) -> None:
    opts = _options(argv, _MAIN, sub=False)
    _check_ids(opts)
    first = next(iter(opts), None)
    if first in ("help", "version", "list"):
        _only(opts, {first})
        return
    modify = [m for m in opts if m in _MODIFY]
    if modify:  # DEVICE MODIFICATION: any one of, plus optional -i, -eow
        _only(opts, {modify[0], "id", "error-on-warning"})
        word, value = opts[modify[0]]
        if value not in (COMPUTE_MODES if modify[0] == "compute-mode" else TOGGLES):
            raise _Refused(f"ERROR: Option {value} is invalid for {word}. {HELP}")
        return
    if "query-gpu" in opts:  # SELECTIVE QUERY
        _only(opts, {"query-gpu", "format", "id", "filename"})
        formats = opts.get("format", ("", "csv"))[1].split(",")
        if formats[0] != "csv" or set(formats[1:]) - {"noheader", "nounits"}:
            raise _Refused(BAD_FORMAT)
        return
    if "query" in opts:
        _only(opts, {"query", "id", "xml", "display", "filename"})
        if "display" in opts and "xml" in opts:
            raise _Refused(DISPLAY_WITH_XML)
        if "display" in opts and set(opts["display"][1].upper().split(",")) - DISPLAY:
            raise _Refused(BAD_DISPLAY)
        return
    _only(opts, {"id", "filename"})  # the summary, of one GPU or all


def _compute_policy(argv: Sequence[str]) -> None:
    opts = _options(argv, _COMPUTE_POLICY, sub=True)
    _check_ids(opts)
    if len({"help", "list", "set-timeslice"} & set(opts)) > 1:
        raise _Refused  # two actions: unrecorded
    if "set-timeslice" in opts and opts["set-timeslice"][1] not in TIMESLICES:
        raise _Refused(BAD_TIMESLICE)
    # No action at all prints the help, and exits 0.


def _mig(argv: Sequence[str]) -> None:
    opts = _options(argv, _MIG, sub=True)
    _check_ids(opts)
    if len({"help", "lgip", "lgi", "lci"} & set(opts)) != 1:
        raise _Refused


def refusal(argv: Sequence[str]) -> Refusal | None:
    """None when the real nvidia-smi takes ``argv``; else how it refuses it."""
    try:
        if argv and argv[0] == "compute-policy":
            _compute_policy(argv[1:])
        elif argv and argv[0] == "mig":
            _mig(argv[1:])
        else:
            _main(argv)
    except _Refused as exc:
        return exc.refusal
    return None


def main() -> None:
    """A stand-in's check of its own argv: the real tool's refusal (message, exit code), or
    nothing and exit 0."""
    refused = refusal(sys.argv[1:])
    if refused is not None:
        print(refused.message)
        sys.exit(refused.exit_code)
