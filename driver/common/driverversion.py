"""The NVIDIA driver version floor of ComputeDomains, as a pure check.

NVIDIA's ComputeDomain kubelet plugin refuses to start below 570.158.01, the first driver whose
IMEX daemon re-resolves DNS names on SIGUSR1 (``IMEXDaemonsWithDNSNamesMinDriverVersion``), and
our IMEX daemon repeats the check. Both read the version from NVML; this module only compares,
so node code and cluster code share it without either importing the other.

Versions compare as Kubernetes' ``version.ParseGeneric`` reads them: dot-separated numbers,
leading zeros ignored (``570.158.01`` is 570.158.1), anything after the numbers dropped.
"""

import re

from driver.common.errors import PermanentError

IMEX_DNS_NAMES_FLOOR = "570.158.01"

_GENERIC = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class DriverTooOld(PermanentError):
    """The node's NVIDIA driver is older than the floor: nothing but an upgrade helps."""


def parse(text: str) -> tuple[int, int, int]:
    """``570.158.01`` as (570, 158, 1); raises :class:`PermanentError` for anything else."""
    match = _GENERIC.match(text.strip())
    if match is None:
        raise PermanentError(f"NVIDIA driver version {text!r} is not a dotted version number")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def require_floor(found: str, floor: str = IMEX_DNS_NAMES_FLOOR) -> None:
    """Raise :class:`DriverTooOld` (one line: what was found, what is needed, what to do)."""
    if parse(found) < parse(floor):
        raise DriverTooOld(
            f"NVIDIA driver {found} is older than {floor}, the first whose IMEX daemon "
            "ComputeDomains can run (DNS names): upgrade the node's driver"
        )
