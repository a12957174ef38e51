"""Level 3's own network and mount namespaces: ``python -m tests.e2e.netns CMD ...``.

Level 3 needs what the earlier levels avoid: an API server advertising a non-loopback
address, a pod network on a bridge, and kube-proxy's rules. A test here may send traffic only
to loopback or into network namespaces it makes, never to this machine's own interfaces, and
the chart's mount propagation needs an rshared root, which ``/`` is not on this machine. So
the command runs in a new network namespace (its own loopback, interfaces, routes and
netfilter tables) and a new mount namespace (``/`` made rshared there only); both end with its
last process, so nothing is left on the host, also after a SIGKILL.

The addresses inside: the API server's on an interface of its own, the pods' on the bridge the CNI
plugin makes, the Service range translated by kube-proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Set by this wrapper for the command it runs: the namespaces it left, "<net inode>:<mnt inode>".
MARK = "GPU_DRA_E2E_NETNS"
API_ADDRESS = "10.250.0.1"  # the API server's advertised address, on e2e0
POD_SUBNET = "10.244.0.0/24"
SERVICE_SUBNET = "10.0.0.0/24"  # the control plane's; the kubernetes Service is its .1
KUBERNETES_SERVICE_IP = "10.0.0.1"


def _namespaces() -> str:
    return ":".join(str(Path(f"/proc/self/ns/{ns}").stat().st_ino) for ns in ("net", "mnt"))


def isolated() -> bool:
    """Whether this process runs in network and mount namespaces other than the ones the
    wrapper was started in (PID 1's cannot be read here)."""
    left = os.environ.get(MARK, "").split(":")
    ours = _namespaces().split(":")
    return len(left) == 2 and all(a != b for a, b in zip(left, ours, strict=True))


def _inside(argv: list[str]) -> int:
    for cmd in (
        ["mount", "--make-rshared", "/"],
        ["ip", "link", "set", "lo", "up"],
        # A bridge with no ports holds the address (this kernel has no dummy links).
        ["ip", "link", "add", "e2e0", "type", "bridge"],
        ["ip", "addr", "add", f"{API_ADDRESS}/32", "dev", "e2e0"],
        ["ip", "link", "set", "e2e0", "up"],
        ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
    ):
        subprocess.run(cmd, check=True)
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.e2e.netns CMD [ARG ...]", file=sys.stderr)
        return 2
    if os.environ.get(MARK):
        return _inside(argv)
    if os.geteuid() != 0:
        print("level 3 makes network and mount namespaces: run as root", file=sys.stderr)
        return 2
    env = {**os.environ, MARK: _namespaces()}
    here = [sys.executable, "-m", "tests.e2e.netns", *argv]
    # --propagation private: the copy of the host's mounts must not propagate back to it.
    cmd = ["unshare", "--net", "--mount", "--propagation", "private", "--", *here]
    return subprocess.run(cmd, env=env, cwd=Path.cwd(), check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
