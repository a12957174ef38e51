"""The devices every EKS instance type publishes, for ``gpu-dra validate``'s selector check.

``python -m tests.profile_devices`` (or ``make docs``) rewrites
``tools/validation/profiledevices.json``; ``tests/test_validate_profiles.py`` fails
when the file differs from what this writes. Each instance profile the simulated hardware
ships is discovered as ``gpu-dra discover`` discovers it (the real pynvml over the simulated
library), in each variant the driver publishes: as it is, with ``--consumable-capacity``, and
for a MIG-capable GPU in MIG mode with ``--dynamic-mig`` (every placement). validate runs on a
laptop without NVML, so it reads this file instead of discovering.

What differs between two real nodes of one type (UUIDs, PCI addresses, the driver version,
the NVLink domain) is left out: validate does not judge a selector on those.
"""

import json
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from driver import DEFAULT_DRIVER_NAME
from driver.nvml.profile import load_profile, profile_names
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from tools.validation.hardware import DATA, NODE_SPECIFIC

# Test constructs, not instance types: no EKS node publishes them.
SYNTHETIC_PREFIX = "synthetic-"


def _variants(name: str, root: Path) -> list[tuple[str, SimulatedNode, bool, bool]]:
    """(variant, node, dynamic MIG, consumable capacity) for one profile."""
    plain = SimulatedNode(name, "node", root / name)
    variants = [("", plain, False, False), ("consumable-capacity", plain, False, True)]
    # A profile that extends another (p4d.24xlarge-mig) has its base's dynamic variant.
    extends = (
        "extends" in (resources.files("driver.nvml") / "profiles" / f"{name}.yaml").read_text()
    )
    if load_profile(name).mig_capable and not extends:
        mig = root / f"{name}-dynamic.yaml"
        mig.write_text(f"extends: {name}\nmig: {{enabled: all}}\n")
        node = SimulatedNode(mig, "node", root / f"{name}-dynamic")
        variants.append(("dynamic-mig", node, True, False))
    return variants


def _device(device: dict[str, Any]) -> dict[str, Any]:
    """What a selector reads of a device: attributes (less the node's own), capacity values,
    allowMultipleAllocations."""
    attributes = {
        k: v for k, v in device["attributes"].items() if k.rpartition("/")[2] not in NODE_SPECIFIC
    }
    capacity = {k: {"value": v["value"]} for k, v in device.get("capacity", {}).items()}
    out = {"name": device["name"], "attributes": attributes, "capacity": capacity}
    if device.get("allowMultipleAllocations"):
        out["allowMultipleAllocations"] = True
    return out


def generate() -> dict[str, Any]:
    profiles: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in profile_names():
            if name.startswith(SYNTHETIC_PREFIX):
                continue
            profiles[name] = {}
            for variant, node, dynamic, consumable in _variants(name, Path(tmp)):
                inventory = discover(node.nvml, sysfs_root=node.sysfs_root, dynamic_mig=dynamic)
                slices = build_resource_slices(
                    inventory,
                    driver_name=DEFAULT_DRIVER_NAME,
                    node_name="node",
                    consumable_capacity=consumable,
                )
                devices = [_device(d) for s in slices for d in s["spec"].get("devices", [])]
                profiles[name][variant] = devices
    return {"driver": DEFAULT_DRIVER_NAME, "profiles": profiles}


def render() -> str:
    return json.dumps(generate(), sort_keys=True, separators=(",", ":")) + "\n"


def main() -> int:
    DATA.write_text(render(), encoding="utf-8")
    print(f"wrote {DATA}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
