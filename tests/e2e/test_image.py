"""The plugin's image as users get it: built by ``make image`` with no Docker daemon and no
registry, read by skopeo as a registry client would, imported by containerd under the exact
reference the chart renders, and run by containerd and runc.

The build is cached by the content of its inputs (image/build.py), so only a change to the
code, the dependencies or the contents list rebuilds it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import chart_render
from tests.e2e import build

REPO = Path(__file__).resolve().parents[2]
VERSION = build.PROJECT_VERSION
ARCHES = ("amd64", "arm64")
PACKAGES = ("api", "cli", "cluster", "driver", "drivers", "kubeletplugin", "sandbox", "tools")

pytestmark = [
    pytest.mark.skipif(
        shutil.which("mmdebstrap") is None or shutil.which("skopeo") is None,
        reason="make image needs mmdebstrap and skopeo (tests/e2e/deps.sh installs both)",
    ),
    # A cold build (both architectures) takes minutes; a cached one, seconds.
    pytest.mark.timeout(1500),
]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "image" / "build.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"make image: {time.monotonic() - started:.1f} s\n{proc.stdout}")
    return out / f"gpu-dra-driver-{VERSION}.oci.tar"


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


@pytest.fixture(scope="module")
def layout(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("layout")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    return out


def _manifest(layout: Path, arch: str) -> dict[str, object]:
    top = json.loads((layout / "index.json").read_text())
    index = json.loads(_blob(layout, top["manifests"][0]["digest"]).read_text())
    for entry in index["manifests"]:
        if entry["platform"]["architecture"] == arch:
            manifest: dict[str, object] = json.loads(_blob(layout, entry["digest"]).read_text())
            return manifest
    raise AssertionError(f"no {arch} manifest in {index}")


@pytest.fixture(scope="module")
def rootfs(layout: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("rootfs")
    layers = _manifest(layout, "amd64")["layers"]
    assert isinstance(layers, list) and len(layers) == 1
    with tarfile.open(_blob(layout, layers[0]["digest"])) as tar:
        tar.extractall(out, filter="fully_trusted")  # our own layer: links and modes as built
    yield out
    shutil.rmtree(out, ignore_errors=True)


def chart_image() -> str:
    """The plugin image the chart renders with the EKS values, as the CRI looks it up."""
    docs = chart_render.render([chart_render.EKS_VALUES])
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    image = str(daemonset["spec"]["template"]["spec"]["containers"][0]["image"])
    return f"docker.io/library/{image}" if "/" not in image else image


@pytest.mark.parametrize("arch", ARCHES)
def test_skopeo_reads_each_architecture(archive: Path, arch: str) -> None:
    out = subprocess.run(
        ["skopeo", "inspect", "--override-arch", arch, "--override-os", "linux",
         f"oci-archive:{archive}:{VERSION}"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    seen = json.loads(out.stdout)
    assert seen["Architecture"] == arch
    assert seen["Labels"]["org.opencontainers.image.version"] == VERSION


def test_the_image_holds_the_driver_and_nothing_to_build_with(rootfs: Path) -> None:
    on_path = {p.name for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin")
               for p in (rootfs / d).iterdir()}  # fmt: skip
    for tool in ("pip", "pip3", "gcc", "cc", "c++", "ld", "apt", "apt-get"):
        assert tool not in on_path, f"{tool} is in the image"
    assert not list(rootfs.rglob("pip/__init__.py"))
    assert not (rootfs / "opt/gpu-dra/site/tests").exists()
    assert not list(rootfs.rglob(".git"))
    assert not list(rootfs.rglob("*.whl"))
    assert (rootfs / "usr/local/bin/gpu-dra").stat().st_mode & 0o111
    # Bytecode is built in: a read-only root filesystem still starts fast.
    assert list((rootfs / "opt/gpu-dra/site/driver/__pycache__").glob("*.cpython-311.pyc"))


def test_every_module_imports_inside_the_image(rootfs: Path) -> None:
    """The image's own libc and libraries load every module: grpcio needs libstdc++, which
    Debian's python3 does not pull in (the first image could not import grpc)."""
    script = (
        "import importlib, pkgutil, sys\n"
        "sys.path.insert(0, '/opt/gpu-dra/site')\n"
        "n = 0\n"
        f"for top in {PACKAGES!r}:\n"
        "    pkg = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, top + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "            n += 1\n"
        "print(n)\n"
    )
    out = subprocess.run(
        ["chroot", str(rootfs), "/usr/bin/python3", "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100


def _containerd_config(root: Path) -> str:
    return f"""
version = 3
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime",
                    "io.containerd.cri.v1.images"]
[grpc]
  address = "{root / "containerd.sock"}"
"""


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A containerd of the e2e tier's version, its own root and socket, no CRI."""
    bindir = build.build_containerd()
    root = Path(f"/tmp/ctd-{tmp_path.name[-12:]}")  # a unix socket path must stay short
    root.mkdir(parents=True, exist_ok=True)
    config = root / "containerd.toml"
    config.write_text(_containerd_config(root))
    socket = root / "containerd.sock"
    with (tmp_path / "containerd.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(bindir / "containerd"), "--config", str(config)], stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 60
            while not socket.is_socket():
                assert proc.poll() is None, (tmp_path / "containerd.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "containerd did not open its socket in 60 s"
                time.sleep(0.1)
            yield bindir, socket
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            subprocess.run(["umount", "-R", str(root / "state")], capture_output=True)
            shutil.rmtree(root, ignore_errors=True)


def test_containerd_imports_it_as_the_chart_names_it_and_runs_it(
    archive: Path, containerd: tuple[Path, Path]
) -> None:
    bindir, socket = containerd
    ctr = [str(bindir / "ctr"), "--address", str(socket), "-n", "k8s.io"]
    runc = build.build_runc()
    ref = chart_image()
    assert ref == f"docker.io/library/gpu-dra-driver:{VERSION}"
    imported = [*ctr, "images", "import", "--local", "--snapshotter", "native", str(archive)]
    subprocess.run(imported, check=True, timeout=300, capture_output=True)
    listed = subprocess.run(
        [*ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert ref in listed
    run = subprocess.run(
        [*ctr, "run", "--rm", "--snapshotter", "native", "--runc-binary", str(runc), ref,
         "gpu-dra-version", "gpu-dra", "--version"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert VERSION in run.stdout
