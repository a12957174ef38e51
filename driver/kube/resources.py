"""The kinds of object this project reads and writes, each once: where the API server serves it
and what RBAC calls it, so a call's URL and a 403's advice can never disagree.

A :class:`Resource` is pure data; :class:`driver.kube.rest.Client` takes one for every object
call (``client.get(NODES, name)``). Paths that are no object's (``/version``, a discovery
document) stay plain strings.
"""

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    """One resource of the API: ``group`` "" for the core group."""

    group: str
    version: str
    plural: str
    namespaced: bool

    def path(self, name: str = "", *, namespace: str = "", subresource: str = "") -> str:
        """The URL path of the collection (in ``namespace``, or across all of them), or of
        the object ``name`` (and its ``subresource``); names are quoted."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if name and self.namespaced and not namespace:
            raise ValueError(f"{self.plural} {name!r}: a namespaced object needs its namespace")
        if namespace:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are not namespaced")
            root += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{root}/{self.plural}"
        if name:
            path += f"/{quote(name, safe='')}"
        elif subresource:
            raise ValueError("a subresource belongs to a named object")
        return f"{path}/{subresource}" if subresource else path

    def rbac(self, subresource: str = "") -> str:
        """What a ClusterRole grants for it: ``resourceslices.resource.k8s.io``, ``nodes``,
        ``resourceclaims.resource.k8s.io/status`` (RBAC's ``resources`` entry, then its group)."""
        name = f"{self.plural}.{self.group}" if self.group else self.plural
        return f"{name}/{subresource}" if subresource else name


NODES = Resource("", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
PODS = Resource("", "v1", "pods", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", namespaced=True)
DAEMON_SETS = Resource("apps", "v1", "daemonsets", namespaced=True)
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", namespaced=True)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True
)
