"""What ``gpu-dra validate`` reports: a rule's finding inside one object, and the problem it
becomes once the file and the object are known."""

from dataclasses import dataclass
from enum import Enum


class Severity(Enum):
    ERROR = "error"  # the API server rejects the object, or it can never allocate
    WARNING = "warning"  # accepted, but not what the author asked for (a gated field is dropped)


class Check(Enum):
    """Who would stop the object, which is what tells a test which oracle holds a finding."""

    API = "api"  # the API server refuses it on create (tests/e2e/test_validate_oracle.py)
    # It names a DeviceClass, claim or template that no file given, the chart nor the
    # cluster defines: accepted, and the pod stays pending.
    REFERENCE = "reference"
    # Against what the driver publishes: an attribute or capacity it never publishes.
    # Accepted, never allocated.
    DEVICES = "devices"
    # Against the devices every EKS instance type the driver knows publishes: a request no
    # device of any of them satisfies. Accepted, and pending on those nodes; other hardware
    # may have one (--defined-elsewhere makes it a warning).
    HARDWARE = "hardware"
    # Our opaque config: the plugin refuses it at prepare (and the chart's admission policy
    # on create, when it is installed).
    PLUGIN = "plugin"
    # A ComputeDomain NVIDIA's controller cannot act on: accepted, and it never gets its
    # channel template (so its workload pods stay pending).
    CONTROLLER = "controller"


@dataclass(frozen=True, slots=True)
class Finding:
    """What a rule found, at a field path inside the object it checked."""

    path: str
    message: str
    severity: Severity = Severity.ERROR
    check: Check = Check.API


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    obj: str  # "<kind>/<name>", or "document <n>" when the document has neither
    path: (
        str  # Kubernetes field path, e.g. "spec.devices.requests[0].name"; "" for the whole object
    )
    message: str
    severity: Severity = Severity.ERROR
    check: Check = Check.API

    def __str__(self) -> str:
        path = self.path or "(object)"
        return f"{self.file}: {self.obj}: {path}: {self.severity.value}: {self.message}"
