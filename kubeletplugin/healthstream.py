"""The kubelet's DRA health stream (``DRAResourceHealth``, v1alpha1 and v1) over one board.

:class:`HealthBoard` holds the health of every published device; whoever learns
something (the NVML watcher) replaces it there, on the event loop. Each open
stream sends the complete list at once, again on every change, and again every
``resend_period`` seconds while nothing changes: the kubelet turns a device it has
not heard of within 30 s (its ``DefaultHealthTimeout``) into Unknown, so a quiet
healthy node must keep saying so.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from api.gen import dra_health_v1_pb2 as v1
from api.gen import dra_health_v1_pb2_grpc as v1_grpc
from api.gen import dra_health_v1alpha1_pb2 as v1alpha1
from api.gen import dra_health_v1alpha1_pb2_grpc as v1alpha1_grpc
from api.protoconv import convert
from driver.common.logs import kv

log = logging.getLogger(__name__)

# Registration strings, as upstream's kubeletplugin helper lists them: a kubelet that
# knows both takes v1; a 1.36 kubelet knows only v1alpha1.
SERVICE_NAMES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
# Well inside the kubelet's 30 s: one lost message still leaves a margin.
RESEND_PERIOD = 10.0
MAX_MESSAGE = 1024

Health = Literal["Healthy", "Unhealthy", "Unknown"]
_WIRE = {"Unknown": v1.UNKNOWN, "Healthy": v1.HEALTHY, "Unhealthy": v1.UNHEALTHY}
_Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: Health
    message: str = ""


class HealthBoard:
    """The complete, current health of the driver's devices; event-loop only."""

    def __init__(self, devices: Iterable[DeviceHealth] = ()) -> None:
        self._devices = tuple(devices)
        self._version = 0
        self._changed = asyncio.Event()

    def replace(self, devices: Iterable[DeviceHealth]) -> bool:
        """Make ``devices`` the complete list; True (and streams wake) when it differs."""
        new = tuple(devices)
        if new == self._devices:
            return False
        self._devices = new
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def snapshot(self) -> tuple[int, tuple[DeviceHealth, ...]]:
        return self._version, self._devices

    async def wait_change(self, version: int, within: float) -> None:
        """Return when the board moved past ``version``, or after ``within`` seconds."""
        if self._version != version:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), within)


def response(devices: Sequence[DeviceHealth], now: float) -> v1.NodeWatchResourcesResponse:
    """The v1 message for ``devices``, each stamped ``now`` (the plugin re-determined it)."""
    out = v1.NodeWatchResourcesResponse()
    for d in devices:
        message = d.message if len(d.message) <= MAX_MESSAGE else d.message[:1021] + "..."
        out.devices.append(
            v1.DeviceHealth(
                device=v1.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=_WIRE[d.health],
                last_updated_time=int(now),
                message=message,
            )
        )
    return out


class HealthStream:
    """What every open stream sends, in v1 terms."""

    def __init__(self, board: HealthBoard, *, resend_period: float = RESEND_PERIOD) -> None:
        self._board = board
        self._resend = resend_period

    async def responses(self) -> AsyncIterator[v1.NodeWatchResourcesResponse]:
        log.info("kubelet opened the health stream")
        try:
            while True:
                version, devices = self._board.snapshot()
                yield response(devices, time.time())
                await self._board.wait_change(version, self._resend)
        finally:
            log.info("health stream closed", extra=kv(devices=len(self._board.snapshot()[1])))


class V1HealthServicer(v1_grpc.DRAResourceHealthServicer):
    def __init__(self, stream: HealthStream) -> None:
        self._stream = stream

    async def NodeWatchResources(
        self, request: v1.NodeWatchResourcesRequest, context: _Context
    ) -> AsyncIterator[v1.NodeWatchResourcesResponse]:
        async for message in self._stream.responses():
            yield message


class V1alpha1HealthServicer(v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, stream: HealthStream) -> None:
        self._stream = stream

    async def NodeWatchResources(
        self, request: v1alpha1.NodeWatchResourcesRequest, context: _Context
    ) -> AsyncIterator[v1alpha1.NodeWatchResourcesResponse]:
        # The messages are identical: v1's bytes are a v1alpha1 message.
        async for message in self._stream.responses():
            yield convert(message, v1alpha1.NodeWatchResourcesResponse)


def add_to_server(server: grpc.aio.Server, board: HealthBoard, **kwargs: float) -> None:
    stream = HealthStream(board, **kwargs)
    v1_grpc.add_DRAResourceHealthServicer_to_server(V1HealthServicer(stream), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(V1alpha1HealthServicer(stream), server)
