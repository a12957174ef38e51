"""Structured-parameters allocation of one claim, with the scheduler's semantics, explained.

Pure core (no I/O): ``explain_claim`` tries a ResourceClaim (or template) on
every node the ResourceSlices name and says, per node, which devices it gets or
exactly why not; ``explain_class`` lists the devices a DeviceClass selects.
``tools.allocation.inputs`` loads the objects from files or the API server.
"""

from tools.allocation.allocator import (
    allocated_devices,
    claim_ref,
    explain_claim,
    explain_class,
)
from tools.allocation.model import (
    ClaimRef,
    ClassListing,
    DeviceResult,
    DeviceVerdict,
    Explanation,
    NodeExplanation,
)
from tools.allocation.pools import Cluster
from tools.allocation.search import DEFAULT_BUDGET

__all__ = [
    "DEFAULT_BUDGET",
    "ClaimRef",
    "ClassListing",
    "Cluster",
    "DeviceResult",
    "DeviceVerdict",
    "Explanation",
    "NodeExplanation",
    "allocated_devices",
    "claim_ref",
    "explain_claim",
    "explain_class",
]
