"""The gRPC shell over real unix sockets: registration, both DRA versions, health, socket rules.

The claim state behind the DRA service is a small in-test preparer here, so
these tests pin the wire behaviour alone (answers per claim, request names,
v1beta1 conversion); tests/test_grpc_state.py runs the real
``DeviceState`` against the local API server.
"""

import contextlib
import logging
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc
from driver.common.errors import PermanentError
from kubeletplugin import draservice
from kubeletplugin.probes import ProbeServer
from kubeletplugin.registration import RegistrationServicer
from kubeletplugin.sockets import (
    MAX_SOCKET_PATH,
    SocketPaths,
    SocketServer,
    check_length,
    socket_paths,
)
from kubeletplugin.state import ClaimRef, PreparedDevice, PrepareResult
from sandbox.kubeletsim import KubeletSim, choose_version

DRIVER = "gpu.nvidia.com"
# Claim uids as the API server makes them (the DRA service refuses any other).
A, B, C, X = (f"{n}0000000-0000-4000-8000-000000000000" for n in "abcd")


@dataclass
class _Preparer:
    """Answers from a table; records calls. Stands in for DeviceState at its interface."""

    results: dict[str, PrepareResult] = field(default_factory=dict)
    unprepare_errors: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.calls.append(("prepare", tuple(c.uid for c in claims)))
        return {c.uid: self.results[c.uid] for c in claims if c.uid in self.results}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.calls.append(("unprepare", tuple(c.uid for c in claims)))
        return {c.uid: self.unprepare_errors.get(c.uid, "") for c in claims}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Socket paths must stay within MAX_SOCKET_PATH: pytest's tmp_path may be longer.
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra") as name:
        yield Path(name)


@dataclass
class _Plugin:
    paths: SocketPaths
    preparer: _Preparer
    registration: RegistrationServicer
    servers: list[SocketServer]


@contextlib.asynccontextmanager
async def _serve(root: Path, pod_uid: str | None = None) -> AsyncIterator[_Plugin]:
    paths = socket_paths(
        registrar_dir=root / "registry",
        plugins_dir=root / "plugins",
        driver_name=DRIVER,
        pod_uid=pod_uid,
    )
    preparer = _Preparer()
    dra = grpc.aio.server()
    draservice.add_to_server(dra, preparer)
    reg = grpc.aio.server()
    registration = RegistrationServicer(
        driver_name=DRIVER, endpoint=str(paths.dra), versions=draservice.SUPPORTED_VERSIONS
    )
    reg_grpc.add_RegistrationServicer_to_server(registration, reg)
    servers = [SocketServer(paths.dra, dra), SocketServer(paths.registration, reg)]
    for server in servers:
        await server.start()
    try:
        yield _Plugin(paths, preparer, registration, servers)
    finally:
        for server in reversed(servers):
            await server.stop(0)


def _claim(uid: str) -> ClaimRef:
    return ClaimRef(uid=uid, namespace="ns", name=f"claim-{uid}")


def _device(name: str, *requests: str, share_id: str | None = None) -> PreparedDevice:
    return PreparedDevice(
        request_names=requests,
        pool_name="node-a",
        device_name=name,
        cdi_device_ids=(f"k8s.gpu.nvidia.com/claim=uid-{name}",),
        share_id=share_id,
        kind="gpu",
    )


async def test_registration_as_the_kubelet_does(short_dir: Path) -> None:
    async with _serve(short_dir) as plugin:
        assert plugin.paths.registration == short_dir / "registry" / f"{DRIVER}-reg.sock"
        assert plugin.paths.dra == short_dir / "plugins" / DRIVER / "dra.sock"
        async with await KubeletSim.register(plugin.paths.registration) as kubelet:
            info = kubelet.registration.info
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRIVER,
                str(plugin.paths.dra),
            )
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            assert kubelet.registration.version == "v1.DRAPlugin"
        assert plugin.registration.registered is True


@pytest.mark.parametrize("known", [("v1.DRAPlugin", "v1beta1.DRAPlugin"), ("v1beta1.DRAPlugin",)])
async def test_prepare_and_unprepare_over_each_version(
    short_dir: Path, known: tuple[str, ...]
) -> None:
    async with _serve(short_dir) as plugin:
        plugin.preparer.results = {
            A: PrepareResult(
                devices=(
                    _device("gpu-0", "gpus/h100", "gpus"),
                    _device("gpu-1", "x", share_id="s1"),
                )
            ),
            B: PrepareResult(error="claim ns/claim-b not allocated"),
        }
        async with await KubeletSim.register(
            plugin.paths.registration, known_versions=known
        ) as kubelet:
            assert kubelet.registration.version == known[0]
            # C gets no result from the state: it must still get an entry, with an error.
            response = await kubelet.prepare([_claim(A), _claim(B), _claim(C), _claim(A)])
            assert set(response.claims) == {A, B, C}
            a = response.claims[A]
            assert a.error == ""
            assert [list(d.request_names) for d in a.devices] == [["gpus"], ["x"]]
            assert [d.device_name for d in a.devices] == ["gpu-0", "gpu-1"]
            assert a.devices[0].cdi_device_ids == ["k8s.gpu.nvidia.com/claim=uid-gpu-0"]
            assert not a.devices[0].HasField("share_id")
            # share_id exists on the v1 wire only.
            assert a.devices[1].HasField("share_id") == (known[0] == "v1.DRAPlugin")
            assert response.claims[B].error == "claim ns/claim-b not allocated"
            assert not response.claims[B].devices
            assert "no result" in response.claims[C].error
            assert plugin.preparer.calls[0] == ("prepare", (A, B, C))

            plugin.preparer.unprepare_errors = {B: "disk full"}
            out = await kubelet.unprepare([_claim(A), _claim(B)])
            assert {uid: r.error for uid, r in out.claims.items()} == {A: "", B: "disk full"}


