"""The driver's character-device majors and the IMEX management capability, read from /proc.

Pure parsers and two small reads. The majors of ``nvidia-caps-imex-channels`` and
``nvidia-caps`` are dynamic: the driver registers them at load and lists them in
``/proc/devices``. NVIDIA's plugin takes a name's major only from the character-device
section (``internal/common/nvcaps.go``: ``Character devices:.*?([0-9]+) <name>\\n.*Block
devices:``), and so does this. ``proc_root`` is where ``proc/`` lies: ``/`` on a node (the
host's /proc/devices, which no namespace hides), a simulated node's root in tests, as
NVIDIA's ALT_PROC_DEVICES_PATH is for its mock.
"""

from dataclasses import dataclass
from pathlib import Path

from driver.common.errors import PermanentError

IMEX_CHANNELS = "nvidia-caps-imex-channels"
CAPS = "nvidia-caps"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_MGMT = "proc/driver/nvidia/capabilities/fabric-imex-mgmt"


class NvCapsError(PermanentError):
    """The driver does not list what an IMEX channel or the daemon needs."""


def major(devices_text: str, name: str) -> int:
    """The major of character device ``name`` in ``/proc/devices`` text."""
    section, found_block = devices_text.partition("Block devices:")[0], "Block devices:"
    if found_block not in devices_text or "Character devices:" not in section:
        raise NvCapsError("/proc/devices has no 'Character devices:' then 'Block devices:'")
    for line in section.partition("Character devices:")[2].splitlines():
        number, _, device = line.strip().partition(" ")
        if device.strip() == name and number.isdigit():
            return int(number)
    raise NvCapsError(f"/proc/devices lists no character device {name!r}: is the driver loaded?")


@dataclass(frozen=True, slots=True)
class Capability:
    minor: int
    mode: int  # as the driver writes it: decimal (438 = 0o666)


def capability(text: str) -> Capability:
    """A capability file's ``DeviceFileMinor`` and ``DeviceFileMode`` (decimal)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return Capability(minor=int(fields["DeviceFileMinor"]), mode=int(fields["DeviceFileMode"]))
    except (KeyError, ValueError) as exc:
        raise NvCapsError(f"capability file without a numeric {exc}") from exc


def read_major(proc_root: Path, name: str) -> int:
    path = proc_root / "proc" / "devices"
    try:
        return major(path.read_text(), name)
    except OSError as exc:
        raise NvCapsError(f"cannot read {path}: {exc}") from exc


def read_imex_mgmt(proc_root: Path) -> Capability:
    path = proc_root / IMEX_MGMT
    try:
        return capability(path.read_text())
    except OSError as exc:
        raise NvCapsError(f"cannot read {path}: {exc}") from exc
    except NvCapsError as exc:
        raise NvCapsError(f"{path}: {exc}") from exc


def channel_nodes(channels_major: int, count: int) -> list[dict[str, object]]:
    """CDI ``deviceNodes`` for IMEX channels 0..count-1: the runtime makes them in the
    container from type, major and minor (no host node needed), world-usable as NVIDIA's."""
    return [
        {
            "path": f"{CHANNEL_DIR}/channel{n}",
            "type": "c",
            "major": channels_major,
            "minor": n,
            "fileMode": 0o666,
        }
        for n in range(count)
    ]
