"""Every unix socket the product binds, and the daemons it starts bind, held to its limit at
the chart's paths, with the longest names: each driver's DRA and registration sockets (with
and without the pod UID of the chart's rolling updates), the MPS control daemon's, and
none of the IMEX daemon's (it speaks TCP). gRPC binds 105 bytes (grpcio refuses 106), the
real MPS daemon 106 (it exits 1 at 107).

Where a longer kubelet root leaves no room, a socket of the plugin falls back to upstream's
hashed names (``kubeletplugin.sockets``); a start removes this pod's stale socket of
either form, and never a sibling pod's."""

import re
import socket
import tempfile
from pathlib import Path

import grpc
import pytest

from drivers.computedomain.names import DRIVER_NAME as CD_DRIVER
from drivers.gpu.kinds import mpspaths
from kubeletplugin import sockets
from kubeletplugin.sockets import MAX_SOCKET_PATH, SocketServer, socket_paths

ROOT = Path(__file__).resolve().parents[1]
GPU_DRIVER = "gpu.nvidia.com"
KUBELET = Path("/var/lib/kubelet")  # the chart's values.yaml
POD_UID = "8b4c0f3e-5d2a-4c6b-9e1f-7a3d2c1b0e9f"  # 36 bytes, as every UID
GPU_UUID = "GPU-8abd4197-c2c5-76b0-6d28-4c5b250fbb1d"  # 40 bytes, as every GPU's
# The longest kubelet root whose sockets all fit: the MPS pipe's (drivers.gpu.kinds.mpspaths).
LONGEST_KUBELET = Path("/" + "k" * 46)


def _table(kubelet: Path) -> list[tuple[str, Path, int]]:
    """(what, path, limit) for every socket at a kubelet root, as the chart sets the flags."""
    registrar, plugins = kubelet / "plugins_registry", kubelet / "plugins"
    rows: list[tuple[str, Path, int]] = []
    for driver in (GPU_DRIVER, CD_DRIVER):
        for uid in (None, POD_UID):
            paths = socket_paths(
                registrar_dir=registrar, plugins_dir=plugins, driver_name=driver, pod_uid=uid
            )
            mode = "rolling" if uid else "plain"
            rows += [(f"{driver} registration ({mode})", paths.registration, MAX_SOCKET_PATH),
                     (f"{driver} DRA ({mode})", paths.dra, MAX_SOCKET_PATH)]  # fmt: skip
    pipe = mpspaths.pipe_dir(plugins / GPU_DRIVER, GPU_UUID)
    rows += [(f"MPS {name}", pipe / name, mpspaths.MAX_SOCKET_PATH)
             for name in mpspaths.SOCKET_NAMES]  # fmt: skip
    return rows


@pytest.mark.parametrize("kubelet", [KUBELET, LONGEST_KUBELET], ids=["default", "longest"])
def test_every_socket_fits_its_limit(kubelet: Path) -> None:
    rows = _table(kubelet)
    print(f"\nkubelet root {kubelet} ({len(str(kubelet))} bytes)")
    for what, path, limit in rows:
        print(f"{mpspaths.socket_bytes(path):4d} / {limit}  {what:50s} {path}")
    over = [(what, mpspaths.socket_bytes(p)) for what, p, limit in rows
            if mpspaths.socket_bytes(p) > limit]  # fmt: skip
    assert over == []
    assert len(rows) == 10
    mpspaths.check(kubelet / "plugins" / GPU_DRIVER)


def test_at_the_defaults_only_the_compute_domain_rolling_registration_is_at_the_edge() -> None:
    sizes = {what: mpspaths.socket_bytes(p) for what, p, _ in _table(KUBELET)}
    assert sizes[f"{CD_DRIVER} registration (rolling)"] == 105  # the full name, just fits
    assert sizes[f"{GPU_DRIVER} registration (rolling)"] == 94
    assert sizes[f"{CD_DRIVER} DRA (rolling)"] == 96
    assert sizes["MPS control_privileged"] == 75
    # A plugins directory one byte longer than the longest has no room for the MPS sockets.
    with pytest.raises(mpspaths.PipePathTooLongError):
        mpspaths.check(Path(f"{LONGEST_KUBELET}k") / "plugins" / GPU_DRIVER)


def test_the_imex_daemon_binds_no_unix_socket() -> None:
    """nvidia-imex and nvidia-imex-ctl speak TCP; nothing of ours there binds a socket."""
    binds = re.compile(r"AF_UNIX|unix://|\.sock\b|bind\(")
    sources = sorted((ROOT / "cluster" / "imexdaemon").rglob("*.py"))
    assert sources
    assert [p.name for p in sources if binds.search(p.read_text())] == []


