"""Container images built on this machine: no registry is reachable, so nothing is pulled.

A workload image is Debian's static busybox in an otherwise empty rootfs; the sandbox
("pause") image is a static C program that sleeps until SIGTERM. Each is written as an OCI
image layout tarball that ``ctr images import`` takes, tagged with the name the pods use, so
``imagePullPolicy: IfNotPresent`` needs no pull.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

from image.build import normalized

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "env", "ls", "echo", "sleep", "grep", "sort", "tr", "true", "stat")
PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, mode: int = 0o755,
         link: str | None = None, directory: bool = False) -> None:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.mode = mode
    if directory:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif link is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    else:
        assert data is not None
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _layer(files: dict[str, bytes], links: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "dev", "proc", "sys", "tmp", "etc"):
            _add(tar, d, directory=True)
        for name, data in files.items():
            _add(tar, name, data)
        for name, target in links.items():
            _add(tar, name, link=target)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data, mode=0o644)
    return f"sha256:{digest}"


def write_image(out: Path, ref: str, layer: bytes, entrypoint: list[str]) -> Path:
    """An OCI image layout tarball of one uncompressed layer, tagged ``ref``."""
    ref = normalized(ref)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    # The ref as a label: one image ID per name, or the CRI finds an ID under another name.
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "Labels": {"ref": ref}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()  # fmt: skip
    with tarfile.open(out, "w") as tar:
        layer_digest = _blob(tar, layer)
        config_digest = _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": len(layer)}],
        }).encode()  # fmt: skip
        manifest_digest = _blob(tar, manifest)
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": len(manifest),
                "annotations": {"io.containerd.image.name": ref,
                                "org.opencontainers.image.ref.name": ref},
                "platform": {"architecture": "amd64", "os": "linux"},
            }],
        }  # fmt: skip
        _add(tar, "index.json", json.dumps(index).encode(), mode=0o644)
        _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}', mode=0o644)
    return out


def busybox_image(out: Path, ref: str) -> Path:
    if not BUSYBOX.exists():
        raise RuntimeError(f"{BUSYBOX} missing: apt-get install busybox-static")
    layer = _layer({"bin/busybox": BUSYBOX.read_bytes()},
                   {f"bin/{a}": "busybox" for a in APPLETS})  # fmt: skip
    return write_image(out, ref, layer, ["/bin/sh"])


def pause_image(out: Path, ref: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        subprocess.run(["cc", "-static", "-O2", "-o", str(binary), str(src)], check=True)
        layer = _layer({"pause": binary.read_bytes()}, {})
    return write_image(out, ref, layer, ["/pause"])
