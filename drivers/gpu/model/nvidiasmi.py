"""``nvidia-smi``, for the settings NVML cannot change on bare metal.

NVML has no setter for the compute time slice of a GPU (only vGPU schedulers have
one), so time-slicing is applied the way NVIDIA's DRA driver applies it: compute mode
``DEFAULT`` (several processes may hold a context), then ``compute-policy
--set-timeslice``. The binary is the host's, under the driver root; tests give a
stand-in script. Blocking calls: run them from a worker thread.

The plugin's image carries no NVIDIA library, so the host's ``nvidia-smi`` run from the
container would not find ``libnvidia-ml.so.1`` on the container's loader path: it runs
with the driver root's copy preloaded (by soname, the loader then uses it), as NVIDIA's
driver runs it.
"""

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from driver.common.errors import PermanentError, RetryableError
from driver.common.logs import kv

log = logging.getLogger(__name__)

# NVIDIA's TimeSliceInterval.Int() in k8s-dra-driver-gpu: the values nvidia-smi takes.
TIMESLICE_LEVELS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

_TIMEOUT_S = 30.0
_OUTPUT_CHARS = 400


def default_path(container_driver_root: Path) -> Path:
    return container_driver_root / "usr" / "bin" / "nvidia-smi"


class NvidiaSmiMissingError(PermanentError):
    """No nvidia-smi where the plugin was told to look: a retry will not help."""


class NvidiaSmiError(RetryableError):
    """nvidia-smi ran and failed (GPU busy, driver hiccup): a later retry may succeed."""


@dataclass(frozen=True, slots=True)
class NvidiaSmi:
    path: Path
    preload: Path | None = None  # the libnvidia-ml.so.1 it runs with; None: the loader's

    def run(self, *args: str) -> None:
        argv = [str(self.path), *args]
        env = None if self.preload is None else {**os.environ, "LD_PRELOAD": str(self.preload)}
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False, env=env
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise NvidiaSmiMissingError(f"cannot run nvidia-smi at {self.path}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise NvidiaSmiError(f"nvidia-smi {' '.join(args)} timed out") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()[-_OUTPUT_CHARS:]
            raise NvidiaSmiError(
                f"nvidia-smi {' '.join(args)} failed (exit {done.returncode}): {output}"
            )
        log.info("nvidia-smi", extra=kv(command=" ".join(args)))

    def set_timeslice(self, uuid: str, interval: str) -> None:
        """Compute mode DEFAULT, then the time slice ``interval`` (Default/Short/...)."""
        self.run("-i", uuid, "-c", "DEFAULT")
        self.run("compute-policy", "-i", uuid, "--set-timeslice", str(TIMESLICE_LEVELS[interval]))
