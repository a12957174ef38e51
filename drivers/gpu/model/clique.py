"""The node's NVLink clique ID from its GPUs' fabric info: ``<clusterUUID>.<cliqueId>``.

NVIDIA's rule (``nvlib.go``): every GPU of the node that reports a fabric must agree, else
the node's state is an error; none reporting one (fabric not supported, not completed, or the
all-zero cluster UUID) means no clique, "". Discovery reads each GPU's fabric info
(``drivers.gpu.model.discovery``); one difference from NVIDIA's strict mode: a fabric still
``IN_PROGRESS`` reads as no clique here (discovery's reading), where NVIDIA refuses to start.

The GPU node process reads it for the ComputeDomain driver it hosts, which gets it as plain
data (``kubeletplugin.cohost.NodeFacts``).
"""

from driver.common.errors import PermanentError
from drivers.gpu.model.inventory import Inventory


class CliqueError(PermanentError):
    """The node's GPUs disagree on their fabric: no clique can be named."""


def clique_id(inventory: Inventory) -> str:
    found = sorted(
        {
            f"{gpu.fabric_cluster_uuid}.{gpu.fabric_clique_id}"
            for gpu in inventory.gpus
            if gpu.fabric_cluster_uuid is not None and gpu.fabric_clique_id is not None
        }
    )
    if len(found) > 1:
        raise CliqueError(f"the node's GPUs report different NVLink cliques: {', '.join(found)}")
    return found[0] if found else ""
