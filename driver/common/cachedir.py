"""This user's cache of files derived from the installed code and built on first use:
``$GPU_DRA_CACHE``, by default ``~/.cache/gpu-dra``."""

import os
import stat
from pathlib import Path

CACHE_ENV = "GPU_DRA_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gpu-dra")


def private_dir(name: str) -> Path | None:
    """``<cache>/<name>``, made if missing, when only this user can write to it; None when it
    cannot be made or others could write to it. What such a directory holds may be trusted
    as far as the code is (a pickle, a library to load): only this user could have put it
    there."""
    path = cache_root() / name
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return path
