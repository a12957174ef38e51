"""Build the gpu-dra image with no Docker daemon and no registry, from ``contents.toml``.

``python image/build.py [--arch amd64] [--arch arm64] [--out DIR] [--name REF]`` writes
``DIR/gpu-dra-driver-<version>.oci.tar``: an OCI image layout, as a tar, that
``ctr images import`` and ``skopeo`` read, holding an image index of one manifest per
architecture, named ``<name>:<version>``. Each step is a documented tool or format:

1. ``mmdebstrap --variant=extract`` unpacks Debian's ``python3`` and its dependencies into an
   empty root filesystem (as root, which the build must be);
2. ``pip`` builds the project's wheel, downloads its runtime dependencies as wheels for the
   architecture, and installs both into ``/opt/gpu-dra/site`` (pip itself stays outside);
3. the standard library and the site are compiled to bytecode (unchecked-hash pyc: the same
   bytes on every build), documentation and caches are removed, and ``/usr/local/bin/gpu-dra``
   is written;
4. the root filesystem becomes one gzip layer (sorted, owned by root, mtime 0) and the layer,
   its config and manifest become blobs of the layout (OCI image spec v1.1).

Each architecture's layer is cached under ``$GPU_DRA_IMAGE_CACHE`` (default
``~/.cache/gpu-dra-image``) by a hash of every input: this file, ``contents.toml``,
``pyproject.toml``, the packages' files and the architecture. Standard library only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONTENTS = tomllib.loads((HERE / "contents.toml").read_text())
PACKAGES = ("api", "cli", "cluster", "driver", "drivers", "kubeletplugin", "sandbox", "tools")
SITE = "opt/gpu-dra/site"
ENTRY = f"""#!/usr/bin/python3
import sys

sys.path.insert(0, "/{SITE}")
from cli import main

sys.exit(main())
"""
OCI_ARCH = {"amd64": "amd64", "arm64": "arm64"}


def version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def normalized(ref: str) -> str:
    """The name as containerd and the CRI look it up (``x:1`` is ``docker.io/library/x:1``)."""
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return f"{name}:{tag}"


def _inputs_digest(arch: str) -> str:
    h = hashlib.sha256()
    files = [Path(__file__), HERE / "contents.toml", ROOT / "pyproject.toml", ROOT / "README.md"]
    for package in PACKAGES:
        files += sorted(p for p in (ROOT / package).rglob("*") if p.is_file())
    for path in files:
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(arch.encode())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "gpu-dra-image"
    return Path(os.environ.get("GPU_DRA_IMAGE_CACHE", default))


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )


def _pip_platform_args(arch: str) -> list[str]:
    py = CONTENTS["python"]["version"]
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", py]
    for tag in CONTENTS["python"]["platforms"][arch]:
        args += ["--platform", tag]
    return args


def _rootfs(arch: str, root: Path) -> None:
    debian = CONTENTS["debian"]
    _run([
        "mmdebstrap", "--quiet", "--variant=extract", f"--architectures={arch}",
        f"--include={','.join(debian['packages'])}", debian["suite"], str(root),
    ])  # fmt: skip


def _site(arch: str, root: Path, work: Path) -> None:
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # From a clean copy: setuptools stages a build in the source tree (build/lib), and a
    # module removed since the last build would stay in the next wheel.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    _run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(source)])
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    _run([*pip, "download", *_pip_platform_args(arch), "--dest", str(wheels), *deps])
    _run([
        *pip, "install", "--no-deps", "--no-index", "--no-compile", *_pip_platform_args(arch),
        "--target", str(root / SITE), *map(str, sorted(wheels.glob("*.whl"))),
    ])  # fmt: skip
    shutil.rmtree(root / SITE / "bin", ignore_errors=True)  # pip's scripts name the host python


def _finish(root: Path) -> None:
    for pattern in CONTENTS["trim"]["paths"]:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    entry = root / "usr/local/bin/gpu-dra"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(ENTRY)
    entry.chmod(0o755)
    if sys.version_info[:2] != tuple(int(p) for p in CONTENTS["python"]["version"].split(".")):
        raise SystemExit(f"bytecode needs Python {CONTENTS['python']['version']} to build it")
    stdlib = root / f"usr/lib/python{CONTENTS['python']['version']}"
    _run([
        sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
        "unchecked-hash", "-s", str(root), "-p", "/", "-x", r"/(test|idlelib|lib2to3)/",
        str(stdlib), str(root / SITE),
    ])  # fmt: skip


def _layer(root: Path, out: Path) -> None:
    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.ischr() or info.isblk() or info.isfifo():
            return None  # the runtime makes /dev
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    with (
        out.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=owned_by_root)


def build_layer(arch: str) -> Path:
    """The architecture's root filesystem as a gzip layer, built once per set of inputs."""
    cached = cache_dir() / f"{arch}-{_inputs_digest(arch)}.tar.gz"
    if cached.exists():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-dra-image-") as tmp:
        work = Path(tmp)
        root = work / "rootfs"
        _rootfs(arch, root)
        _site(arch, root, work)
        _finish(root)
        # Two builds may share the cache (make e2e beside make image): each writes its own
        # file and the rename makes one of them the layer.
        partial = cached.with_suffix(f".partial.{os.getpid()}")
        _layer(root, partial)
        partial.replace(cached)
    return cached


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": len(self.data),
            **extra,
        }