def test_a_longer_kubelet_root_falls_back_to_upstreams_hashed_names() -> None:
    registrar = KUBELET.parent / "kubelet1" / "plugins_registry"  # one byte longer
    plugins = KUBELET.parent / "kubelet1" / "plugins"
    cd = socket_paths(registrar_dir=registrar, plugins_dir=plugins, driver_name=CD_DRIVER,
                      pod_uid=POD_UID)  # fmt: skip
    # upstream: <driver>-<base64url(sha256(uid)[:8])>-reg.sock
    assert cd.registration.name == f"{CD_DRIVER}-{sockets.digest(POD_UID, size=8)}-reg.sock"
    assert re.fullmatch(r"compute-domain\.nvidia\.com-[A-Za-z0-9_-]{11}-reg\.sock",
                        cd.registration.name)  # fmt: skip
    assert mpspaths.socket_bytes(cd.registration) == 81
    assert cd.dra.name == f"dra-{POD_UID}.sock"  # still fits: kept
    gpu = socket_paths(registrar_dir=registrar, plugins_dir=plugins, driver_name=GPU_DRIVER,
                       pod_uid=POD_UID)  # fmt: skip
    assert gpu.registration.name == f"{GPU_DRIVER}-{POD_UID}-reg.sock"
    # Longer still: the DRA socket is hashed, and then the driver name goes too.
    cd = socket_paths(registrar_dir=registrar, plugins_dir=Path("/" + "p" * 40),
                      driver_name=CD_DRIVER, pod_uid=POD_UID)  # fmt: skip
    assert cd.dra.name == f"dra-{sockets.digest(POD_UID, size=8)}"
    assert mpspaths.socket_bytes(cd.dra) == 83
    long_registrar = Path("/" + "r" * 60)
    cd = socket_paths(registrar_dir=long_registrar, plugins_dir=plugins, driver_name=CD_DRIVER,
                      pod_uid=POD_UID)  # fmt: skip
    assert cd.registration.name == f"dra-{sockets.digest(CD_DRIVER, POD_UID, size=16)}-reg.sock"
    assert len(sockets.digest(CD_DRIVER, POD_UID, size=16)) == 22
    # Stable: the same pod gets the same names at every start.
    assert cd == socket_paths(registrar_dir=long_registrar, plugins_dir=plugins,
                              driver_name=CD_DRIVER, pod_uid=POD_UID)  # fmt: skip


def test_the_digest_is_sha256_in_unpadded_url_safe_base64() -> None:
    # sha256(b"abc")[:8] = ba7816bf8f01cfea
    assert sockets.digest("abc", size=8) == "ungWv48Bz-o"
    assert sockets.digest("a", "b", size=8) == sockets.digest("a\0b", size=8)


async def test_a_start_removes_this_pods_stale_socket_of_either_form_and_no_siblings() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="s") as name:
        root = Path(name)
        # A registrar path where the full name just does not fit: the hashed one is taken.
        registrar = root / ("r" * (MAX_SOCKET_PATH - len(name) - len(f"/{CD_DRIVER}-") - 45))
        registrar.mkdir()
        paths = socket_paths(registrar_dir=registrar, plugins_dir=root / "p",
                             driver_name=CD_DRIVER, pod_uid=POD_UID)  # fmt: skip
        full = registrar / f"{CD_DRIVER}-{POD_UID}-reg.sock"
        assert mpspaths.socket_bytes(full) == MAX_SOCKET_PATH + 1
        assert paths.registration.name == f"{CD_DRIVER}-{sockets.digest(POD_UID, size=8)}-reg.sock"
        assert full in paths.others(paths.registration)
        sibling = registrar / f"{CD_DRIVER}-{sockets.digest('another-pod', size=8)}-reg.sock"
        for stale in (full, sibling):
            _make_socket(stale)
        server = SocketServer(
            paths.registration, grpc.aio.server(), stale=paths.others(paths.registration)
        )
        await server.start()
        try:
            assert paths.registration.is_socket()
            assert not full.exists()  # this pod's, of the other form: stale
            assert sibling.is_socket()  # another pod's: not ours to judge
        finally:
            await server.stop()


def _make_socket(path: Path) -> None:
    """A socket file left behind: bound, then closed without an unlink."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the kernel's limit is 107 bytes, over gRPC's 105
