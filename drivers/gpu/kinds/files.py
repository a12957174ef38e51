"""The modes of a kind's state directories (made with :func:`driver.common.fsutil.ensure_dir`
and written with its ``write_atomic``), and the few opens the plugin makes in a directory a
container can write (an MPS pipe directory, or a log
directory that an earlier release mounted into containers): from a directory descriptor,
never through a link, the type judged on the opened inode and not by a look beforehand
(a container can swap the entry between the look and the open)."""

import errno
import logging
import os
import shutil
import stat
from pathlib import Path

from driver.common.fsutil import FILE
from driver.common.logs import kv

log = logging.getLogger(__name__)

PRIVATE = 0o750  # as the plugin's own directory
SHARED = 0o755  # a directory that containers get mounted (an MPS pipe)


def open_dir(path: Path) -> int:
    """A descriptor of the directory ``path`` (its last component no link), for the calls
    below. Raises OSError."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def remove_entry(dir_fd: int, name: str) -> bool:
    """Remove whatever is at ``name`` in ``dir_fd``: a file, a link (never its target), a
    pipe, a socket or a planted tree. False when nothing was there. Raises OSError."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        # The descriptor-based walk: a link inside the tree is removed, not followed, and
        # a tree swapped for a link meanwhile is refused.
        shutil.rmtree(name, dir_fd=dir_fd)
    return True


def exists(dir_fd: int, name: str) -> bool:
    """Something is at ``name`` in ``dir_fd`` (a link counts as itself, not followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def open_regular(dir_fd: int, name: str, flags: int) -> int:
    """``name`` in ``dir_fd`` opened with ``flags``, made when missing, and only ever as a
    regular file. An ``O_PATH`` descriptor runs no driver's open and waits on no FIFO, so
    a planted device node or pipe is judged by ``fstat`` before anything opens it for
    reading or writing; the file is then reopened through that descriptor, which is the
    same inode, not the name again. Anything else at ``name`` is removed (logged) and a
    new file made. Raises OSError."""
    for _ in range(3):
        try:
            path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            create = flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(name, create, FILE, dir_fd=dir_fd)
            except FileExistsError:
                continue  # something appeared meanwhile: judged again
            os.fchmod(fd, FILE)
            return fd
        try:
            mode = os.fstat(path_fd).st_mode
            if stat.S_ISREG(mode):
                return os.open(f"/proc/self/fd/{path_fd}", flags | os.O_CLOEXEC)
        finally:
            os.close(path_fd)
        log.warning(
            "removed what is not a regular file from where one of ours belongs",
            extra=kv(entry=name, type=stat.filemode(mode)[0]),
        )
        remove_entry(dir_fd, name)
    raise OSError(errno.EEXIST, f"{name} keeps being replaced by what is not a regular file")
