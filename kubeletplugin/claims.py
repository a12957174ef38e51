"""ResourceClaims as the kubelet plugin sees them: fetch, check, and pick our part.

``fetch_claim`` and ``claim_is_gone`` talk to the API server; ``plan_claim`` is a
pure function from the claim object (wire-form dict) to what this node must prepare:
the allocation results whose driver is ours and whose pool is this node's, each with
the opaque config that applies to it.
"""

import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

import aiohttp
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from api.config import ConfigError, GpuConfig, decode_gpu_config, validate_gpu_config
from driver.errors import PermanentError, RetryableError

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


def _claim_not_found(status: int, body: bytes, ref: ClaimRef) -> bool:
    """A 404 about this claim, not one about the API path.

    A cluster that does not serve resource.k8s.io/v1 (or a proxy in the way) also answers
    404; taking that for "every claim is gone" would unprepare the whole node.
    """
    if status != 404:
        return False
    try:
        status_obj = json.loads(body)
    except ValueError:
        return False
    details = status_obj.get("details") if isinstance(status_obj, dict) else None
    return (
        isinstance(details, dict)
        and status_obj.get("reason") == "NotFound"
        and details.get("name") == ref.name
        and details.get("kind") in ("resourceclaims", "ResourceClaim")
    )


class ClaimReader:
    """GET a claim as raw JSON, through the ``ApiClient``'s connection pool, TLS and
    credentials but none of its typed machinery (request building, model decoding:
    more CPU than the rest of a prepare, and we want the wire-form dict anyway).
    What every call shares (the URL prefix, the headers) is built once."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = api_client
        self._configuration = api_client.configuration
        self._host = str(self._configuration.host).rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": str(api_client.user_agent)}
        # The kubernetes package leaves it untyped.
        self._request = cast(Callable[..., Awaitable[Any]], api_client.rest_client.request)

    async def get(self, ref: ClaimRef) -> tuple[int, str, bytes]:
        """(status, reason, body). Raises on no answer."""
        url = self._host + _CLAIM_PATH.format(
            namespace=quote(ref.namespace, safe=""), name=quote(ref.name, safe="")
        )
        headers = self._headers
        # Per call: the in-cluster token is re-read by the client's hook when it rotates.
        token = await self._configuration.get_api_key_with_prefix(
            "BearerToken", alias="authorization"
        )
        if token:
            headers = {**headers, "Authorization": str(token)}
        try:
            response = await self._request(
                "GET", url, headers=headers, _request_timeout=_FETCH_TIMEOUT_S
            )
        except ApiException as exc:  # the client's own retries (Retry-After) gave up
            body = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
            return int(exc.status or 0), str(exc.reason), body
        data: bytes = await response.read()  # read() hands the connection back
        return int(response.status), str(response.reason), data


async def fetch_claim(reader: ClaimReader, ref: ClaimRef) -> dict[str, Any]:
    """The claim in wire form (camelCase dict)."""
    try:
        status, reason, body = await reader.get(ref)
    except (TimeoutError, OSError, aiohttp.ClientError) as exc:
        raise ClaimFetchError(f"retrieve claim {ref}: {exc!r}") from exc
    if status != 200:
        error = ClaimError if _claim_not_found(status, body, ref) else ClaimFetchError
        raise error(f"retrieve claim {ref}: {status} {reason}")
    try:
        claim = json.loads(body)
    except ValueError as exc:
        raise ClaimFetchError(f"retrieve claim {ref}: the answer is not JSON: {exc}") from exc
    if not isinstance(claim, dict):
        raise ClaimFetchError(f"retrieve claim {ref}: the answer is not a JSON object")
    return claim


async def claim_is_gone(reader: ClaimReader, ref: ClaimRef) -> bool | None:
    """True only on proof (404, or the name now holds another UID); None when unknown."""
    try:
        status, _, body = await reader.get(ref)
    except (TimeoutError, OSError, aiohttp.ClientError):
        return None
    if status != 200:
        return True if _claim_not_found(status, body, ref) else None
    try:
        uid = json.loads(body)["metadata"]["uid"]
    except (ValueError, KeyError, TypeError):
        return None
    return bool(uid != ref.uid)


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
