"""Build the upstream components of the e2e tier from their Go modules, cached by version.

``python -m tests.e2e.build [--k8s 1.36] [component ...]`` builds into
``$GPU_DRA_E2E_CACHE`` (default ``~/.cache/gpu-dra-e2e``), one folder per version, and
prints each binary's path. A binary that is already there is not rebuilt, so a machine builds
each version once. Standard library only: it runs before the virtualenv exists.

``go install pkg@version`` refuses a module with replace directives, and ``k8s.io/kubernetes``
replaces its ~30 staging modules with local paths. So each Kubernetes version gets a small
module of ours that requires ``k8s.io/kubernetes`` and replaces every staging module with the
published module of the same version, generated from that version's own go.mod (whose ``go``
and ``godebug`` lines are copied: a dependency's are ignored by the go command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS = tomllib.loads((HERE / "versions.toml").read_text())
K8S_BINARIES = (
    "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy",
)  # fmt: skip


def cache_root() -> Path:
    return Path(os.environ.get("GPU_DRA_E2E_CACHE", Path.home() / ".cache" / "gpu-dra-e2e"))


def k8s_version(minor: str | None) -> str:
    table: dict[str, str] = VERSIONS["kubernetes"]
    key = minor or os.environ.get("K8S") or VERSIONS["default"]
    if key not in table:
        raise SystemExit(f"unknown Kubernetes minor {key!r}: versions.toml pins {sorted(table)}")
    return table[key]


def _go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "GOFLAGS": "-mod=mod", **(env or {})}
    proc = subprocess.run(["go", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed in {cwd}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def _upstream_gomod(module: str, version: str, work: Path) -> str:
    info = json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], work))
    return Path(info["GoMod"]).read_text()


def _directives(gomod: str) -> tuple[str, list[str]]:
    """The go line and the godebug lines of a go.mod."""
    go_line = re.search(r"^go (\S+)$", gomod, re.M)
    godebug = re.findall(r"^godebug (.+)$", gomod, re.M)
    block = re.search(r"^godebug \($(.*?)^\)", gomod, re.M | re.S)
    if block:
        godebug += [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]
    return (go_line.group(1) if go_line else "1.24"), [g for g in godebug if not g.startswith("(")]


def _staging_replaces(gomod: str, staging_version: str) -> list[str]:
    found = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/src/\S+$", gomod, re.M)
    if not found:
        raise SystemExit("no staging replace directives in k8s.io/kubernetes go.mod")
    return [f"\t{m} => {m} {staging_version}" for m in found]


def _write_module(dir_: Path, name: str, gomod_text: str, mains: dict[str, str]) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "go.mod").write_text(gomod_text)
    for sub, src in mains.items():
        (dir_ / sub).mkdir(parents=True, exist_ok=True)
        (dir_ / sub / "main.go").write_text(src)


def _tools_go(pkgs: list[str]) -> str:
    imports = "\n".join(f'\t_ "{p}"' for p in pkgs)
    return f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"


def _build(module_dir: Path, pkg: str, out: Path, ldflags: str = "", *, cgo: bool = False,
           tags: str = "") -> None:  # fmt: skip
    started = time.monotonic()
    print(f"building {out.name} ({pkg}) ...", file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    env = {"CGO_ENABLED": "1" if cgo else "0"}
    flags = ["-tags", tags] if tags else []
    _go(
        ["build", "-trimpath", *flags, "-ldflags", f"-s -w {ldflags}".strip(), "-o", str(tmp),
         pkg],
        module_dir,
        env,
    )  # fmt: skip
    tmp.rename(out)
    print(f"built {out.name} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


# Modules a Kubernetes release requires that the Go module proxy here does not serve (403),
# each with the stand-in its kubelet builds against. sigs.k8s.io/iptables-wrappers (1.38's
# kubelet and kube-proxy): the stand-in finds no iptables, so the kubelet makes no hint chains,
# as on an nftables-only host. kube-proxy needs the whole library: such a release runs the
# newest pinned minor's kube-proxy that builds (an older kube-proxy is a skew Kubernetes
# supports).
UNSERVED = {"sigs.k8s.io/iptables-wrappers": HERE / "iptables_stub"}


def build_kubernetes(version: str, wanted: tuple[str, ...] = K8S_BINARIES) -> Path:
    root = cache_root() / f"kubernetes-{version}"
    bindir = root / "bin"
    missing = [b for b in wanted if not (bindir / b).exists()]
    if not missing:
        return bindir
    module = root / "module"
    module.mkdir(parents=True, exist_ok=True)
    upstream = _upstream_gomod("k8s.io/kubernetes", version, module)
    stubbed = {m: path for m, path in UNSERVED.items() if re.search(rf"^\s*{m} v", upstream, re.M)}
    if stubbed and "kube-proxy" in missing:
        missing.remove("kube-proxy")
        older = _older_kube_proxy(version)
        bindir.mkdir(parents=True, exist_ok=True)
        (bindir / "kube-proxy").symlink_to(older)
        print(f"kube-proxy: {older} ({', '.join(stubbed)} is not served)", file=sys.stderr)
        if not missing:
            return bindir
    go_line, godebug = _directives(upstream)
    staging = "v0." + version.removeprefix("v1.")
    lines = [
        "module gpudra.test/kubernetes",
        "",
        f"go {go_line}",
        *(f"godebug {g}" for g in godebug),
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
        *_staging_replaces(upstream, staging),
        *(f"\t{m} => {path}" for m, path in stubbed.items()),
        ")",
        "",
    ]
    pkgs = [
        f"k8s.io/kubernetes/cmd/{b}" for b in K8S_BINARIES if not (stubbed and b == "kube-proxy")
    ]
    _write_module(module, "kubernetes", "\n".join(lines), {})
    (module / "tools.go").write_text(_tools_go(pkgs))
    # go.mod was written anew (tidy's requires gone), and a binary added to the list brings
    # modules the earlier go.sum lacks: tidy each time something is built (seconds, cached).
    started = time.monotonic()
    print(f"resolving k8s.io/kubernetes {version} modules ...", file=sys.stderr, flush=True)
    # -e: tidy also resolves the tests of every package it reaches, and a module only a test
    # needs may not be served by the proxy (1.38's kube-proxy tests import iptables-wrappers'
    # testing package, refused with 403); a module the binaries need fails their build.
    _go(["mod", "tidy", "-e"], module)
    print(f"resolved in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    major, minor = version.removeprefix("v").split(".")[:2]
    stamp = " ".join(
        f"-X k8s.io/component-base/version.{k}={v}"
        for k, v in (
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        )
    )
    # The client-go copy of the version variables is what kubectl-like clients report.
    stamp += " " + stamp.replace("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    bindir.mkdir(exist_ok=True)
    for b in missing:
        _build(module, f"k8s.io/kubernetes/cmd/{b}", bindir / b, stamp)
    return bindir


def _older_kube_proxy(version: str) -> Path:
    """The kube-proxy of the newest pinned release older than ``version`` (built if need be)."""
    table: dict[str, str] = VERSIONS["kubernetes"]
    key = tuple(int(x) for x in version.removeprefix("v").split(".")[:2])
    older = [v for v in table.values() if tuple(int(x) for x in v[1:].split(".")[:2]) < key]
    newest = max(older, key=lambda v: tuple(int(x) for x in v[1:].split("-")[0].split(".")))
    return build_kubernetes(newest, ("kube-proxy",)) / "kube-proxy"


def _simple_module(
    name: str, requires: dict[str, str], mains: dict[str, str], go_line: str = "1.24"
) -> Path:
    module = cache_root() / name / "module"
    req = "\n".join(f"\t{m} {v}" for m, v in requires.items())
    _write_module(
        module, name, f"module gpudra.test/{name}\n\ngo {go_line}\n\nrequire (\n{req}\n)\n", mains
    )
    if not (module / "go.sum").exists():
        _go(["mod", "tidy"], module)
    return module


def build_etcd() -> Path:
    version = VERSIONS["etcd"]["version"]
    out = cache_root() / f"etcd-{version}" / "etcd"
    if not out.exists():
        main = (
            'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
            "func main() { etcdmain.Main(os.Args) }\n"
        )
        module = _simple_module(
            f"etcd-{version}", {"go.etcd.io/etcd/server/v3": version}, {"cmd/etcd": main}
        )
        _build(module, "./cmd/etcd", out)
    return out


def _tool_module(name: str, upstream: str, version: str, pkgs: list[str]) -> Path:
    """A module of ours requiring ``upstream`` at ``version``, for ``go build`` of ``pkgs``
    (``go install pkg@version`` would do, but not with the go line the upstream needs)."""
    module = cache_root() / name / "module"
    module.mkdir(parents=True, exist_ok=True)
    go_line, _ = _directives(_upstream_gomod(upstream, version, module))
    (module / "go.mod").write_text(
        f"module gpudra.test/{name}\n\ngo {go_line}\n\nrequire {upstream} {version}\n"
    )
    (module / "tools.go").write_text(_tools_go(pkgs))
    if not (module / "go.sum").exists():
        _go(["mod", "tidy"], module)
    return module


def build_containerd() -> Path:
    version = VERSIONS["containerd"]["version"]
    bindir = cache_root() / f"containerd-{version}" / "bin"
    names = ("containerd", "containerd-shim-runc-v2", "ctr")
    if all((bindir / n).exists() for n in names):
        return bindir
    upstream = "github.com/containerd/containerd/v2"
    pkgs = [f"{upstream}/cmd/{n}" for n in names]
    module = _tool_module(f"containerd-{version}", upstream, version, pkgs)
    bindir.mkdir(parents=True, exist_ok=True)
    for n, pkg in zip(names, pkgs, strict=True):
        if not (bindir / n).exists():
            _build(module, pkg, bindir / n, f"-X {upstream}/version.Version={version}",
                   tags="no_btrfs no_devmapper no_zfs no_aufs")  # fmt: skip
    return bindir


def build_nvidia_ctk() -> Path:
    version = VERSIONS["nvidia-container-toolkit"]["version"]
    out = cache_root() / f"nvidia-container-toolkit-{version}" / "nvidia-ctk"
    if not out.exists():
        upstream = "github.com/NVIDIA/nvidia-container-toolkit"
        pkg = f"{upstream}/cmd/nvidia-ctk"
        module = _tool_module(f"nvidia-container-toolkit-{version}", upstream, version, [pkg])
        _build(module, pkg, out, cgo=True)  # go-nvml dlopens libnvidia-ml through cgo
    return out


def build_helm() -> Path:
    version = VERSIONS["helm"]["version"]
    out = cache_root() / f"helm-{version}" / "helm"
    if not out.exists():
        upstream = "helm.sh/helm/v3"
        pkg = f"{upstream}/cmd/helm"
        module = _tool_module(f"helm-{version}", upstream, version, [pkg])
        _build(module, pkg, out, f"-X {upstream}/internal/version.version={version}")
    return out


def build_runc() -> Path:
    version = VERSIONS["runc"]["version"]
    out = cache_root() / f"runc-{version}-seccomp" / "runc"
    if not out.exists():
        pkg = "github.com/opencontainers/runc"
        module = _tool_module(f"runc-{version}", pkg, version, [pkg])
        # containerd gives every sandbox a seccomp profile: build with libseccomp (cgo).
        _build(module, pkg, out, f"-X main.version={version.removeprefix('v')}", cgo=True,
               tags="seccomp")  # fmt: skip
    return out


def build_oracles() -> Path:
    """The reference oracle of tests/oracles, keyed by a hash of its Go sources."""
    src = HERE.parent / "oracles"
    digest = hashlib.sha256()
    for f in sorted([src / "go.mod", src / "go.sum", *src.rglob("*.go")]):
        digest.update(f.relative_to(src).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    out = cache_root() / f"oracles-{digest.hexdigest()[:16]}" / "oracle"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        _build(src, "./cmd/oracle", out)
    return out


# The plugin's image under two tags (level 3 upgrades from the first to the second): the
# same build, the second tag and version label differ. Built here, before level 3 enters its
# network namespace, where no package mirror is reachable.
# The project's version (pyproject.toml), as the chart's default image tag names it.
PROJECT_VERSION: str = tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())["project"][
    "version"
]
IMAGE_TAGS = (PROJECT_VERSION, f"{PROJECT_VERSION}-e2e.2")


def image_archive(tag: str) -> Path:
    return cache_root() / "images" / f"gpu-dra-driver-{tag}.oci.tar"


def build_images() -> Path:
    repo = HERE.parents[1]
    out = image_archive(IMAGE_TAGS[0]).parent
    for tag in IMAGE_TAGS:  # in turn: the second finds the first's layer in the image cache
        subprocess.run(
            [sys.executable, str(repo / "image" / "build.py"), "--arch", "amd64",
             "--out", str(out), "--tag", tag],
            check=True,
        )  # fmt: skip
    return out


BUILDERS = {
    "kubernetes": lambda minor: build_kubernetes(k8s_version(minor)),
    "etcd": lambda minor: build_etcd(),
    "containerd": lambda minor: build_containerd(),
    "runc": lambda minor: build_runc(),
    "helm": lambda minor: build_helm(),
    "nvidia-ctk": lambda minor: build_nvidia_ctk(),
    "oracles": lambda minor: build_oracles(),
    "images": lambda minor: build_images(),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.build", description=__doc__)
    parser.add_argument(
        "--k8s",
        help=f"Kubernetes minor from versions.toml (default: $K8S or {VERSIONS['default']})",
    )
    parser.add_argument("components", nargs="*", default=list(BUILDERS), choices=list(BUILDERS))
    args = parser.parse_args(argv)
    if shutil.which("go") is None:
        raise SystemExit("go not found on PATH: the e2e tier builds Kubernetes from source")
    free = shutil.disk_usage(cache_root().parent if cache_root().parent.exists() else "/").free
    if free < 8 * 2**30:
        raise SystemExit(f"only {free / 2**30:.1f} GiB free for the e2e build cache; 8 GiB needed")
    started = time.monotonic()
    for c in args.components:
        print(BUILDERS[c](args.k8s))
    print(f"e2e components ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
