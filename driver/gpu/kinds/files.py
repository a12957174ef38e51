"""Files a kind keeps in its state directory, with modes that do not depend on the umask
(a plugin started with umask 000 must not leave world-writable state)."""

import os
import secrets
from pathlib import Path

PRIVATE = 0o750  # as the plugin's own directory
SHARED = 0o755  # a directory that containers get mounted (an MPS pipe)
FILE = 0o644


def make_dir(path: Path, mode: int = PRIVATE) -> None:
    """``path`` and its missing parents, each with exactly ``mode``."""
    if path.is_dir():
        return
    make_dir(path.parent, PRIVATE)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return
    path.chmod(mode)


def write_atomic(path: Path, text: str) -> None:
    """Temp file (a dot name, which readers skip), then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE)
    try:
        os.fchmod(fd, FILE)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    tmp.replace(path)
