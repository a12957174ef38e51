"""The kubelet's plugin registration service (``pluginregistration.Registration``)."""

import logging
from typing import Any

import grpc

from api.gen import pluginregistration_v1_pb2 as pb
from api.gen import pluginregistration_v1_pb2_grpc as pb_grpc
from driver.common.logs import kv

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """Tells the kubelet where the DRA service is and which versions it speaks."""

    def __init__(self, *, driver_name: str, endpoint: str, versions: tuple[str, ...]) -> None:
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=versions
        )
        # None until the kubelet reports; then True or False.
        self.registered: bool | None = None
        self.error = ""

    async def GetInfo(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegistrationStatusResponse:
        self.registered, self.error = request.plugin_registered, request.error
        fields = kv(driver=self._info.name, endpoint=self._info.endpoint)
        if request.plugin_registered:
            log.info("registered with the kubelet", extra=fields)
        else:
            # The kubelet retries registration by itself; keep serving for that.
            log.error("kubelet rejected registration", extra={**fields, "error": request.error})
        return pb.RegistrationStatusResponse()