async def test_rejected_registration_keeps_serving(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _serve(short_dir) as plugin:
        with caplog.at_level(logging.ERROR), pytest.raises(PermanentError, match="duplicate"):
            await KubeletSim.register(
                plugin.paths.registration, accept=False, reject_reason="duplicate endpoint"
            )
        assert plugin.registration.registered is False
        assert any(getattr(r, "error", "") == "duplicate endpoint" for r in caplog.records)
        # The kubelet retries later, and the plugin is still there to answer.
        async with await KubeletSim.register(plugin.paths.registration) as kubelet:
            assert (await kubelet.unprepare([_claim(X)])).claims[X].error == ""
        assert plugin.registration.registered is True


def test_version_choice_follows_the_plugins_order() -> None:
    assert choose_version(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert choose_version(["v9.DRAPlugin", "v1.DRAPlugin"]) == "v1.DRAPlugin"
    with pytest.raises(PermanentError, match="no supported DRA version"):
        choose_version(["v1alpha4.DRAPlugin"])


async def test_socket_files_not_world_writable_and_removed_at_stop(short_dir: Path) -> None:
    async with _serve(short_dir) as plugin:
        for path in (plugin.paths.dra, plugin.paths.registration):
            mode = path.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) & 0o007 == 0, oct(mode)
    assert not plugin.paths.dra.exists()
    assert not plugin.paths.registration.exists()


async def test_stale_own_socket_replaced_other_files_left_alone(short_dir: Path) -> None:
    # A killed instance of the same pod leaves its sockets behind, bound to no one.
    paths = socket_paths(
        registrar_dir=short_dir / "registry",
        plugins_dir=short_dir / "plugins",
        driver_name=DRIVER,
        pod_uid="old",
    )
    for path in (paths.dra, paths.registration):
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as dead:
            dead.bind(str(path))
        assert path.is_socket()
    async with (
        _serve(short_dir, pod_uid="old") as again,
        await KubeletSim.register(again.paths.registration) as kubelet,
    ):
        assert (await kubelet.unprepare([_claim(X)])).claims[X].error == ""
    not_a_socket = short_dir / "plugins" / DRIVER / "dra-file.sock"
    not_a_socket.write_text("keep me")
    server = SocketServer(not_a_socket, grpc.aio.server())
    with pytest.raises(PermanentError, match="not a socket"):
        await server.start()
    assert not_a_socket.read_text() == "keep me"


def test_socket_path_length_is_checked() -> None:
    deep = Path("/tmp/" + "d" * 80)
    with pytest.raises(PermanentError, match=f"over the {MAX_SOCKET_PATH}-byte limit"):
        socket_paths(registrar_dir=deep, plugins_dir=deep, driver_name=DRIVER, pod_uid="u" * 36)
    fits = socket_paths(
        registrar_dir=Path("/r"), plugins_dir=Path("/p"), driver_name=DRIVER, pod_uid=None
    )
    assert len(str(fits.registration)) < MAX_SOCKET_PATH


async def test_the_longest_path_the_check_allows_is_one_grpc_binds() -> None:
    """The limit is gRPC's, measured, not the kernel's: one byte more and it cannot bind."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra") as name:
        longest = Path(name) / ("s" * (MAX_SOCKET_PATH - len(name) - 1))
        check_length(longest)
        server = SocketServer(longest, grpc.aio.server())
        await server.start()
        try:
            assert longest.is_socket()
        finally:
            await server.stop()
        with pytest.raises(PermanentError, match="over the 105-byte limit"):
            check_length(longest.with_name(longest.name + "s"))


async def test_two_pod_uids_serve_side_by_side(short_dir: Path) -> None:
    async with (
        _serve(short_dir, pod_uid="uid-old") as old,
        _serve(short_dir, pod_uid="uid-new") as new,
    ):
        assert old.paths.registration.name == f"{DRIVER}-uid-old-reg.sock"
        assert new.paths.dra.name == "dra-uid-new.sock"
        for plugin in (old, new):
            async with await KubeletSim.register(plugin.paths.registration) as kubelet:
                assert kubelet.registration.info.endpoint == str(plugin.paths.dra)
                assert (await kubelet.unprepare([_claim(X)])).claims[X].error == ""
        # Stopping one leaves the other's sockets alone.
    assert not list((short_dir / "registry").iterdir())


async def _check(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(response.status)


async def test_health_follows_readiness_and_the_sockets(short_dir: Path) -> None:
    async with _serve(short_dir) as plugin:
        health = ProbeServer(plugin.paths, port=0)
        await health.start()
        try:
            assert health.port > 0
            assert await _check(health.port) == health_pb2.HealthCheckResponse.NOT_SERVING
            # Not ready is not dead: liveness stays SERVING, so no restart loop.
            assert await _check(health.port, "liveness") == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await _check(health.port, "nope")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            health.set_ready()
            assert await _check(health.port) == health_pb2.HealthCheckResponse.SERVING
            # The DRA server no longer answers: unhealthy, even though "ready".
            await plugin.servers[0].stop(0)
            assert await _check(health.port) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert "sockets do not answer" in await health.status()
        finally:
            await health.stop()
