"""The two file-system primitives every part shares, with modes that do not depend on the
process umask (a plugin started with umask 000 must not leave world-writable state, and one
started with umask 077 must not hide a CDI spec from the runtime).

- :func:`ensure_dir`: a directory and its missing parents, each with exactly its mode.
- :func:`write_atomic`: a temp file beside the target, then a rename over it; the temp name
  (``.<name>.<hex>.tmp``) starts with a dot and ends in ``.tmp``, so nothing that scans the
  directory (a CDI registry, the plugin's recovery) mistakes it for a finished file.
"""

import contextlib
import os
import secrets
from pathlib import Path

TEMP_SUFFIX = ".tmp"
FILE = 0o644


def ensure_dir(
    path: Path, mode: int, *, parent_mode: int | None = None, ours: bool = False
) -> None:
    """Create ``path`` with exactly ``mode`` and its missing parents with ``parent_mode``
    (default: ``mode``).

    An existing directory keeps its mode (it may be the kubelet's, or shared), unless
    ``ours``: the directory belongs to this driver alone, so a mode an older release left
    (under a looser umask) is narrowed too.
    """
    missing = []
    at = path
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        wanted = mode if directory == path else (mode if parent_mode is None else parent_mode)
        try:
            directory.mkdir(mode=wanted)  # never wider than wanted, even before the chmod
        except FileExistsError:
            continue  # made in between by someone else: theirs, left as it is
        directory.chmod(wanted)
    if ours and not missing:
        path.chmod(mode)


def write_atomic(
    path: Path, content: bytes | str, *, mode: int = FILE, fsync: bool = False
) -> None:
    """Temp file in the same directory with exactly ``mode``, (fsync,) rename over ``path``;
    a failure leaves no temp file behind."""
    data = content.encode() if isinstance(content, str) else content
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
