"""What a container would get: CDI device IDs resolved against the specs on disk.

This is the container runtime's side of CDI, not the plugin's: scan the CDI root
for spec files, find each ``vendor/class=name`` device by its spec's ``kind`` and
the device's name, and merge the spec-wide container edits with the device's own.
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandbox.demo._nodes import DemoError

_SPEC_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class ContainerEdits:
    device_nodes: tuple[str, ...]
    env: tuple[str, ...]
    mounts: int
    hooks: int
    spec_files: tuple[str, ...]


def read_specs(cdi_root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every CDI spec file directly under ``cdi_root``, parsed."""
    specs: list[tuple[Path, dict[str, Any]]] = []
    if not cdi_root.is_dir():
        return specs
    for path in sorted(cdi_root.iterdir()):
        if path.suffix not in _SPEC_SUFFIXES or not path.is_file():
            continue
        text = path.read_text()
        try:
            spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise DemoError(f"CDI spec {path} cannot be parsed: {exc}") from exc
        if isinstance(spec, dict):
            specs.append((path, spec))
    return specs


def defining(ids: Iterable[str], specs: Sequence[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Names of the spec files that still define any of the devices ``ids`` name (pure)."""
    wanted = {tuple(i.partition("=")[::2]) for i in ids}
    return [
        path.name
        for path, spec in specs
        if any((spec.get("kind"), d.get("name")) in wanted for d in spec.get("devices") or ())
    ]


def resolve(ids: Iterable[str], specs: Sequence[tuple[Path, dict[str, Any]]]) -> ContainerEdits:
    """The merged container edits of the devices ``ids`` name (pure)."""
    nodes: list[str] = []
    env: list[str] = []
    mounts = hooks = 0
    used: list[Path] = []
    for cdi_id in ids:
        kind, sep, name = cdi_id.partition("=")
        if not sep:
            raise DemoError(f"{cdi_id!r} is not a fully qualified CDI device name")
        found = [
            (path, spec, device)
            for path, spec in specs
            if spec.get("kind") == kind
            for device in spec.get("devices") or ()
            if device.get("name") == name
        ]
        if len(found) != 1:
            problem = "no CDI spec defines" if not found else "several CDI specs define"
            raise DemoError(f"{problem} device {cdi_id}")
        path, spec, device = found[0]
        editing = [device.get("containerEdits") or {}]
        if path not in used:  # spec-wide edits apply once per spec
            used.append(path)
            editing.insert(0, spec.get("containerEdits") or {})
        for edits in editing:
            nodes += [n["path"] for n in edits.get("deviceNodes") or () if n["path"] not in nodes]
            env += [e for e in edits.get("env") or () if e not in env]
            mounts += len(edits.get("mounts") or ())
            hooks += len(edits.get("hooks") or ())
    return ContainerEdits(
        tuple(sorted(nodes, key=_device_order)),
        tuple(env),
        mounts,
        hooks,
        tuple(p.name for p in used),
    )


def _device_order(path: str) -> tuple[int, int, str]:
    # GPU nodes first, by minor number; then the control nodes.
    tail = path.removeprefix("/dev/nvidia")
    return (0, int(tail), path) if tail.isdigit() else (1, 0, path)