def _json_blob(media_type: str, doc: object) -> Blob:
    return Blob(media_type, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def _sha256(path: Path, *, unzip: bool = False) -> str:
    h = hashlib.sha256()
    with gzip.open(path, "rb") if unzip else path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def write_archive(out: Path, ref: str, layers: dict[str, Path]) -> Path:
    """An OCI layout tar: index.json names one image index, one manifest per architecture;
    the image's version label is ``ref``'s tag."""
    image = CONTENTS["image"]
    blobs: list[Blob] = []
    manifests = []
    big: dict[str, Path] = {}
    for arch, layer in layers.items():
        layer_digest = _sha256(layer)
        big[layer_digest] = layer
        config = _json_blob("application/vnd.oci.image.config.v1+json", {
            "architecture": OCI_ARCH[arch], "os": "linux", "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": image["entrypoint"], "Cmd": image["cmd"], "Env": image["env"],
                       "Labels": {"org.opencontainers.image.version": ref.rsplit(":", 1)[1]}},
            "rootfs": {"type": "layers", "diff_ids": [_sha256(layer, unzip=True)]},
        })  # fmt: skip
        manifest = _json_blob("application/vnd.oci.image.manifest.v1+json", {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor(),
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest, "size": layer.stat().st_size}],
        })  # fmt: skip
        blobs += [config, manifest]
        manifests.append(
            manifest.descriptor(platform={"architecture": OCI_ARCH[arch], "os": "linux"})
        )
    index = _json_blob("application/vnd.oci.image.index.v1+json", {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    })  # fmt: skip
    blobs.append(index)
    name = normalized(ref)
    top = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [index.descriptor(annotations={
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
        })],
    }  # fmt: skip
    partial = out.with_suffix(f".partial.{os.getpid()}")
    with tarfile.open(partial, "w") as tar:

        def add(name: str, data: bytes | None = None, path: Path | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = 0o644, 0
            if path is not None:
                info.size = path.stat().st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        for digest, path in sorted(big.items()):
            add(f"blobs/sha256/{digest.split(':')[1]}", path=path)
        for blob in blobs:
            add(f"blobs/sha256/{blob.digest.split(':')[1]}", blob.data)
        add("index.json", json.dumps(top, sort_keys=True).encode())
    partial.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", choices=sorted(OCI_ARCH), help="repeatable")
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--name", default=CONTENTS["image"]["name"], help="image name, untagged")
    # Another tag of the same build (the e2e tier's helm upgrade to a second image).
    parser.add_argument("--tag", default=version(), help="image tag (default: the version)")
    args = parser.parse_args(argv)
    arches = args.arch or ["amd64", "arm64"]
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    layers = {}
    for arch in arches:
        t0 = time.monotonic()
        layers[arch] = build_layer(arch)
        print(f"{arch}: layer {layers[arch].stat().st_size / 2**20:.1f} MiB "
              f"({time.monotonic() - t0:.1f} s)")  # fmt: skip
    ref = f"{args.name}:{args.tag}"
    out = write_archive(args.out / f"gpu-dra-driver-{args.tag}.oci.tar", ref, layers)
    print(f"{out} {normalized(ref)} {out.stat().st_size / 2**20:.1f} MiB "
          f"({time.monotonic() - start:.1f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
