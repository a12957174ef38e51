"""A kubelet simulator: the kubelet's side of registration and of the DRA calls.

It talks to the plugin only through the generated stubs and its unix sockets,
the way the kubelet does: GetInfo on the registration socket, pick the first
of the plugin's versions the kubelet knows, NotifyRegistrationStatus, then
prepare and unprepare over the endpoint GetInfo named, with a 45 s deadline.
:class:`HealthWatch` is the kubelet's health client: one stream per plugin,
re-dialled every 5 s, and a device not heard of within its timeout is Unknown.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from api.gen import dra_health_v1_pb2 as health_v1
from api.gen import dra_health_v1_pb2_grpc as health_v1_grpc
from api.gen import dra_health_v1alpha1_pb2 as health_v1alpha1
from api.gen import dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from api.gen import dra_v1_pb2 as v1
from api.gen import dra_v1_pb2_grpc as v1_grpc
from api.gen import dra_v1beta1_pb2 as v1beta1
from api.gen import dra_v1beta1_pb2_grpc as v1beta1_grpc
from api.gen import pluginregistration_v1_pb2 as reg_pb
from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc
from api.protoconv import convert
from driver.common.errors import PermanentError

# What the kubelet of Kubernetes 1.34+ speaks, in no particular order: the
# plugin's list decides the preference.
KUBELET_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DEFAULT_TIMEOUT = 45.0
# The health services the kubelet consumes, preferred first (it takes v1 over v1alpha1,
# whatever the plugin's order), its DefaultHealthTimeout and its re-dial period.
KUBELET_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH_TIMEOUT = 30.0
HEALTH_REDIAL = 5.0
_HEALTH_NAMES = {health_v1.UNKNOWN: "Unknown", health_v1.HEALTHY: "Healthy"}

# Every dial its own connection, as the kubelet's Go client makes one per plugin: gRPC
# Python shares subchannels process-wide, so a new channel to a restarted plugin's socket
# would otherwise inherit the backoff of the dead instance's connection and fail at once.
_OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)

log = logging.getLogger(__name__)


class ClaimLike(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Registration:
    info: reg_pb.PluginInfo
    version: str  # the chosen entry of info.supported_versions


def choose_version(offered: Sequence[str], known: Sequence[str] = KUBELET_VERSIONS) -> str:
    """The kubelet walks the plugin's list in the plugin's order and takes the first it knows."""
    for version in offered:
        if version in known:
            return version
    raise PermanentError(f"no supported DRA version among {list(offered)} (kubelet knows {known})")


def choose_health_service(
    offered: Sequence[str], known: Sequence[str] = KUBELET_HEALTH_SERVICES
) -> str | None:
    """The health service the kubelet streams from, or None when the plugin offers none."""
    return next((service for service in known if service in offered), None)


def _claims(claims: Sequence[ClaimLike]) -> list[v1.Claim]:
    return [v1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


class KubeletSim:
    """One registered plugin, as the kubelet holds it. Use :meth:`register`."""

    def __init__(self, registration: Registration, channel: grpc.aio.Channel, timeout: float):
        self.registration = registration
        self._channel = channel
        self._timeout = timeout
        self._v1 = v1_grpc.DRAPluginStub(channel)
        self._v1beta1 = v1beta1_grpc.DRAPluginStub(channel)

    @classmethod
    async def register(
        cls,
        registration_socket: Path,
        *,
        known_versions: Sequence[str] = KUBELET_VERSIONS,
        accept: bool = True,
        reject_reason: str = "",
        rpc_timeout: float = DEFAULT_TIMEOUT,
    ) -> "KubeletSim":
        """Register the plugin behind ``registration_socket``; ``accept=False`` rejects it.

        A rejected plugin is told so (``reject_reason``) and :class:`PermanentError` is raised.
        ``known_versions`` narrows what this kubelet speaks, e.g. to an older kubelet's;
        ``rpc_timeout`` is the deadline of every call (the kubelet's is 45 s).
        """
        async with grpc.aio.insecure_channel(
            f"unix://{registration_socket}", options=_OWN_CONNECTION
        ) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=rpc_timeout)
            problem = reject_reason if not accept else _check_info(info)
            version = ""
            if not problem:
                try:
                    version = choose_version(info.supported_versions, known_versions)
                except PermanentError as exc:
                    problem = str(exc)
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=not problem, error=problem),
                timeout=rpc_timeout,
            )
        if problem:
            raise PermanentError(f"registration of {info.name!r} failed: {problem}")
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}", options=_OWN_CONNECTION)
        return cls(Registration(info=info, version=version), channel, rpc_timeout)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> "KubeletSim":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def watch_health(self, *, timeout: float = HEALTH_TIMEOUT) -> "HealthWatch":
        """The health client for this plugin; :class:`PermanentError` if it serves none."""
        service = choose_health_service(self.registration.info.supported_versions)
        if service is None:
            raise PermanentError(f"{self.registration.info.name!r} advertises no health service")
        return HealthWatch(self.registration.info.endpoint, service, timeout=timeout)

    async def prepare(self, claims: Sequence[ClaimLike]) -> v1.NodePrepareResourcesResponse:
        """NodePrepareResources over the negotiated version; the answer in v1 form."""
        request = v1.NodePrepareResourcesRequest(claims=_claims(claims))
        if self.registration.version == "v1.DRAPlugin":
            return await self._v1.NodePrepareResources(request, timeout=self._timeout)
        beta = await self._v1beta1.NodePrepareResources(
            convert(request, v1beta1.NodePrepareResourcesRequest), timeout=self._timeout
        )
        return convert(beta, v1.NodePrepareResourcesResponse)

    async def unprepare(self, claims: Sequence[ClaimLike]) -> v1.NodeUnprepareResourcesResponse:
        """NodeUnprepareResources over the negotiated version; the answer in v1 form."""
        request = v1.NodeUnprepareResourcesRequest(claims=_claims(claims))
        if self.registration.version == "v1.DRAPlugin":
            return await self._v1.NodeUnprepareResources(request, timeout=self._timeout)
        beta = await self._v1beta1.NodeUnprepareResources(
            convert(request, v1beta1.NodeUnprepareResourcesRequest), timeout=self._timeout
        )
        return convert(beta, v1.NodeUnprepareResourcesResponse)


def _check_info(info: reg_pb.PluginInfo) -> str:
    # The kubelet's own validation of a DRA plugin's info.
    if info.type != "DRAPlugin":
        return f"unexpected plugin type {info.type!r}"
    if not info.name:
        return "empty plugin name"
    if not Path(info.endpoint).is_absolute():
        return f"endpoint {info.endpoint!r} is not an absolute path"
    return ""


class HealthWatch:
    """The kubelet's view of one plugin's device health, kept by :meth:`run`."""

    def __init__(
        self,
        endpoint: str,
        service: str,
        *,
        timeout: float = HEALTH_TIMEOUT,
        redial: float = HEALTH_REDIAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self._endpoint = endpoint
        self._timeout = timeout
        self._redial = redial
        self._clock = clock
        # (pool, device) -> (health, the plugin's last_updated_time).
        self._seen: dict[tuple[str, str], tuple[str, float]] = {}
        self.messages = 0
        self.dials = 0

    async def run(self) -> None:
        """Stream until cancelled; a failed or ended stream is re-dialled after ``redial``."""
        while True:
            self.dials += 1
            try:
                async with grpc.aio.insecure_channel(
                    f"unix://{self._endpoint}", options=_OWN_CONNECTION
                ) as channel:
                    async for message in self._stream(channel):
                        self._record(message)
            except grpc.aio.AioRpcError as exc:
                log.info("health stream failed", extra={"error": exc.code().name})
            await asyncio.sleep(self._redial)

    async def _stream(
        self, channel: grpc.aio.Channel
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        if self.service == "v1.DRAResourceHealth":
            stub = health_v1_grpc.DRAResourceHealthStub(channel)
            async for message in stub.NodeWatchResources(health_v1.NodeWatchResourcesRequest()):
                yield message
            return
        alpha = health_v1alpha1_grpc.DRAResourceHealthStub(channel)
        async for old in alpha.NodeWatchResources(health_v1alpha1.NodeWatchResourcesRequest()):
            yield convert(old, health_v1.NodeWatchResourcesResponse)

    def _record(self, message: health_v1.NodeWatchResourcesResponse) -> None:
        self.messages += 1
        for d in message.devices:
            name = _HEALTH_NAMES.get(d.health, "Unhealthy")
            self._seen[(d.device.pool_name, d.device.device_name)] = (name, d.last_updated_time)

    def view(self) -> Mapping[tuple[str, str], str]:
        """Each device's health; Unknown once its last update is older than the timeout."""
        now = self._clock()
        return {
            key: health if now - updated <= self._timeout else "Unknown"
            for key, (health, updated) in self._seen.items()
        }

    async def wait_for(
        self, predicate: Callable[[Mapping[tuple[str, str], str]], bool], within: float = 10.0
    ) -> Mapping[tuple[str, str], str]:
        """The view once ``predicate`` holds; TimeoutError with the last view otherwise."""
        deadline = time.monotonic() + within
        while not predicate(view := self.view()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"health view never matched: {dict(view)}")
            await asyncio.sleep(0.02)
        return view


@contextlib.asynccontextmanager
async def watching(watch: HealthWatch) -> AsyncIterator[HealthWatch]:
    """Run ``watch`` in a task for the block's duration."""
    task = asyncio.create_task(watch.run(), name="kubelet-health-watch")
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
