"""Feature gates that claim and class fields depend on, and their defaults per Kubernetes version.

From ``pkg/features/kube_features.go`` (kubernetes/kubernetes, versioned specs): the
Kubernetes minor version from which each gate is on by default. An API server with the gate
off drops the field on create, so the object is accepted but does not ask for what it says.
"""

from dataclasses import dataclass

Version = tuple[int, int]

# The versions this tool has gate defaults for: kubernetes-validate's range that has
# resource.k8s.io/v1, and 1.38, whose resource.k8s.io/v1 has no new field (1.38.0-beta.0
# against 1.37.2; the 1.37 schemas check it).
OLDEST: Version = (1, 34)
NEWEST: Version = (1, 38)


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    alpha: Version
    on_by_default: Version  # first version where the gate defaults to on

    def off_by_default(self, version: Version) -> bool:
        return version < self.on_by_default


DRA_CONSUMABLE_CAPACITY = Gate("DRAConsumableCapacity", alpha=(1, 34), on_by_default=(1, 36))
DRA_EXTENDED_RESOURCE = Gate("DRAExtendedResource", alpha=(1, 34), on_by_default=(1, 36))
DRA_DEVICE_TAINTS = Gate("DRADeviceTaints", alpha=(1, 33), on_by_default=(1, 36))
# Beta and off in 1.36, GA and on from 1.37 (locked in 1.38).
DRA_DEVICE_TAINT_RULES = Gate("DRADeviceTaintRules", alpha=(1, 33), on_by_default=(1, 37))
# DRAPrioritizedList (firstAvailable) and DRAAdminAccess (adminAccess) are on by default from
# 1.34, the oldest version this tool checks, so they never warn.


# The versions of resource.k8s.io that serve DeviceTaintRule, by the first minor serving each.
TAINT_RULE_VERSIONS: dict[str, Version] = {
    "resource.k8s.io/v1alpha3": (1, 33),
    "resource.k8s.io/v1beta2": (1, 36),
    "resource.k8s.io/v1": (1, 37),
}


def warning(gate: Gate, version: Version) -> str:
    return (
        f"needs feature gate {gate.name}, off by default in Kubernetes "
        f"{version[0]}.{version[1]} (on by default from "
        f"{gate.on_by_default[0]}.{gate.on_by_default[1]}): an API server without the gate "
        "drops this field"
    )


def parse_version(text: str) -> Version:
    """``1.34``, ``v1.34.3`` or ``v1.34.3-eks-ab12`` -> ``(1, 34)``.

    Raises ValueError for anything else or a version outside OLDEST..NEWEST.
    """
    core = text.strip().removeprefix("v").split("-", 1)[0]
    parts = core.split(".")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Kubernetes version: {text!r} (expected e.g. 1.34 or v1.34.3)")
    version = (int(parts[0]), int(parts[1]))
    if not OLDEST <= version <= NEWEST:
        raise ValueError(
            f"Kubernetes {version[0]}.{version[1]} is not supported: this tool checks "
            f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"
        )
    return version
