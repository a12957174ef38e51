"""Our packages byte-compiled, as installing them (or the image's build) leaves them.

Where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, no run writes the cache
itself: every process would compile our modules from source again, a cost an installed driver
never pays. A bench that times whole processes compiles them once first.
"""

import compileall
from pathlib import Path

PACKAGES = ("api", "cli", "cluster", "driver", "drivers", "kubeletplugin", "tools")


def byte_compile(tree: Path) -> None:
    for package in PACKAGES:
        compileall.compile_dir(tree / package, quiet=1)
