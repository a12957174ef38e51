"""File-system failures injected at the system-call layer, under one directory only.

A full disk or a read-only mount is what the kernel answers, not something our code
decides: the fault goes where the kernel would give it (``os.write``, ``os.open``,
``os.unlink``, ``os.replace``, ``os.symlink``), so every line of ours between the call
and the error runs as it would on a real node. A tmpfs with a size limit or a
read-only remount would need mount rights that a test run does not have everywhere.
"""

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def _under(path: Any, directory: Path, dir_fd: int | None = None) -> bool:
    if dir_fd is not None:
        base = Path(f"/proc/self/fd/{dir_fd}").readlink()
        path = base / os.fsdecode(path)
    return Path(os.fsdecode(path)).absolute().is_relative_to(directory)


def _fd_under(fd: int, directory: Path) -> bool:
    try:
        return Path(f"/proc/self/fd/{fd}").readlink().is_relative_to(directory)
    except OSError:
        return False


@dataclass
class Faults:
    """How many calls each fault answered (a test asserts the fault was really hit)."""

    hits: list[str] = field(default_factory=list)


def disk_full(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Faults:
    """Every write to a file under ``directory`` fails with ENOSPC, as on a full disk."""
    faults = Faults()
    real_write = os.write
    directory = directory.resolve()

    def write(fd: int, data: Any) -> int:
        if _fd_under(fd, directory):
            faults.hits.append("write")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return faults


def read_only(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Faults:
    """``directory`` is on a read-only mount: whatever would change it fails with EROFS
    (``unlink`` too, also of a name that does not exist: the kernel checks the mount
    before it looks the name up); reads go on working."""
    faults = Faults()
    directory = directory.resolve()
    real: dict[str, Any] = {n: getattr(os, n) for n in ("unlink", "replace", "symlink")}
    real_open = os.open
    changes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def refuse(name: str) -> OSError:
        faults.hits.append(name)
        return OSError(errno.EROFS, os.strerror(errno.EROFS))

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & changes and _under(path, directory, dir_fd):
            raise refuse("open")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        if _under(path, directory, dir_fd):
            raise refuse("unlink")
        real["unlink"](path, dir_fd=dir_fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if _under(src, directory) or _under(dst, directory):
            raise refuse("rename")
        real["replace"](src, dst, **kwargs)

    def symlink(target: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if _under(path, directory):
            raise refuse("symlink")
        real["symlink"](target, path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", replace)
    monkeypatch.setattr(os, "symlink", symlink)
    return faults
