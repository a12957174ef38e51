"""``gpu-dra validate``: check DeviceClass, ResourceClaim, ResourceClaimTemplate and
ComputeDomain manifests offline, against the API schema (the chart's CRDs for ComputeDomain),
the rules the schema lacks, Kubernetes CEL and the feature gates of one Kubernetes version."""

from tools.validation.gates import NEWEST, OLDEST, parse_version
from tools.validation.manifests import (
    Report,
    chart_device_classes,
    validate_report,
    validate_sources,
)
from tools.validation.problems import Check, Problem, Severity

__all__ = [
    "NEWEST",
    "OLDEST",
    "Check",
    "Problem",
    "Report",
    "Severity",
    "chart_device_classes",
    "parse_version",
    "validate_report",
    "validate_sources",
]
