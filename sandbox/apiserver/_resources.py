"""The resource types the local API server serves, with the facts each handler needs."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    # Whether metadata.generation tracks spec changes for this type.
    generation: bool = True
    # Fields a field selector may name besides metadata.name / metadata.namespace.
    selectable: tuple[str, ...] = ()
    # Whether a PUT without metadata.resourceVersion is accepted (AllowUnconditionalUpdate).
    unconditional_update: bool = True
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``resourceslices.resource.k8s.io``, or just ``pods`` in the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``ResourceSlice.resource.k8s.io``, as 422 messages name the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def log_name(self) -> str:
        """``resource.k8s.io/resourceslices`` (``pods`` in the core group) for the request log."""
        return f"{self.group}/{self.plural}" if self.group else self.plural


RESOURCE_GROUP = "resource.k8s.io"
NVIDIA_GROUP = "resource.nvidia.com"

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        ("status",),
        generation=False,
        selectable=("status.phase",),
        short_names=("ns",),
    ),
    ResourceType(
        "",
        "v1",
        "nodes",
        "Node",
        False,
        ("status",),
        generation=False,
        selectable=("spec.unschedulable",),
        short_names=("no",),
    ),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        ("status",),
        selectable=(
            "spec.nodeName",
            "status.phase",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
        ),
        short_names=("po",),
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, generation=False),
    ResourceType(
        RESOURCE_GROUP,
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        selectable=("spec.nodeName", "spec.driver"),
    ),
    ResourceType(RESOURCE_GROUP, "v1", "resourceclaims", "ResourceClaim", True, ("status",)),
    ResourceType(RESOURCE_GROUP, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
    ResourceType(RESOURCE_GROUP, "v1", "deviceclasses", "DeviceClass", False),
    # What the ComputeDomain controller makes and watches. The custom resources are served
    # without their CRD's schema (the local server validates only built-in kinds).
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, ("status",), short_names=("ds",)),
    ResourceType(NVIDIA_GROUP, "v1beta1", "computedomains", "ComputeDomain", True, ("status",)),
    ResourceType(NVIDIA_GROUP, "v1beta1", "computedomaincliques", "ComputeDomainClique", True),
)

BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in RESOURCES
}
BY_KIND: dict[tuple[str, str], ResourceType] = {(r.api_version, r.kind): r for r in RESOURCES}
