"""Directories the plugin creates, with modes that do not depend on the process umask.

``mkdir`` applies the umask, so a container started with umask 000 would make the
plugin directory (checkpoint and DRA socket), the registry directory and the CDI root
world-writable: anyone on the node could then replace a socket or a CDI spec.
"""

from pathlib import Path

PRIVATE = 0o750  # the plugin's own state and sockets: root and the kubelet
CDI_ROOT = 0o755  # container runtimes and their hooks read the specs


def ensure_dir(path: Path, mode: int, *, ours: bool = False) -> None:
    """Create ``path`` and its missing parents with exactly ``mode``.

    An existing directory keeps its mode (it may be the kubelet's, or shared), unless
    ``ours``: the directory belongs to this driver alone, so a mode an older release
    left (under a looser umask) is narrowed too.
    """
    missing = []
    at = path
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)  # never wider than mode, even before the chmod
        except FileExistsError:
            continue  # made in between by someone else: theirs, left as it is
        directory.chmod(mode)
    if ours and not missing:
        path.chmod(mode)
