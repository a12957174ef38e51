"""The kubelet's DRA service, v1 and v1beta1, over one implementation.

The servicers only translate between protobuf and the claim state: the
decisions live in :class:`kubeletplugin.state.DeviceState`, which also keeps a
call the kubelet cancels (45 s deadline) running to a whole step. v1beta1 differs
from v1 only by the missing ``Device.share_id`` (field 5), so a v1beta1
message converts to and from v1 through the wire format.
"""

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc

from api.gen import dra_v1_pb2 as v1
from api.gen import dra_v1_pb2_grpc as v1_grpc
from api.gen import dra_v1beta1_pb2 as v1beta1
from api.gen import dra_v1beta1_pb2_grpc as v1beta1_grpc
from api.protoconv import convert
from driver.common.logs import kv
from kubeletplugin import names
from kubeletplugin.metrics import ClaimMetrics
from kubeletplugin.state import ClaimRef, PreparedDevice, PrepareResult

log = logging.getLogger(__name__)

# Registration strings, preferred first: the kubelet takes the first one it knows.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")

_Context = grpc.aio.ServicerContext[Any, Any]


class ClaimPreparer(Protocol):
    """What the servicers need of the claim state (``DeviceState`` provides it)."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...


def _claim_refs(claims: Sequence[v1.Claim]) -> list[ClaimRef]:
    # The kubelet sends each claim once; a repeated UID still gets one answer.
    unique = {c.uid: ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name) for c in claims}
    return list(unique.values())


def _base_names(names: Sequence[str]) -> list[str]:
    # "req/sub" (a firstAvailable subrequest) is reported as its request "req".
    return list(dict.fromkeys(name.split("/", 1)[0] for name in names))


def _device(result: PreparedDevice) -> v1.Device:
    device = v1.Device(
        request_names=_base_names(result.request_names),
        pool_name=result.pool_name,
        device_name=result.device_name,
        cdi_device_ids=list(result.cdi_device_ids),
    )
    if result.share_id is not None:
        device.share_id = result.share_id
    return device


def _log_claim(verb: str, claim: ClaimRef, error: str, **fields: object) -> None:
    # The claim state logs the decisions; this records what went back on the wire.
    if not log.isEnabledFor(logging.DEBUG):  # skip building the record on every call
        return
    extra = kv(claim_uid=claim.uid, claim_namespace=claim.namespace, claim_name=claim.name)
    log.debug(f"{verb} answered", extra={**extra, "error": error, **fields})


class DraService:
    """Prepare and unprepare in v1 terms; every claim of a request gets an entry."""

    def __init__(self, state: ClaimPreparer, metrics: ClaimMetrics | None = None) -> None:
        # Only the calls are counted here; what is prepared, the claim state tells the
        # metrics itself (kubeletplugin.state.ClaimObserver), whichever path changed it.
        self._state = state
        self._metrics = metrics
        # Each family's child per outcome, looked up once: labels() takes a lock and
        # validates its values on every call. Made on first use, as labels() would: a
        # series appears once it has happened.
        self._children: dict[tuple[str, str], Any] = {}

    async def prepare(
        self, request: v1.NodePrepareResourcesRequest
    ) -> v1.NodePrepareResourcesResponse:
        start = time.perf_counter()
        response = await self._prepare(request)
        self._count_prepare(request, response, time.perf_counter() - start)
        return response

    def _count_prepare(
        self,
        request: v1.NodePrepareResourcesRequest,
        response: v1.NodePrepareResourcesResponse,
        seconds: float,
    ) -> None:
        if self._metrics is None:
            return
        failed = False
        # In the request's order (the response is a map, in no set order), each uid once;
        # by uid alone: the claim refs were built and checked already.
        for uid in dict.fromkeys(c.uid for c in request.claims):
            entry = response.claims[uid]
            failed |= bool(entry.error)
            self._child("prepare_total", "error" if entry.error else "success").inc()
        self._child("prepare_seconds", "error" if failed else "success").observe(seconds)

    def _child(self, family: str, outcome: str) -> Any:
        child = self._children.get((family, outcome))
        if child is None:
            labelled = getattr(self._metrics, family).labels(outcome)
            child = self._children[(family, outcome)] = labelled
        return child

    async def _prepare(
        self, request: v1.NodePrepareResourcesRequest
    ) -> v1.NodePrepareResourcesResponse:
        claims = _claim_refs(request.claims)
        response = v1.NodePrepareResourcesResponse()
        if not claims:
            return response
        # A reference no API server could have produced is that claim's error, and is
        # never used as a path or a URL; the other claims of the call go on.
        results: dict[str, PrepareResult] = {}
        valid = []
        for claim in claims:
            invalid = names.claim_error(claim.uid, claim.namespace, claim.name)
            if invalid is None:
                valid.append(claim)
            else:
                log.warning("refusing to prepare an invalid claim", extra=kv(error=invalid))
                results[claim.uid] = PrepareResult(error=invalid)
        try:
            results.update(await self._state.prepare(valid) if valid else {})
        except Exception as exc:  # every claim still needs its own answer
            log.exception("prepare failed for the whole call", extra=kv(claims=len(valid)))
            results.update({c.uid: PrepareResult(error=f"prepare failed: {exc}") for c in valid})
        for claim in claims:
            result = results.get(claim.uid) or PrepareResult(error="internal error: no result")
            entry = response.claims[claim.uid]
            if result.error:
                entry.error = result.error
            else:
                entry.devices.extend(_device(d) for d in result.devices)
            _log_claim("prepare", claim, result.error, devices=len(result.devices))
        return response

    async def unprepare(
        self, request: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        start = time.perf_counter()
        response = await self._unprepare(request)
        if self._metrics is not None:
            failed = False
            for entry in response.claims.values():
                failed |= bool(entry.error)
                self._child("unprepare_total", "error" if entry.error else "success").inc()
            outcome = "error" if failed else "success"
            self._child("unprepare_seconds", outcome).observe(time.perf_counter() - start)
        return response

    async def _unprepare(
        self, request: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        claims = _claim_refs(request.claims)
        response = v1.NodeUnprepareResourcesResponse()
        if not claims:
            return response
        # Unprepare works by uid alone; a uid that is no UUID was never prepared here
        # (prepare refuses it), so there is nothing to do, and it never becomes a path.
        errors: dict[str, str] = {c.uid: "" for c in claims if not names.is_claim_uid(c.uid)}
        valid = [c for c in claims if c.uid not in errors]
        try:
            errors.update(await self._state.unprepare(valid) if valid else {})
        except Exception as exc:
            log.exception("unprepare failed for the whole call", extra=kv(claims=len(valid)))
            errors.update({c.uid: f"unprepare failed: {exc}" for c in valid})
        for claim in claims:
            error = errors.get(claim.uid, "internal error: no result")
            response.claims[claim.uid].error = error
            _log_claim("unprepare", claim, error)
        return response


class V1Servicer(v1_grpc.DRAPluginServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
        return await self._service.prepare(request)

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return await self._service.unprepare(request)


class V1beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: _Context
    ) -> v1beta1.NodePrepareResourcesResponse:
        response = await self._service.prepare(convert(request, v1.NodePrepareResourcesRequest))
        return convert(response, v1beta1.NodePrepareResourcesResponse)

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response = await self._service.unprepare(convert(request, v1.NodeUnprepareResourcesRequest))
        return convert(response, v1beta1.NodeUnprepareResourcesResponse)


def add_to_server(
    server: grpc.aio.Server,
    state: ClaimPreparer,
    metrics: "ClaimMetrics | None" = None,
) -> None:
    service = DraService(state, metrics)
    v1_grpc.add_DRAPluginServicer_to_server(V1Servicer(service), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(V1beta1Servicer(service), server)
