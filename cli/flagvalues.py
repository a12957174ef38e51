"""The parsers of flag values: each turns the text of a flag or its environment variable into
a value, or raises :class:`argparse.ArgumentTypeError` with what was expected."""

import argparse
import re

_GATE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)=(true|false)$")


def feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` as Kubernetes components take it."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _GATE.match(item)
        if match is None:
            raise argparse.ArgumentTypeError(f"{item!r}: expected Name=true or Name=false")
        gates[match[1]] = match[2] == "true"
    return gates


def xids(text: str) -> frozenset[int]:
    # Imported here: `gpu-dra --help` must not load the health rules.
    from drivers.gpu.model.devicehealth import parse_xids

    try:
        return parse_xids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def recoverable_xids(text: str) -> frozenset[int]:
    from drivers.gpu.model.devicehealth import parse_recoverable_xids

    try:
        return parse_recoverable_xids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def probes(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of probes, 0 for off")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, more than 0")
    return value


def max_nodes(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if not 0 < value < 10_000:  # the daemons' names have four digits
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of nodes from 1 to 9999")
    return value


def boolean(text: str) -> bool:
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


def names_list(text: str) -> tuple[str, ...]:
    """``a,b,c``: object names (image pull secrets), empty items dropped."""
    return tuple(filter(None, (part.strip() for part in text.split(","))))


def positive(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, more than 0")
    return value


def file_size(text: str) -> int:
    """A byte count: ``1048576``, ``64Mi``, ``10M``."""
    from tools.userfiles import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_max_file_size(parser: argparse.ArgumentParser) -> None:
    """``--max-file-size`` of the commands that read users' files (validate, explain)."""
    parser.add_argument(
        "--max-file-size",
        type=file_size,
        default="64Mi",
        metavar="SIZE",
        help="refuse an input file (or stdin) larger than this, e.g. 1Mi (default 64Mi); "
        "only regular files are read",
    )
