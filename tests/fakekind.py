"""A second device kind for the seam test: a fake accelerator with one attribute.

Its preparation has a side effect (a marker file, standing in for a MIG instance or
an MPS daemon), so it also exercises the per-claim record written before one.
Nothing outside this module and its registration in ``drivers.gpu.kinds.KIND_TYPES``
knows it exists.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.devicekind import NodeDevice, PreparedClaim
from drivers.gpu.kinds import GpuKindContext, HealthTarget
from drivers.gpu.model.inventory import Inventory

NAME = "fake-accelerator"


class FakeAccelerator:
    name = NAME
    identity_keys = ("serial",)

    def __init__(self, side_effects: Path) -> None:
        self.side_effects = side_effects  # where "prepare" leaves its mark

    def devices(self, inventory: Inventory, *, node_name: str) -> Sequence[NodeDevice]:
        return [
            NodeDevice(
                kind=NAME,
                name="fake-0",
                published={"name": "fake-0", "attributes": {"fakeAttr": {"string": "shiny"}}},
                edits={"env": ["FAKE_ACCELERATOR=fake-0"]},
                identity={"serial": f"{node_name}-fake-0"},
            )
        ]

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        return None  # no NVML events: not a GPU

    def physical_gpu(self, identity: Mapping[str, str]) -> str:
        return ""  # not a GPU

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        return {}

    def attach(self, context: GpuKindContext) -> None:
        pass  # its marks go where the test says

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        return True

    def mark(self, claim: PreparedClaim) -> Path:
        return self.side_effects / claim.uid

    def prepare(self, claim: PreparedClaim) -> None:
        self.side_effects.mkdir(parents=True, exist_ok=True)
        self.mark(claim).write_text("prepared")

    def unprepare(self, claim: PreparedClaim) -> None:
        self.mark(claim).unlink(missing_ok=True)

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)

    def watch(self) -> None:
        pass  # nothing of it can die
