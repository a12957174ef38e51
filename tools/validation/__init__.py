"""``gpu-dra validate``: check DeviceClass, ResourceClaim, ResourceClaimTemplate and
ComputeDomain manifests offline, against the API schema (the chart's CRDs for ComputeDomain),
the rules the schema lacks, Kubernetes CEL and the feature gates of one Kubernetes version."""

from tools.validation.gates import NEWEST, OLDEST, parse_version
from tools.validation.manifests import validate_sources
from tools.validation.problems import Check, Problem, Severity

__all__ = ["NEWEST", "OLDEST", "Check", "Problem", "Severity", "parse_version", "validate_sources"]
