"""The node ResourceSlice controller: publishes what discovery finds, nothing else.

``plan`` is the pure core (upstream's pool-generation rules, semantic comparison);
``SliceController`` is the asyncio shell that lists, watches and writes.
"""

from driver.kube.lease import LEASE_VERBS
from driver.slices.controller import (
    ApiVersionMissingError,
    NodeNotFoundError,
    PublishStats,
    SliceController,
)
from driver.slices.plan import InvalidPoolError, Plan, plan

__all__ = [
    "LEASE_VERBS",
    "ApiVersionMissingError",
    "InvalidPoolError",
    "NodeNotFoundError",
    "Plan",
    "PublishStats",
    "SliceController",
    "plan",
]
