"""Build the simulated ``libnvidia-ml.so.1`` from ``nvml.c``, cached by a hash of its inputs.

The cache is ``$GPU_DRA_CACHE`` (default ``~/.cache/gpu-dra``)/``sim-nvml/<hash>/``. A build
writes a temporary file and renames it, so concurrent builders (the demo starts several
plugin processes at once) never see half a library.
"""

import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from driver.common.cachedir import CACHE_ENV as CACHE_ENV
from driver.common.cachedir import cache_root
from driver.common.errors import PermanentError
from driver.nvml.library import SONAME

_FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")


class BuildError(PermanentError):
    """The simulated NVML library cannot be built (no C compiler, or it rejects the source)."""


def source() -> bytes:
    return (resources.files("driver.nvml.sim") / "nvml.c").read_bytes()


def cache_dir() -> Path:
    return cache_root() / "sim-nvml"


def library(*, omit: tuple[str, ...] = ()) -> Path:
    """The built library; ``omit`` leaves symbols out, as an older driver's library would."""
    text = source()
    digest = hashlib.sha256(text + repr((_FLAGS, sorted(omit))).encode()).hexdigest()[:16]
    out = cache_dir() / digest / SONAME
    if out.is_file():
        return out
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError(
            "the simulated NVML is a C library built on first use, and no C compiler (cc) "
            "is on PATH: install one (e.g. gcc), or set CC"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / "nvml.c"
    src.write_bytes(text)
    argv = [compiler, *_FLAGS, f"-Wl,-soname,{SONAME}"]
    if omit:
        # A version script that hides the omitted symbols: the rest stay exported.
        script = out.parent / "exports.map"
        script.write_text("{ local: " + "; ".join(omit) + "; };\n")
        argv.append(f"-Wl,--version-script={script}")
    tmp = out.with_name(f".{SONAME}.{os.getpid()}.tmp")
    argv += ["-o", str(tmp), str(src), "-lpthread"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-2000:]}")
    tmp.replace(out)
    return out
