"""The daemon's block of name mappings in an ``/etc/hosts``-format file.

:func:`merge` is pure: the file's text and a mapping in, the new text out. Our lines sit
between two marker comments; a rewrite replaces that block where it stands and keeps every
other line, so the file never grows on rewrites (NVIDIA's daemon appends a separator comment
on each one, which accumulates). Lines outside the block that map one of our names are
dropped: a resolver takes the first line naming a host, and a stale one (left by NVIDIA's
daemon in the same pod, or by hand) would shadow ours.

:func:`write` is the I/O: read, merge, write only on a difference, atomically.
"""

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from cluster.imexdaemon.peers import NAME
from driver.common import fsutil
from driver.common.errors import RetryableError
from driver.common.logs import kv

log = logging.getLogger(__name__)

BEGIN = "# BEGIN compute-domain-daemon mappings (gpu-dra compute-domain-daemon; do not edit)"
END = "# END compute-domain-daemon mappings"
_NVIDIA_SEPARATOR = "# Compute Domain Daemon mappings"
# A rename over a bind-mounted file fails with the first two; a read-only root file system
# (a pod's readOnlyRootFilesystem, with /etc/hosts still mounted writable) with the others.
_NOT_RENAMEABLE = frozenset((errno.EBUSY, errno.EXDEV, errno.EROFS, errno.EACCES, errno.EPERM))


def _names_ours(line: str) -> bool:
    fields = line.split("#", 1)[0].split()
    return len(fields) >= 2 and any(NAME.match(name) for name in fields[1:])


def block(mapping: Mapping[str, str]) -> list[str]:
    """Our lines for ``mapping`` (IP to name), by name; none for an empty mapping."""
    if not mapping:
        return []
    entries = sorted(mapping.items(), key=lambda item: item[1])
    return [BEGIN, *(f"{ip}\t{name}" for ip, name in entries), END]


def merge(current: str, mapping: Mapping[str, str]) -> str:
    """``current`` with our block set to ``mapping``, in place (appended where there was none)."""
    kept: list[str] = []
    at: int | None = None  # where our block was, in ``kept``
    inside = False
    for line in current.splitlines():
        stripped = line.strip()
        if inside:
            if stripped == END:
                inside = False
                continue
            if _names_ours(stripped):
                continue
            inside = False  # an unterminated block ends at the first line not ours
        if stripped == BEGIN:
            inside = True
            if at is None:
                at = len(kept)
            continue
        if stripped in (END, _NVIDIA_SEPARATOR) or _names_ours(stripped):
            continue
        kept.append(line)
    if at is None:
        at = len(kept)
    lines = kept[:at] + block(mapping) + kept[at:]
    return "".join(f"{line}\n" for line in lines)


def write(path: Path, mapping: Mapping[str, str]) -> bool:
    """Set our block of ``path`` to ``mapping``; True when the file changed.

    Atomic (a temp file renamed over it) where it can be. A pod's ``/etc/hosts`` is a file the
    kubelet bind-mounts, and a rename over a mount point fails (as does making the temp file
    beside it on a read-only root file system): there the text is written over the file in
    one write and the rest cut off, the way NVIDIA's daemon always writes it. A reader may see
    a mix for that instant; the resolver reads the file again at its next lookup.
    """
    try:
        current = path.read_text()
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        current, mode = "", fsutil.FILE
    except OSError as exc:
        raise RetryableError(f"{path}: cannot read: {exc.strerror}") from exc
    wanted = merge(current, mapping)
    if wanted == current:
        return False
    try:
        fsutil.write_atomic(path, wanted, mode=mode)
    except OSError as exc:
        if exc.errno not in _NOT_RENAMEABLE:
            raise RetryableError(f"{path}: cannot write: {exc.strerror}") from exc
        log.info("hosts file is a mount point: rewritten in place", extra=kv(path=str(path)))
        _overwrite(path, wanted.encode())
    return True


def _overwrite(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise RetryableError(f"{path}: cannot open: {exc.strerror}") from exc
    try:
        # Written before the cut, so the file is never empty in between.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError as exc:
        raise RetryableError(f"{path}: cannot write: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
