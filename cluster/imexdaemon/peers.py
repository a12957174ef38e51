"""A domain's peers, the names IMEX knows them by, and what changed between two mappings.

Pure: no I/O. A peer is one daemon of the domain as the ComputeDomainClique lists it
(``daemons[]``: ``nodeName``, ``ipAddress``, ``cliqueID``, ``index``); its index names it
``compute-domain-daemon-NNNN``, the names of the static ``nodes.cfg`` (NVIDIA's DNS-names mode).
Only peers of this daemon's clique are mapped: another clique has no NVLink to this one.
"""

import collections
import ipaddress
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from driver.common.errors import PermanentError
from driver.common.logs import kv
from drivers.computedomain import names

log = logging.getLogger(__name__)

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
NAME = re.compile(rf"^{re.escape(names.DAEMON_DNS_PREFIX)}\d{{4}}$")


def has_clique(clique_id: str) -> bool:
    """False on a node whose GPUs report no NVLink clique.

    The node driver gives an empty clique ID there; a zero cluster UUID is taken the same way
    should one ever reach us, since NVML's zero UUID means "no fabric", never a real fabric.
    """
    return bool(clique_id) and not clique_id.startswith(_ZERO_UUID)


@dataclass(frozen=True, slots=True)
class Peer:
    node_name: str
    ip: str
    clique_id: str
    index: int


class PeerSource(Protocol):
    """Where the domain's daemons come from: each item is the whole current list.

    The API source (the domain's ComputeDomainClique, or its status) is one; tests use
    :mod:`cluster.imexdaemon.sources`. An item may repeat the previous list: the daemon
    compares mappings, not lists.
    """

    def updates(self) -> AsyncIterator[tuple[Peer, ...]]: ...


def peers_from_clique(obj: Mapping[str, Any]) -> tuple[Peer, ...]:
    """The peers of a ComputeDomainClique object (its top-level ``daemons``), as the API
    server or a file holds it; raises :class:`PermanentError` for a malformed entry."""
    daemons = obj.get("daemons") or []
    if not isinstance(daemons, list):
        raise PermanentError("daemons: expected a list")
    peers = []
    for at, entry in enumerate(daemons):
        if not isinstance(entry, Mapping):
            raise PermanentError(f"daemons[{at}]: expected an object")
        try:
            index = entry.get("index", -1)
            if not isinstance(index, int) or isinstance(index, bool):
                raise TypeError(f"index {index!r} is not an integer")
            peers.append(
                Peer(
                    node_name=str(entry["nodeName"]),
                    ip=str(entry["ipAddress"]),
                    clique_id=str(entry["cliqueID"]),
                    index=index,
                )
            )
        except (KeyError, TypeError) as exc:
            raise PermanentError(f"daemons[{at}]: {exc}") from exc
    return tuple(peers)


def _address(text: str) -> str | None:
    """``text`` as an IP address in canonical form, or None. It becomes a line of
    ``/etc/hosts``: anything else (a newline, a fake end marker, a scope ID, which may hold
    either) would write host lines of the entry's choosing."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        return None
    return str(address)


def mapping(peers: Iterable[Peer], clique_id: str, max_nodes: int) -> dict[str, str]:
    """IP address to daemon name for this clique's peers.

    A peer whose address is no IP address, or without a usable index (negative, or beyond
    ``max_nodes``: no line of ``nodes.cfg`` names it), is left out, where NVIDIA's daemon ends:
    the rest of the domain keeps working, and the controller's next write may fix it. Two
    addresses claiming one index keep the lower address, so that every daemon of the domain
    picks the same one. What was left out is one warning per call, counted by reason, since a
    clique lists any number of entries.
    """
    by_name: dict[str, str] = {}
    dropped: collections.Counter[str] = collections.Counter()
    examples: dict[str, str] = {}
    for peer in sorted(peers, key=lambda p: (p.index, p.ip)):
        if peer.clique_id != clique_id:
            continue
        ip = _address(peer.ip)
        name = names.daemon_dns_name(peer.index) if 0 <= peer.index < max_nodes else ""
        if ip is None:
            why = "not_an_ip_address"
        elif not name:
            why = "no_usable_index"
        elif name in by_name:
            why = "index_taken"
        else:
            by_name[name] = ip
            continue
        dropped[why] += 1
        examples.setdefault(why, f"{peer.node_name[:63]!r} ip={peer.ip[:64]!r} index={peer.index}")
    if dropped:
        log.warning(
            "peers left out of the mapping",
            extra=kv(**dropped, first=" | ".join(examples.values()), max_nodes=max_nodes),
        )
    result: dict[str, str] = {}
    for (
        name,
        ip,
    ) in by_name.items():  # in index order: one address under two indices keeps the lower
        result.setdefault(ip, name)
    return result


@dataclass(frozen=True, slots=True)
class Change:
    """What differs between two mappings, by name: the lines a reader of the logs wants."""

    added: tuple[tuple[str, str], ...] = ()  # (name, ip)
    removed: tuple[tuple[str, str], ...] = ()
    moved: tuple[tuple[str, str, str], ...] = ()  # (name, old ip, new ip)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.moved)

    def describe(self) -> str:
        parts = [f"+{name}={ip}" for name, ip in self.added]
        parts += [f"-{name}={ip}" for name, ip in self.removed]
        parts += [f"{name}:{old}->{new}" for name, old, new in self.moved]
        return " ".join(parts)


def diff(old: Mapping[str, str], new: Mapping[str, str]) -> Change:
    """``old`` to ``new`` (both IP to name); empty (false) when they map the same."""
    before = {name: ip for ip, name in old.items()}
    after = {name: ip for ip, name in new.items()}
    return Change(
        added=tuple(sorted((n, ip) for n, ip in after.items() if n not in before)),
        removed=tuple(sorted((n, ip) for n, ip in before.items() if n not in after)),
        moved=tuple(
            sorted((n, before[n], ip) for n, ip in after.items() if n in before and before[n] != ip)
        ),
    )
