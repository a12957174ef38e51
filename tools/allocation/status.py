"""The ``status.allocation`` a scheduler writes for a found solution (pure).

Mirrors the end of the stable allocator's ``Allocate``: results in allocation
order (with ``adminAccess`` and the request's ``tolerations``), class configs
once per class (FromClass) then claim configs (FromClaim), a config covering as
many requests as the claim has loses its ``requests`` ("empty means all"), and
a node selector: ``metadata.name`` for node-local devices, otherwise the merged
single-term selectors of the devices' slices.
"""

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from driver.common.quantity import Quantity
from tools.allocation.claims import ParsedClaim, Request


class Placement(Protocol):
    """Where an allocated device is: a :class:`~tools.allocation.pools.Device`, or
    its names alone where a node gets the solution of a node of its shape."""

    @property
    def driver(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def node_name(self) -> str | None: ...
    @property
    def node_selector(self) -> Mapping[str, Any] | None: ...


def allocation_json(
    claim: ParsedClaim,
    results: Sequence[tuple[Request, Placement]],
    chosen: Mapping[str, Request],
    *,
    shares: Sequence[Mapping[str, Quantity] | None] = (),
    seed: str = "",
) -> dict[str, Any]:
    entries = [_result(r, d) for r, d in results]
    for position, (entry, share) in enumerate(zip(entries, shares, strict=False)):
        if share is not None:
            entry["shareID"] = share_id(seed, position, entry)
            entry["consumedCapacity"] = {k: str(v) for k, v in sorted(share.items())}
    devices: dict[str, Any] = {"results": entries}
    config = _config(claim, chosen)
    if config:
        devices["config"] = config
    out: dict[str, Any] = {"devices": devices}
    selector = _node_selector([d for _, d in results])
    if selector is not None:
        out["nodeSelector"] = selector
    return out


# Share IDs are the scheduler's random UUIDs; explain derives them from the claim and the
# result instead, so one explanation always writes the same allocation.
_SHARE_NAMESPACE = uuid.UUID("5f1c3e1a-8d4b-4c52-9a57-3b0f6c2de871")


def share_id(seed: str, position: int, entry: Mapping[str, Any]) -> str:
    key = (
        f"{seed}|{position}|{entry['request']}|{entry['driver']}|{entry['pool']}|{entry['device']}"
    )
    return str(uuid.uuid5(_SHARE_NAMESPACE, key))


def _result(request: Request, device: Placement) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "request": request.name,
        "driver": device.driver,
        "pool": device.pool,
        "device": device.name,
    }
    if request.admin:
        entry["adminAccess"] = True
    if request.tolerations:
        entry["tolerations"] = [dict(t) for t in request.tolerations]
    return entry


def _configuration(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k != "requests"}


def _config(claim: ParsedClaim, chosen: Mapping[str, Request]) -> list[dict[str, Any]]:
    config: list[dict[str, Any]] = []
    by_class: dict[str, tuple[int, int]] = {}
    for group in claim.groups:
        request = chosen[group.name]
        span = by_class.get(request.class_name)
        if span is not None:
            for entry in config[span[0] : span[1]]:
                entry["requests"].append(request.name)
            continue
        start = len(config)
        config.extend(
            {"source": "FromClass", "requests": [request.name], **_configuration(raw)}
            for raw in (request.device_class.get("spec") or {}).get("config") or ()
        )
        by_class[request.class_name] = (start, len(config))
    for raw in claim.config:
        names = list(raw.get("requests") or ())
        if not names:
            config.append({"source": "FromClaim", **_configuration(raw)})
            continue
        # Upstream appends once per request the config names (so a config naming two
        # requests appears twice); kept identical so the demo writes what a scheduler would.
        for group in claim.groups:
            request = chosen[group.name]
            if group.name in names or (request.sub is not None and request.name in names):
                config.append({"source": "FromClaim", "requests": names, **_configuration(raw)})
    for entry in config:
        if len(entry.get("requests", ())) == len(claim.groups):
            del entry["requests"]
    return config


def _node_selector(devices: Sequence[Placement]) -> dict[str, Any] | None:
    fields: list[Mapping[str, Any]] = []
    expressions: list[Mapping[str, Any]] = []
    for device in devices:
        if device.node_name is not None:
            # One node-local device pins the whole claim to that node.
            return {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [device.node_name]}
                        ]
                    }
                ]
            }
        terms: Sequence[Mapping[str, Any]] = (device.node_selector or {}).get(
            "nodeSelectorTerms"
        ) or ()
        if len(terms) == 1:
            _merge(terms[0].get("matchFields") or (), fields)
            _merge(terms[0].get("matchExpressions") or (), expressions)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = [dict(r) for r in expressions]
    if fields:
        term["matchFields"] = [dict(r) for r in fields]
    return {"nodeSelectorTerms": [term]}


def _merge(new: Sequence[Mapping[str, Any]], into: list[Mapping[str, Any]]) -> None:
    for requirement in new:
        values = set(requirement.get("values") or ())
        if not any(
            r.get("key") == requirement.get("key")
            and r.get("operator") == requirement.get("operator")
            and set(r.get("values") or ()) == values
            for r in into
        ):
            into.append(requirement)
