"""Stand-ins for the driver's tools (``nvidia-smi``, ``nvidia-cuda-mps-control``): shell
scripts that record each call, one a line, and fail on demand."""

import contextlib
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


class StandIn:
    """``root/name`` running ``script``, formatted with ``{log}`` (where its calls go)
    and ``{fail}`` (a file whose presence the script may answer with a failure)."""

    def __init__(self, root: Path, name: str, script: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.log = root / "calls"
        self.fail = root / "fail"
        self.path = root / name
        self.path.write_text(script.format(log=self.log, fail=self.fail))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def calls(self) -> list[str]:
        """The calls since the last time this was asked."""
        calls = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return calls


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory under /tmp short enough for the socket paths a test makes under it:
    pytest's tmp_path is some 60 bytes before a test adds anything, and the MPS sockets
    must fit 106 (drivers.gpu.kinds.mpspaths)."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="m") as name:
        yield Path(name)
