"""What the ComputeDomain node driver asks of the API server: the domain of a claim, the
node's domain label, and whether this node's daemon is ready in the domain.

NVIDIA's plugin (``computedomain.go``): a ComputeDomain is found by UID (the claim's config
names only its UID); the label ``resource.nvidia.com/computeDomain=<cdUID>`` on the Node is
what brings the domain's DaemonSet pod here; the node is ready in the domain when its daemon
is Ready in the clique ``<cdUID>.<cliqueID>`` (driver namespace), or in the domain's
``status.nodes``. Every call goes through the one client (``driver.kube.rest``); its errors
keep their class (a 404 or 403 is permanent, the rest retryable).
"""

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.common.errors import PermanentError, RetryableError
from driver.common.limits import label_value_error
from driver.kube.backoff import Backoff
from driver.kube.resources import NODES
from driver.kube.rest import Client, ConflictError, NotFoundError
from drivers.computedomain import names

_FOUND_MAX = 256


class DomainNotFoundError(RetryableError):
    """No ComputeDomain has the claim's domain UID (yet, or any longer)."""


class WrongNamespaceError(PermanentError):
    """A claim may use only a ComputeDomain of its own namespace."""


class ForeignDaemonClaimError(PermanentError):
    """A daemon claim outside the driver's namespace: only the controller's daemon claim
    template (there) may take a node's IMEX daemon slot."""


class LabelTakenError(RetryableError):
    """The node carries another domain's label: that domain's workload is still here."""


class NotReadyError(RetryableError):
    """This node's daemon is not Ready in the domain yet."""


@dataclass(frozen=True, slots=True)
class Domain:
    uid: str
    namespace: str
    name: str


def _ready_in(entries: Any, node: str, key: str) -> bool:
    return any(
        isinstance(e, Mapping) and e.get(key) == node and e.get("status") == names.READY
        for e in entries or ()
    )


