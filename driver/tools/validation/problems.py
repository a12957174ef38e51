"""What ``gpu-dra validate`` reports: a rule's finding inside one object, and the problem it
becomes once the file and the object are known."""

from dataclasses import dataclass
from enum import Enum


class Severity(Enum):
    ERROR = "error"  # the API server rejects the object, or it can never allocate
    WARNING = "warning"  # accepted, but not what the author asked for (a gated field is dropped)


@dataclass(frozen=True, slots=True)
class Finding:
    """What a rule found, at a field path inside the object it checked."""

    path: str
    message: str
    severity: Severity = Severity.ERROR


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    obj: str  # "<kind>/<name>", or "document <n>" when the document has neither
    path: (
        str  # Kubernetes field path, e.g. "spec.devices.requests[0].name"; "" for the whole object
    )
    message: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        path = self.path or "(object)"
        return f"{self.file}: {self.obj}: {path}: {self.severity.value}: {self.message}"
