"""``grpc.health.v1`` on a TCP port, for the DaemonSet's startup and liveness probes.

Named for the probes, not "health": the health of devices is another thing.

For service "" (readiness, startup), SERVING means: the node process finished
its setup (``ready``) and both its sockets answer a real call right now. The
check goes through the sockets, as the kubelet would, so a wedged server or a
deleted socket file shows up. Service "liveness" only says the process still
answers: a plugin that is deliberately not ready (device plugin on the node,
no NVML yet) must not be restarted in a loop by its liveness probe.
"""

import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from api.gen import dra_v1_pb2, dra_v1_pb2_grpc
from api.gen import pluginregistration_v1_pb2 as reg_pb
from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc
from driver.common.logs import kv
from kubeletplugin.sockets import SocketPaths

log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_PROBE_TIMEOUT = 2.0
LIVENESS_SERVICE = "liveness"


async def probe(paths: SocketPaths) -> str:
    """Call both sockets once; return why they fail, or "" when both answer."""
    try:
        async with grpc.aio.insecure_channel(f"unix://{paths.dra}") as channel:
            # No claims: a full round trip through the servicer that touches no state.
            await dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(), timeout=_PROBE_TIMEOUT
            )
        async with grpc.aio.insecure_channel(f"unix://{paths.registration}") as channel:
            await reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb.InfoRequest(), timeout=_PROBE_TIMEOUT
            )
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return ""


class ProbeServer:
    """Answers ``Check``: service "" NOT_SERVING until ``ready``, "liveness" while alive."""

    def __init__(self, paths: SocketPaths, *, port: int) -> None:
        self._paths = paths
        self._port = port
        self._server = grpc.aio.server()
        self.ready = False
        self.reason = "starting"
        self.port = 0

    def set_not_ready(self, reason: str) -> None:
        self.ready, self.reason = False, reason

    def set_ready(self) -> None:
        self.ready, self.reason = True, ""

    async def start(self) -> None:
        # Both address families: the probe comes to the pod IP, whichever it is.
        try:
            self.port = self._server.add_insecure_port(f"[::]:{self._port}")
        except RuntimeError as exc:  # grpc's way of saying the bind failed
            raise OSError(f"cannot listen on health port {self._port}: {exc}") from exc
        health_pb2_grpc.add_HealthServicer_to_server(self, self._server)
        await self._server.start()
        log.info("health service listening", extra=kv(port=self.port))

    async def stop(self) -> None:
        await self._server.stop(0.5)

    async def status(self) -> str:
        """ "" when healthy, else the reason."""
        if not self.ready:
            return f"not ready: {self.reason}"
        failure = await probe(self._paths)
        return f"sockets do not answer: {failure}" if failure else ""

    # grpc_health ships no typing: the servicer is registered by its method names.
    async def Check(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        if request.service == LIVENESS_SERVICE:
            return health_pb2.HealthCheckResponse(status=_SERVING)
        if request.service:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service}")
        reason = await self.status()
        if reason:
            log.debug("health check failing", extra=kv(reason=reason))
        return health_pb2.HealthCheckResponse(status=_NOT_SERVING if reason else _SERVING)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use Check")

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use Check")
