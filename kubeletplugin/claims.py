"""ResourceClaims as the kubelet plugin sees them: fetch, check, and pick our part.

``fetch_claim`` and ``claim_is_gone`` talk to the API server; ``plan_claim`` is a
pure function from the claim object (wire-form dict) to what this node must prepare:
the allocation results whose driver is ours and whose pool is this node's, each with
the opaque config that applies to it.
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes.aio.client import ApiClient

from api.config import ConfigError, GpuConfig, decode_gpu_config, validate_gpu_config
from driver.errors import PermanentError, RetryableError
from driver.kubeapi import ApiError, Client, NotFoundError

_FETCH_TIMEOUT_S = 20.0
_CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimError(PermanentError):
    """This claim cannot be prepared as it stands (not allocated, replaced, bad config, …)."""


class ClaimFetchError(RetryableError):
    """The claim could not be read from the API server; the kubelet's retry may succeed."""


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    request: str  # as in the result: "req" or "req/sub"
    pool_name: str
    device_name: str
    admin_access: bool
    share_id: str | None
    config: GpuConfig

    @property
    def base_request(self) -> str:
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]


def _claim_not_found(exc: ApiError, ref: ClaimRef) -> bool:
    """A 404 about this claim, not one about the API path.

    A cluster that does not serve resource.k8s.io/v1 (or a proxy in the way) also answers
    404; taking that for "every claim is gone" would unprepare the whole node.
    """
    if not isinstance(exc, NotFoundError):
        return False
    status_obj = exc.status_object
    details = status_obj.get("details")
    return (
        isinstance(details, dict)
        and status_obj.get("reason") == "NotFound"
        and details.get("name") == ref.name
        and details.get("kind") in ("resourceclaims", "ResourceClaim")
    )


class ClaimReader:
    """GET a claim as a wire-form dict through the one API client (:mod:`driver.kubeapi`).

    Raw JSON, not the typed models: decoding a ResourceClaim into them costs more CPU
    than the rest of a prepare, and we want the wire-form dict anyway. Made once per
    process; raises :class:`ApiError` (no answer included, as status 0).
    """

    def __init__(self, api_client: ApiClient) -> None:
        self._client = Client(api_client, request_timeout=_FETCH_TIMEOUT_S)

    async def get(self, ref: ClaimRef) -> dict[str, Any]:
        path = _CLAIM_PATH.format(
            namespace=quote(ref.namespace, safe=""), name=quote(ref.name, safe="")
        )
        return await self._client.get_json(path, resource="resourceclaims")


async def fetch_claim(reader: ClaimReader, ref: ClaimRef) -> dict[str, Any]:
    """The claim in wire form (camelCase dict)."""
    try:
        return await reader.get(ref)
    except ApiError as exc:
        error = ClaimError if _claim_not_found(exc, ref) else ClaimFetchError
        message = exc.status_object.get("message") or exc
        detail = f"{exc.status} {message}" if exc.status else exc
        raise error(f"retrieve claim {ref}: {detail}") from exc


async def claim_is_gone(reader: ClaimReader, ref: ClaimRef) -> bool | None:
    """True only on proof (404, or the name now holds another UID); None when unknown."""
    try:
        claim = await reader.get(ref)
    except ApiError as exc:
        return True if _claim_not_found(exc, ref) else None
    uid = (claim.get("metadata") or {}).get("uid")
    return None if uid is None else bool(uid != ref.uid)


@dataclass(frozen=True, slots=True)
class _Config:
    requests: tuple[str, ...]
    source: str
    config: GpuConfig


def _configs(allocation: Mapping[str, Any], driver_name: str) -> list[_Config]:
    """Our driver's opaque configs, class configs first, each decoded (shape checked).

    Every one is decoded, applicable or not: a malformed config is a mistake worth
    reporting even where a later config overrides it.
    """
    entries = allocation.get("devices", {}).get("config") or []
    ordered = sorted(
        enumerate(entries), key=lambda e: 0 if e[1].get("source") == "FromClass" else 1
    )
    out = []
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver_name:
            continue
        requests = tuple(entry.get("requests") or ())
        origin = "class" if entry.get("source") == "FromClass" else "claim"
        scope = f"requests {','.join(requests)}" if requests else "all requests"
        source = f"opaque config #{index} (from {origin}, {scope})"
        config = decode_gpu_config(opaque.get("parameters"), source=source)
        out.append(_Config(requests, source, config))
    return out


@functools.cache
def _default_config() -> GpuConfig:
    # One shared instance: building it runs pydantic validation, on every device otherwise.
    return GpuConfig.default()


def _config_for(request: str, configs: Sequence[_Config]) -> GpuConfig:
    """The last matching config wins; it is validated, the ones it overrides are not."""
    base = request.split("/", 1)[0]
    chosen: _Config | None = None
    for entry in configs:
        if not entry.requests or request in entry.requests or base in entry.requests:
            chosen = entry
    if chosen is None:
        return _default_config()
    return validate_gpu_config(chosen.config, source=chosen.source)


def plan_claim(
    claim: Mapping[str, Any], ref: ClaimRef, *, driver_name: str, pool_name: str
) -> ClaimPlan:
    """Pure: what of this claim this node prepares. Raises ClaimError."""
    uid = claim.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref} got replaced (its UID is {uid}, the kubelet asked for {ref.uid})"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref} not allocated")
    devices = []
    try:
        configs = _configs(allocation, driver_name)
        for result in allocation.get("devices", {}).get("results") or []:
            if result.get("driver") != driver_name or result.get("pool") != pool_name:
                continue
            request = str(result.get("request", ""))
            devices.append(
                PlannedDevice(
                    request=request,
                    pool_name=pool_name,
                    device_name=str(result.get("device", "")),
                    admin_access=result.get("adminAccess") is True,
                    share_id=result.get("shareID"),
                    config=_config_for(request, configs),
                )
            )
    except ConfigError as exc:
        raise ClaimError(f"claim {ref}: {exc}") from exc
    return ClaimPlan(ref=ref, devices=tuple(devices))
