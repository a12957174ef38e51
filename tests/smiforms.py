"""Which argv the real ``nvidia-smi`` (R580) takes, and how it refuses the rest.

``refusal(argv)`` (argv without the program name) is None for a form the real tool accepts
and a :class:`Refusal` (exit code, message) otherwise. The stand-ins of tests refuse
through it, and the real-GPU suite checks every argv the plugin sent its recording
stand-in against it. The grammar is the one of the recorded help of nvidia-smi 580.159.04
(``-h``, ``compute-policy -h``, ``mig -h``) and the calls recorded on a real H200
(reference/wave4/realgpu: smi-syntax.txt, nvidia-tools.txt), limited to the options this
project and its tests use: a form outside it is refused, so a stand-in never accepts what
the real tool might not.

Exit code 2 is the tool's "a supplied argument or flag is invalid" (nvidia-smi(1), and the
recorded ``-q -d FABRIC``). Only that refusal's message was recorded ("Failed to parse
--display/-d flags"); the others use the tool's general one.
"""

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

INVALID_ARGUMENT_EXIT = 2
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
BAD_DISPLAY = "Failed to parse --display/-d flags"  # recorded: nvidia-smi -q -d FABRIC

COMPUTE_MODES = frozenset(
    {"0", "1", "2", "3", "DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS"}
)
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
    def __init__(self, message: str = INVALID) -> None:
        super().__init__(message)
        self.message = message


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


def _options(argv: Sequence[str], table: _Table) -> dict[str, str]:
    """name -> value ("" for a flag). A short option's value is the next word; a long one's
    follows "=" or is the next word (both recorded for --set-timeslice). Each at most once."""
    by_word = {w: (name, takes) for name, (s, lg, takes) in table.items() for w in (s, lg) if w}
    found: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        head, eq, tail = word.partition("=")
        if eq and head.startswith("--") and head in by_word and by_word[head][1]:
            name, value = by_word[head][0], tail
        elif word in by_word:
            name, takes = by_word[word]
            value = ""
            if takes:
                if not words or words[0].startswith("-"):
                    raise _Refused
                value = words.pop(0)
        else:
            raise _Refused
        if name in found or (table[name][2] and not value):
            raise _Refused
        found[name] = value
    return found


def _ids(value: str) -> None:
    if any(not part or part.startswith("-") for part in value.split(",")):
        raise _Refused


def _main(argv: Sequence[str]) -> None:
    opts = _options(argv, _MAIN)
    if "id" in opts:
        _ids(opts["id"])
    alone = {"help", "version", "list"} & set(opts)
    if alone:
        if len(opts) != 1:
            raise _Refused
        return
    modify = [m for m in _MODIFY if m in opts]
    if modify:  # DEVICE MODIFICATION: any one of, plus optional -i, -eow
        if len(modify) != 1 or set(opts) - {modify[0], "id", "error-on-warning"}:
            raise _Refused
        allowed = COMPUTE_MODES if modify[0] == "compute-mode" else TOGGLES
        if opts[modify[0]] not in allowed:
            raise _Refused
        return
    if "query-gpu" in opts:  # SELECTIVE QUERY: --format=csv mandatory
        formats = opts.get("format", "").split(",")
        if formats[0] != "csv" or set(formats[1:]) - {"noheader", "nounits"}:
            raise _Refused
        if set(opts) - {"query-gpu", "format", "id", "filename"}:
            raise _Refused
        return
    if "query" in opts:
        if set(opts) - {"query", "id", "xml", "display", "filename"}:
            raise _Refused
        if "display" in opts and "xml" in opts:  # the help: -d "doesn't work with -x"
            raise _Refused
        if "display" in opts and set(opts["display"].split(",")) - DISPLAY:
            raise _Refused(BAD_DISPLAY)
        return
    if set(opts) - {"id", "filename"}:  # the summary, of one GPU or all
        raise _Refused


def _compute_policy(argv: Sequence[str]) -> None:
    opts = _options(argv, _COMPUTE_POLICY)
    if "id" in opts:
        _ids(opts["id"])
    actions = {"help", "list", "set-timeslice"} & set(opts)
    if len(actions) != 1 or ("help" in opts and len(opts) != 1):
        raise _Refused
    if "set-timeslice" in opts and opts["set-timeslice"] not in TIMESLICES:
        raise _Refused


def _mig(argv: Sequence[str]) -> None:
    opts = _options(argv, _MIG)
    if "id" in opts:
        _ids(opts["id"])
    actions = {"help", "lgip", "lgi", "lci"} & set(opts)
    if len(actions) != 1 or ("help" in opts and len(opts) != 1):
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
        return Refusal(INVALID_ARGUMENT_EXIT, exc.message)
    return None


def main() -> None:
    """A stand-in's check of its own argv: the real tool's refusal (message, exit code), or
    nothing and exit 0."""
    refused = refusal(sys.argv[1:])
    if refused is not None:
        print(refused.message)
        sys.exit(refused.exit_code)
