"""The table of resources: each URL and RBAC name as the API server and a ClusterRole spell it."""

import pytest

from driver.kube.resources import NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource
from drivers.computedomain import names


def test_paths_of_core_and_group_resources() -> None:
    assert NODES.path() == "/api/v1/nodes"
    assert NODES.path("node-a") == "/api/v1/nodes/node-a"
    assert PODS.path() == "/api/v1/pods"  # every namespace's
    assert PODS.path(namespace="kube-system") == "/api/v1/namespaces/kube-system/pods"
    assert RESOURCE_SLICES.path("s") == "/apis/resource.k8s.io/v1/resourceslices/s"
    assert (
        RESOURCE_CLAIMS.path("c", namespace="ns", subresource="status")
        == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    )
    assert (
        names.CLIQUES_API.path("x", namespace="d")
        == "/apis/resource.nvidia.com/v1beta1/namespaces/d/computedomaincliques/x"
    )


def test_names_are_quoted_so_a_name_cannot_reach_another_path() -> None:
    assert NODES.path("a/../b") == "/api/v1/nodes/a%2F..%2Fb"
    assert PODS.path("p", namespace="n s") == "/api/v1/namespaces/n%20s/pods/p"


def test_rbac_names_as_a_cluster_role_grants_them() -> None:
    assert NODES.rbac() == "nodes"
    assert RESOURCE_SLICES.rbac() == "resourceslices.resource.k8s.io"
    assert RESOURCE_CLAIMS.rbac("status") == "resourceclaims.resource.k8s.io/status"


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        (NODES, {"namespace": "ns"}, "not namespaced"),
        (PODS, {"name": "p"}, "needs its namespace"),
        (NODES, {"subresource": "status"}, "belongs to a named object"),
    ],
)
def test_a_path_that_cannot_exist_is_a_programming_error(
    kind: Resource, kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        kind.path(**kwargs)
