"""ResourceClaims as the kubelet plugin sees them: fetch, check, and pick our part.

``fetch_claim`` and ``claim_is_gone`` talk to the API server; ``plan_claim`` is a
pure function from the claim object (wire-form dict) to what this node must prepare:
the allocation results whose driver is ours and whose pool is this node's, each with
the opaque config that applies to it; ``share_problem`` (pure) checks a result's share of
a device (consumable capacity) against what the device publishes.
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.config import AppliedConfig, ConfigError, applies, choose, misaddressed
from driver.common.errors import PermanentError, RetryableError
from driver.common.limits import is_uid
from driver.common.quantity import Quantity
from driver.kube.resources import RESOURCE_CLAIMS
from driver.kube.rest import ApiError, Client, NotFoundError
from driver.kube.session import Session
from kubeletplugin.flavor import ConfigRules

_FETCH_TIMEOUT_S = 20.0


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
    config: Any  # the driver's config model (ConfigRules): GpuConfig for the GPU driver
    consumed: tuple[tuple[str, str], ...] = ()  # the result's consumedCapacity

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
    """GET a claim as a wire-form dict through the one API client (:mod:`driver.kube.rest`).

    Raw JSON, not the typed models: decoding a ResourceClaim into them costs more CPU
    than the rest of a prepare, and we want the wire-form dict anyway. Made once per
    process; raises :class:`ApiError` (no answer included, as status 0).
    """

    def __init__(self, api_client: Session) -> None:
        self._client = Client(api_client, request_timeout=_FETCH_TIMEOUT_S)

    async def get(self, ref: ClaimRef) -> dict[str, Any]:
        return await self._client.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)


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


def _configs(
    allocation: Mapping[str, Any],
    driver_name: str,
    our_requests: Sequence[str],
    rules: ConfigRules,
) -> list[AppliedConfig]:
    """Our driver's opaque configs, class configs first, each decoded (shape checked).

    Every one is decoded, applicable or not: a malformed config is a mistake worth
    reporting even where a later config overrides it. A GpuConfig addressed to another
    driver but applying to devices of ours is refused: it is a typo of the driver
    name, and ignoring it would hand out an unshared GPU where sharing was asked for.
    """
    entries = allocation.get("devices", {}).get("config") or []
    ordered = sorted(
        enumerate(entries), key=lambda e: 0 if e[1].get("source") == "FromClass" else 1
    )
    out = []
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        requests = tuple(entry.get("requests") or ())
        origin = "class" if entry.get("source") == "FromClass" else "claim"
        scope = f"requests {','.join(requests)}" if requests else "all requests"
        source = f"opaque config #{index} (from {origin}, {scope})"
        if opaque.get("driver") != driver_name:
            why = misaddressed(
                opaque.get("parameters"), opaque.get("driver"), driver_name, rules.kinds
            )
            if why is not None and any(applies(requests, r) for r in our_requests):
                raise ConfigError(f"{source}: {why}")
            continue
        config = rules.decode(opaque.get("parameters"), source)
        out.append(AppliedConfig(requests, source, config, origin))
    return out


@functools.cache
def _default_config(rules: ConfigRules) -> Any:
    # One shared instance: building it runs pydantic validation, on every device otherwise.
    return rules.default()


def _config_for(request: str, configs: Sequence[AppliedConfig], rules: ConfigRules) -> Any:
    """The config that applies (api.config.choose: the last matching one, conflicts refused),
    validated; the ones it overrides are not."""
    chosen = choose(request, configs)
    if chosen is None:
        return rules.validate(_default_config(rules), f"the default config of request {request}")
    return rules.validate(chosen.config, chosen.source)


def plan_claim(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    *,
    driver_name: str,
    pool_name: str,
    rules: ConfigRules,
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
        results = allocation.get("devices", {}).get("results") or []
        ours = [str(r.get("request", "")) for r in results if r.get("driver") == driver_name]
        configs = _configs(allocation, driver_name, ours, rules)
        for result in results:
            if result.get("driver") != driver_name or result.get("pool") != pool_name:
                continue
            request = str(result.get("request", ""))
            share_id = result.get("shareID")
            device_name = str(result.get("device", ""))
            if share_id is not None and not is_uid(share_id):
                raise ClaimError(
                    f'claim {ref}: field "shareID" of the result for device {device_name}: '
                    f"{share_id!r} is not a UUID"
                )
            consumed = result.get("consumedCapacity") or {}
            if not isinstance(consumed, Mapping):
                raise ClaimError(
                    f'claim {ref}: field "consumedCapacity" of the result for device '
                    f"{device_name} is not a map"
                )
            devices.append(
                PlannedDevice(
                    request=request,
                    pool_name=pool_name,
                    device_name=device_name,
                    admin_access=result.get("adminAccess") is True,
                    share_id=None if share_id is None else str(share_id),
                    config=_config_for(request, configs, rules),
                    consumed=tuple(sorted((str(k), str(v)) for k, v in consumed.items())),
                )
            )
    except ConfigError as exc:
        raise ClaimError(f"claim {ref}: {exc}") from exc
    return ClaimPlan(ref=ref, devices=tuple(devices))


def share_problem(published: Mapping[str, Any], consumed: Mapping[str, str]) -> str | None:
    """Why a share with ``consumed`` (its allocation result's ``consumedCapacity``) is not
    one this device, as published, hands out; None when it is. The scheduler only writes
    shares that fit; this catches an allocation written by hand, or by a scheduler that
    saw another policy than this plugin publishes."""
    if not published.get("allowMultipleAllocations"):
        return (
            'field "shareID": the device is not published for sharing '
            "(the plugin runs without --consumable-capacity)"
        )
    capacity: Mapping[str, Any] = published.get("capacity") or {}
    for name, text in consumed.items():
        field = f'field "consumedCapacity.{name}"'
        if name not in capacity:
            return f"{field}: the device has no capacity {name}"
        try:
            amount = Quantity.parse(text).value
        except ValueError as exc:
            return f"{field}: {exc}"
        policy = capacity[name].get("requestPolicy") or {}
        valid_range = policy.get("validRange")
        if valid_range is not None:
            low = Quantity.parse(str(valid_range["min"])).value
            high = valid_range.get("max")
            step = valid_range.get("step")
            if amount < low or (high is not None and amount > Quantity.parse(str(high)).value):
                return f"{field}: {text} is outside the device's valid range"
            if step is not None and (amount - low) % Quantity.parse(str(step)).value:
                low_text = valid_range["min"]
                return f"{field}: {text} is not on the device's step of {step} from {low_text}"
        values = policy.get("validValues")
        if values and amount not in {Quantity.parse(str(v)).value for v in values}:
            return f"{field}: {text} is not one of the device's valid values"
    return None
