"""The claim names that arrive on the DRA socket, checked before they reach a path or a URL.

The kubelet sends each claim's uid, namespace and name; the uid becomes a file name (the
CDI spec) and the namespace and name the URL of the claim's fetch. Anyone who can reach
the socket can send anything, so nothing is used before it is what Kubernetes itself
would produce: a uid is a canonical UUID (what the API server generates; 36 bytes, so
never too long for a file name), a namespace a DNS label, a claim name a DNS subdomain.
:func:`within` is the second line: a path derived from a name must stay in its root.
"""

from pathlib import Path

from driver.common.errors import PermanentError
from driver.common.limits import is_dns_label, is_dns_subdomain, is_uid


class PathOutsideRootError(PermanentError):
    """A path derived from a name would leave the directory it belongs in."""


def is_claim_uid(uid: str) -> bool:
    return is_uid(uid)


def claim_error(uid: str, namespace: str, name: str) -> str | None:
    """Why a claim reference from the kubelet cannot be a real claim's, or None."""
    if not is_claim_uid(uid):
        return f"invalid claim uid {_shown(uid)}: not a canonical UUID"
    if not is_dns_label(namespace):
        return f"invalid claim namespace {_shown(namespace)}: not a DNS label"
    if not is_dns_subdomain(name):
        return f"invalid claim name {_shown(name)}: not a DNS subdomain"
    return None


def within(root: Path, path: Path) -> Path:
    """``path``, if its directory resolves to ``root`` or under it; else raise.

    The last component is not followed (removing a symlink removes the link), but it
    may not be empty, ``.`` or ``..``.
    """
    if path.name in ("", ".", ".."):
        raise PathOutsideRootError(f"{str(path)!r} is not inside {str(root)!r}")
    if path.parent == root:  # a name right in the root: nothing to resolve (every call's case)
        return path
    if not path.parent.resolve().is_relative_to(root.resolve()):
        raise PathOutsideRootError(f"{str(path)!r} is not inside {str(root)!r}")
    return path


def _shown(value: str) -> str:
    # An attacker's string goes into a gRPC error and a log line: bounded and quoted.
    return repr(value if len(value) <= 80 else value[:77] + "...")