class Domains:
    """The calls, for node ``node_name``, with cliques in ``namespace`` (the driver's)."""

    def __init__(self, client: Client, *, node_name: str, namespace: str) -> None:
        self._client = client
        self._node = node_name
        self._namespace = namespace
        # Domains found, by UID (a UID's name and namespace never change): what a claim's
        # status entry names without a list per write.
        self._found: dict[str, Domain] = {}

    @property
    def namespace(self) -> str:
        """The driver's namespace: its cliques, and the daemon claims of every domain."""
        return self._namespace

    async def find(self, uid: str, namespace: str = "") -> Domain:
        """The ComputeDomain of ``uid`` in ``namespace``, or in any namespace for ""; a list,
        since the claim names it by UID only."""
        items = await self._client.list_all(names.COMPUTE_DOMAINS_API, namespace=namespace)
        for item in items:
            meta = item.get("metadata") or {}
            if meta.get("uid") == uid:
                domain = Domain(uid, str(meta.get("namespace", "")), str(meta.get("name", "")))
                if len(self._found) >= _FOUND_MAX:  # a node sees few domains at a time
                    self._found.clear()
                self._found[uid] = domain
                return domain
        raise DomainNotFoundError(f"ComputeDomain not found: {uid}")

    async def named(self, uid: str, namespace: str = "") -> Domain:
        """The domain of ``uid`` (in ``namespace``, or any for ""), as found before if it was:
        the prepare found it, and its status entry names it."""
        known = self._found.get(uid)
        if known is not None and namespace in ("", known.namespace):
            return known
        return await self.find(uid, namespace)

    async def check_namespace(self, uid: str, claim_namespace: str) -> Domain:
        """The claim's domain, which must be in the claim's namespace: listed there (a few
        objects, not the cluster's every domain at each prepare), and across the cluster only
        when it is not there, to tell a domain elsewhere from none."""
        with contextlib.suppress(DomainNotFoundError):
            return await self.find(uid, claim_namespace)
        domain = await self.find(uid)
        if domain.namespace != claim_namespace:
            raise WrongNamespaceError(
                f"the ResourceClaim's namespace ({claim_namespace}) is different than the "
                f"ComputeDomain's namespace ({domain.namespace})"
            )
        return domain  # created in the claim's namespace between the two lists

    async def add_label(self, uid: str) -> None:
        """Label the node with the domain; another domain's label is an error, the same one
        nothing. The patch names the resourceVersion read, so two writers never both win."""
        for _ in range(5):
            node = await self._client.get(NODES, self._node)
            meta = node.get("metadata") or {}
            have = (meta.get("labels") or {}).get(names.COMPUTE_DOMAIN_LABEL)
            if have == uid:
                return
            if have:
                raise LabelTakenError(
                    f"node {self._node}: label {names.COMPUTE_DOMAIN_LABEL} already exists for a "
                    f"different ComputeDomain ({have})"
                )
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "labels": {names.COMPUTE_DOMAIN_LABEL: uid},
                }
            }
            try:
                await self._patch_node(patch)
                return
            except ConflictError:
                continue  # written meanwhile: read it again
        raise LabelTakenError(f"node {self._node}: the label kept changing under the write")

    async def remove_label(self, uid: str) -> bool:
        """Remove the node's domain label only if it names ``uid`` (NVIDIA's #518: never
        another domain's). True when it was removed; a node that is gone has none."""
        for _ in range(5):
            try:
                node = await self._client.get(NODES, self._node)
            except NotFoundError:
                return False
            meta = node.get("metadata") or {}
            if (meta.get("labels") or {}).get(names.COMPUTE_DOMAIN_LABEL) != uid:
                return False
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "labels": {names.COMPUTE_DOMAIN_LABEL: None},
                }
            }
            try:
                await self._patch_node(patch)
                return True
            except ConflictError:
                continue
        raise RetryableError(f"node {self._node}: the label kept changing under the removal")

    async def set_clique_label(self, clique_id: str) -> bool:
        """The node's ``nvidia.com/gpu.clique`` label to ``clique_id``, removed for "" (no
        clique). Read first, so a node at rest gets no write; True when one was made. A merge
        patch without a resourceVersion: the key is this plugin's alone (GFD, where it runs,
        writes the same value by the same rule)."""
        node = await self._client.get(NODES, self._node)
        have = ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_CLIQUE_NODE_LABEL)
        if (have or "") == clique_id:
            return False
        if why := label_value_error(clique_id):
            raise PermanentError(
                f"clique ID {clique_id!r} cannot be the node label "
                f"{names.GPU_CLIQUE_NODE_LABEL}: {why}"
            )
        value = clique_id or None
        await self._patch_node({"metadata": {"labels": {names.GPU_CLIQUE_NODE_LABEL: value}}})
        return True

    async def _patch_node(self, patch: dict[str, Any]) -> None:
        await self._client.patch(NODES, self._node, patch)

    async def node_ready(self, domain: Domain, clique_id: str) -> bool:
        """This node's daemon is Ready in its clique of the domain, or in the domain's
        status (a node without a clique is listed there only)."""
        if clique_id:
            name = names.clique_name(domain.uid, clique_id)
            try:
                clique = await self._client.get(names.CLIQUES_API, name, namespace=self._namespace)
                if _ready_in(clique.get("daemons"), self._node, "nodeName"):
                    return True
            except NotFoundError:
                pass
        try:
            obj = await self._client.get(
                names.COMPUTE_DOMAINS_API, domain.name, namespace=domain.namespace
            )
        except NotFoundError as exc:
            raise DomainNotFoundError(f"ComputeDomain not found: {domain.uid}") from exc
        return _ready_in((obj.get("status") or {}).get("nodes"), self._node, "name")

    async def wait_ready(
        self, domain: Domain, clique_id: str, *, within: float, backoff: Backoff
    ) -> None:
        """Until this node is ready in ``domain``, retried with ``backoff`` for ``within``
        seconds (inside the kubelet's 45 s); then NotReadyError. Not asyncio.timeout: a poll
        in flight is not cut off, the wait ends between two."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not await self.node_ready(domain, clique_id):
            delay = backoff.next_delay()
            if loop.time() + delay > deadline:
                raise NotReadyError(
                    f"current node {self._node} not ready in ComputeDomain {domain.uid} "
                    f"after {within:g}s (its IMEX daemon pod is starting or not Ready)"
                )
            await asyncio.sleep(delay)
