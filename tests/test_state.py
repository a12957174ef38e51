"""DeviceState against the real local API server and real files: prepare, unprepare, recovery."""

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from driver.kube.session import Session
from driver.nvml.simulated import SimulatedNode
from drivers.gpu import flavor
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds import GpuNode, discovered
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from kubeletplugin import cdi, checkpoint
from kubeletplugin.checkpoint import ForeignCheckpointError, _checksum
from kubeletplugin.containertoolkit import ToolkitError
from kubeletplugin.devices import NodeDevices
from kubeletplugin.records import Records
from kubeletplugin.state import ClaimRef, DeviceState, ForeignStateError, RecordError, StateConfig
from sandbox.apiserver import LocalApiServer
from tests.test_cdi import assert_valid_spec

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
GPU_CONFIG = "resource.nvidia.com/v1beta1"

_inventories: dict[str, Inventory] = {}


def _inventory(profile: str, tmp_root: Path) -> Inventory:
    # Discovery is deterministic per profile and node name; share it across tests.
    if profile not in _inventories:
        node = SimulatedNode(profile, NODE, tmp_root / f"sysfs-{profile}")
        _inventories[profile] = discover(node.nvml, sysfs_root=node.sysfs_root)
    return _inventories[profile]


def devices_of(inventory: Inventory, config: StateConfig) -> NodeDevices[Inventory]:
    """The node's devices of the claim state's own kinds: one table, as in the node process."""
    return discovered(inventory, node_name=NODE, kinds=config.flavor.kinds)


def reservations(config: StateConfig) -> dict[str, str]:
    """device -> uid of the claim it is reserved for."""
    records = Records(config.plugin_dir, config.cdi_root, boot_id="", flavor=GPU)
    return {name: target.split(":")[0] for name, target in records.reservations().items()}


def prepared_claims(config: StateConfig) -> dict[str, Any]:
    """uid -> what the claim's spec (its record) says was prepared."""
    out = {}
    for path in sorted(config.cdi_root.glob("*.json")):
        claim = cdi.claim_from_spec(json.loads(path.read_text()), GPU)
        out[claim.uid] = claim
    return out


@dataclass
class Node:
    """One simulated node's plugin state, reopened at will (a plugin restart)."""

    api: Session
    config: StateConfig
    inventory: Inventory
    state: DeviceState

    @property
    def checkpoint_path(self) -> Path:
        return self.config.plugin_dir / "checkpoint.json"

    def reservations(self) -> dict[str, str]:
        return reservations(self.config)

    def prepared(self) -> dict[str, Any]:
        return prepared_claims(self.config)

    def spec_path(self, uid: str) -> Path:
        return cdi.spec_path(self.config.cdi_root, uid, GPU)

    def spec(self, uid: str) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(self.spec_path(uid).read_text())
        return spec

    async def restart(self) -> DeviceState:
        self.state = await DeviceState.open(
            self.config, self.api, devices_of(self.inventory, self.config)
        )
        return self.state

    async def claim(
        self,
        name: str,
        devices: Sequence[str] = ("gpu-0",),
        *,
        results: Sequence[dict[str, Any]] | None = None,
        config: Sequence[dict[str, Any]] = (),
        allocate: bool = True,
        admin: bool = False,
    ) -> ClaimRef:
        return await create_claim(
            self.api, name, devices, results=results, config=config, allocate=allocate, admin=admin
        )


async def create_claim(
    api: Session,
    name: str,
    devices: Sequence[str],
    *,
    results: Sequence[dict[str, Any]] | None = None,
    config: Sequence[dict[str, Any]] = (),
    allocate: bool = True,
    admin: bool = False,
    namespace: str = "default",
) -> ClaimRef:
    """A ResourceClaim, allocated as the scheduler writes it (unless ``allocate`` is False)."""
    resource = k8s.ResourceV1Api(api)
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": max(len(devices), 1)}
    if admin:
        exactly["adminAccess"] = True
    body: Any = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    created: Any = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        await resource.create_namespaced_resource_claim(namespace, body)
    )
    ref = ClaimRef(uid=created["metadata"]["uid"], namespace=namespace, name=name)
    if not allocate:
        return ref
    if results is None:
        results = [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d}
            | ({"adminAccess": True} if admin else {})
            for d in devices
        ]
    devices_alloc: dict[str, Any] = {"results": list(results)}
    if config:
        devices_alloc["config"] = list(config)
    created["status"] = {
        "allocation": {
            "devices": devices_alloc,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    await resource.replace_namespaced_resource_claim_status(name, namespace, created)
    return ref


async def delete_claim(api: Session, ref: ClaimRef) -> None:
    await k8s.ResourceV1Api(api).delete_namespaced_resource_claim(ref.name, ref.namespace)


# What only the GPU kinds are given (GpuNode), beside the driver roots both take.
_KINDS_ONLY = (
    "nvidia_smi",
    "mps_control",
    "nvml_library",
    "mig_maker",
    "mps_pods",
    "consumable_capacity",
)
_ROOTS = ("nvidia_driver_root", "container_driver_root")


def _config(tmp_path: Path, *, nvml_mode: str = "simulated", **overrides: Any) -> StateConfig:
    """A GPU driver's claim state config; ``overrides`` of StateConfig, or of the GPU
    kinds' node (``GpuNode``: its driver roots also go to the host's toolkit, as the node
    process passes them)."""
    kinds = {k: overrides.pop(k) for k in _KINDS_ONLY if k in overrides}
    roots = {k: overrides.pop(k) for k in _ROOTS if k in overrides}
    kinds |= roots
    overrides.setdefault("flavor", flavor.gpu(GpuNode(**kinds)))  # a table of its own
    overrides.setdefault(
        "host",
        flavor.toolkit(
            roots.get("container_driver_root", Path("/driver-root")),
            roots.get("nvidia_driver_root", Path("/")),
            simulated=nvml_mode == "simulated",
        ),
    )
    boot_id = tmp_path / "boot_id"
    if not boot_id.exists():
        boot_id.write_text("boot-1\n")
    values: dict[str, Any] = {
        "plugin_dir": tmp_path / "plugins" / DRIVER,
        "cdi_root": tmp_path / "cdi",
        "driver_name": DRIVER,
        "node_name": NODE,
        "boot_id_path": boot_id,
    }
    values.update(overrides)
    return StateConfig(**values)


@pytest.fixture
async def node(api_client: Session, tmp_path: Path) -> Node:
    api = api_client
    config = _config(tmp_path)
    inventory = _inventory("p5.48xlarge", tmp_path)
    return Node(
        api, config, inventory, await DeviceState.open(config, api, devices_of(inventory, config))
    )


# ---- prepare / unprepare ------------------------------------------------------------------


async def test_prepare_returns_devices_and_writes_a_valid_spec(node: Node) -> None:
    ref = await node.claim("two", ["gpu-3", "gpu-1"])
    result = (await node.state.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert [(d.device_name, d.pool_name, d.request_names) for d in result.devices] == [
        ("gpu-3", NODE, ("gpu",)),
        ("gpu-1", NODE, ("gpu",)),
    ]
    assert result.devices[0].cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={ref.uid}-gpu-3",)
    spec = node.spec(ref.uid)
    assert_valid_spec(spec)
    gpus = node.inventory.by_device_name()
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": f"/dev/nvidia{gpus['gpu-1'].minor}"}
    ]
    assert (
        f"GPU_DRA_VISIBLE_GPU_UUIDS={gpus['gpu-1'].uuid},{gpus['gpu-3'].uuid}"
        in (spec["containerEdits"]["env"])
    )
    record = node.prepared()[ref.uid]
    assert {dict(d.identity)["gpu-uuid"] for d in record.devices} == {
        gpus["gpu-1"].uuid,
        gpus["gpu-3"].uuid,
    }
    assert node.reservations() == {"gpu-1": ref.uid, "gpu-3": ref.uid}


async def test_prepare_is_idempotent_also_after_the_spec_was_deleted(node: Node) -> None:
    ref = await node.claim("idem", ["gpu-2"])
    first = await node.state.prepare([ref])
    assert first[ref.uid].error == ""
    assert await node.state.prepare([ref]) == first
    node.spec_path(ref.uid).unlink()
    assert await node.state.prepare([ref]) == first
    assert_valid_spec(node.spec(ref.uid))
    assert await (await node.restart()).prepare([ref]) == first


async def test_unprepare_removes_spec_and_entry_and_unknown_claims_are_fine(
    node: Node, apiserver: LocalApiServer
) -> None:
    ref = await node.claim("gone", ["gpu-4"])
    assert (await node.state.prepare([ref]))[ref.uid].error == ""
    unknown = ClaimRef(uid="00000000-0000-0000-0000-000000000000", namespace="x", name="y")
    await delete_claim(node.api, ref)
    requests = len(apiserver.requests)
    assert await node.state.unprepare([ref, unknown]) == {ref.uid: "", unknown.uid: ""}
    assert len(apiserver.requests) == requests  # from the node's records alone
    assert not node.spec_path(ref.uid).exists()
    assert ref.uid not in node.reservations().values()
    assert await node.state.unprepare([ref]) == {ref.uid: ""}


async def test_device_prepared_for_another_claim_is_refused(node: Node) -> None:
    first = await node.claim("first", ["gpu-0"])
    second = await node.claim("second", ["gpu-0"])
    admin = await node.claim("monitor", ["gpu-0"], admin=True)
    assert (await node.state.prepare([first]))[first.uid].error == ""
    results = await node.state.prepare([second, admin])
    assert "device gpu-0 is already prepared for claim default/first" in results[second.uid].error
    assert results[second.uid].devices == ()
    assert not node.spec_path(second.uid).exists()
    assert results[admin.uid].error == ""  # adminAccess does not need the device to itself
    # Once the first claim is gone, the device is free again.
    assert await node.state.unprepare([first]) == {first.uid: ""}
    assert (await node.state.prepare([second]))[second.uid].error == ""


async def test_each_claim_gets_its_own_error(node: Node) -> None:
    good = await node.claim("good", ["gpu-5"])
    pending = await node.claim("pending", allocate=False)
    replaced = await node.claim("replaced", ["gpu-6"])
    stale = ClaimRef(
        uid="11111111-1111-1111-1111-111111111111", namespace="default", name="replaced"
    )
    missing = ClaimRef(uid="22222222-2222-2222-2222-222222222222", namespace="default", name="nope")
    phantom = await node.claim("phantom", ["gpu-99"])
    results = await node.state.prepare([good, pending, stale, missing, phantom])
    assert "device gpu-99 (pool node-a) does not exist on node node-a" in results[phantom.uid].error
    assert results[good.uid].error == ""
    assert [d.device_name for d in results[good.uid].devices] == ["gpu-5"]
    assert results[pending.uid].error == "claim default/pending not allocated"
    assert "claim default/replaced got replaced" in results[stale.uid].error
    assert "retrieve claim default/nope: 404" in results[missing.uid].error
    assert (await node.state.prepare([replaced]))[replaced.uid].error == ""


async def test_results_for_other_drivers_and_nodes_are_ignored(node: Node) -> None:
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"},
        {"request": "gpu", "driver": "other.example.com", "pool": NODE, "device": "gpu-2"},
        {"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-3"},
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"},
    ]
    ref = await node.claim("mixed", results=results)
    result = (await node.state.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == ["gpu-1"]
    assert [d["name"] for d in node.spec(ref.uid)["devices"]] == [f"{ref.uid}-gpu-1"]


async def test_a_claim_allocated_on_another_node_is_an_error(node: Node) -> None:
    """Issue 13, defect 9: it was recorded as prepared with no devices (empty success)."""
    results = [{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-3"}]
    ref = await node.claim("elsewhere", results=results)
    result = (await node.state.prepare([ref]))[ref.uid]
    assert result.error == (
        f"claim default/elsewhere has no device of driver {DRIVER} in pool {NODE}: "
        "it is allocated for another node"
    )
    assert result.devices == ()
    assert not node.spec_path(ref.uid).exists()


def _opaque(
    parameters: dict[str, Any],
    *,
    source: str = "FromClaim",
    driver: str = DRIVER,
    requests: Sequence[str] = (),
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": driver, "parameters": parameters},
    }
    if requests:
        entry["requests"] = list(requests)
    return entry


async def test_opaque_config_errors_are_per_claim_and_name_the_field(node: Node) -> None:
    good_config = [
        _opaque({"apiVersion": GPU_CONFIG, "kind": "GpuConfig"}, source="FromClass"),
        _opaque({"anything": ["goes"]}, driver="other.example.com"),
    ]
    good = await node.claim("configured", ["gpu-1"], config=good_config)
    typo = await node.claim(
        "typo",
        ["gpu-2"],
        config=[
            _opaque({"apiVersion": GPU_CONFIG, "kind": "GpuConfig", "sharng": {}}, requests=["gpu"])
        ],
    )
    shared = await node.claim(
        "shared",
        ["gpu-3"],
        config=[
            _opaque(
                {
                    "apiVersion": GPU_CONFIG,
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "Fabric"},
                }
            )
        ],
    )
    results = await node.state.prepare([good, typo, shared])
    assert results[good.uid].error == ""
    assert 'field "sharng"' in results[typo.uid].error
    assert "opaque config #0 (from claim, requests gpu)" in results[typo.uid].error
    assert "unknown GPU sharing strategy Fabric" in results[shared.uid].error
    assert not node.spec_path(typo.uid).exists()


async def test_fifty_distinct_claims_prepare_concurrently(
    api_client: Session, tmp_path: Path
) -> None:
    api = api_client
    config = _config(tmp_path)
    inventory = _inventory("synthetic-200gpu", tmp_path)
    state = await DeviceState.open(config, api, devices_of(inventory, config))
    refs = await asyncio.gather(*(create_claim(api, f"c{i}", [f"gpu-{i}"]) for i in range(50)))
    results = await asyncio.gather(*(state.prepare([ref]) for ref in refs))
    for ref, result in zip(refs, results, strict=True):
        assert result[ref.uid].error == "", result[ref.uid].error
    assert set(prepared_claims(config)) == {ref.uid for ref in refs}
    assert reservations(config) == {f"gpu-{i}": ref.uid for i, ref in enumerate(refs)}
    specs = list(config.cdi_root.glob("*.json"))
    assert len(specs) == 50
    for path in specs:
        assert_valid_spec(json.loads(path.read_text()))
    errors = await state.unprepare(refs)
    assert set(errors.values()) == {""}
    assert list(config.cdi_root.iterdir()) == []
    assert reservations(config) == {}


async def test_ten_concurrent_prepares_of_one_claim_agree(node: Node) -> None:
    ref = await node.claim("busy", ["gpu-7"])
    results = await asyncio.gather(*(node.state.prepare([ref]) for _ in range(10)))
    assert all(r == results[0] for r in results)
    assert results[0][ref.uid].error == ""
    assert [p.name for p in node.config.cdi_root.iterdir()] == [node.spec_path(ref.uid).name]
    assert node.reservations() == {"gpu-7": ref.uid}


async def test_api_server_errors_are_per_claim_and_retryable(
    node: Node, apiserver: LocalApiServer
) -> None:
    flaky = await node.claim("flaky", ["gpu-1"])
    fine = await node.claim("fine", ["gpu-2"])
    apiserver.faults.fail("get", "resourceclaims", flaky.name, code=503, times=1)
    results = await node.state.prepare([flaky, fine])
    assert "retrieve claim default/flaky: 503" in results[flaky.uid].error
    assert results[fine.uid].error == ""
    assert not node.spec_path(flaky.uid).exists()
    assert (await node.state.prepare([flaky]))[flaky.uid].error == ""  # the kubelet's retry


async def test_failed_spec_write_is_rolled_back(node: Node) -> None:
    ref = await node.claim("unwritable", ["gpu-4"])
    # Works as root too: the CDI root is a file, so writing a spec in it fails.
    node.config.cdi_root.rmdir()
    node.config.cdi_root.write_text("in the way")
    result = (await node.state.prepare([ref]))[ref.uid]
    assert "writing node state failed" in result.error
    assert node.reservations() == {}  # reservation undone
    node.config.cdi_root.unlink()
    assert (await node.state.prepare([ref]))[ref.uid].error == ""


async def test_two_plugin_instances_never_hand_out_one_device_twice(
    node: Node, tmp_path: Path
) -> None:
    # A surge upgrade: old and new plugin pod share the node's directories.
    other_config = _config(tmp_path, pod_uid="new-pod")
    other = await DeviceState.open(other_config, node.api, devices_of(node.inventory, other_config))
    refs = [await node.claim(f"race-{i}", ["gpu-0"]) for i in range(6)]
    results = await asyncio.gather(
        *((node.state if i % 2 else other).prepare([ref]) for i, ref in enumerate(refs))
    )
    winners = [ref for ref, r in zip(refs, results, strict=True) if r[ref.uid].error == ""]
    assert len(winners) == 1
    assert node.reservations() == {"gpu-0": winners[0].uid}
    assert list(node.prepared()) == [winners[0].uid]
    # Either instance answers for the winner, and unprepares it.
    assert (await other.prepare(winners))[winners[0].uid].error == ""
    assert await node.state.unprepare(winners) == {winners[0].uid: ""}


async def test_log_lines_about_a_claim_carry_its_identity(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    ref = await node.claim("logged", ["gpu-3"])
    rival = await node.claim("rival-logged", ["gpu-3"])
    with caplog.at_level(logging.INFO, logger="kubeletplugin.state"):
        await node.state.prepare([ref, rival])
        await node.state.unprepare([ref])
    about = [r for r in caplog.records if "claim" in r.getMessage() or "prepare" in r.getMessage()]
    assert len(about) >= 3
    for record in about:
        assert {"claim_uid", "claim_namespace", "claim_name"} <= vars(record).keys()
    assert {vars(r)["claim_uid"] for r in about} == {ref.uid, rival.uid}


# ---- recovery -----------------------------------------------------------------------------


def _corrupt(path: Path) -> None:
    path.write_bytes(b"\x00garbage{")


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


@pytest.mark.parametrize("damage", [_corrupt, _truncate], ids=["corrupt", "truncated"])
async def test_damaged_record_keeps_the_claim_reserved_and_is_repaired(
    node: Node, damage: Any
) -> None:
    live = await node.claim("live", ["gpu-0"])
    rival = await node.claim("rival", ["gpu-0"])
    prepared = await node.state.prepare([live])
    damage(node.spec_path(live.uid))
    refused = (await node.state.prepare([rival]))[rival.uid]
    assert "device gpu-0 is already prepared for claim default/live" in refused.error
    assert await node.state.prepare([live]) == prepared
    assert_valid_spec(node.spec(live.uid))
    assert node.reservations() == {"gpu-0": live.uid}


@pytest.mark.parametrize("damage", [_corrupt, _truncate], ids=["corrupt", "truncated"])
async def test_damaged_record_of_this_boot_refuses_to_start_and_loses_nothing(
    node: Node, damage: Any
) -> None:
    live = await node.claim("live", ["gpu-0"])
    assert (await node.state.prepare([live]))[live.uid].error == ""
    spec = node.spec_path(live.uid)
    damage(spec)
    damaged = spec.read_bytes()
    with pytest.raises(RecordError, match="record of the current boot that this release cannot"):
        await node.restart()
    assert spec.read_bytes() == damaged  # refused, not read as "no claim"
    assert node.reservations() == {"gpu-0": live.uid}


@pytest.mark.parametrize(
    "spec",
    [
        {"annotations": {cdi.OWNER_ANNOTATION: cdi.OWNER, cdi.RECORD_VERSION: "9"}},
        {"annotations": {cdi.OWNER_ANNOTATION: cdi.OWNER}, "claims": {}},
    ],
    ids=["newer-version", "other-layout"],
)
async def test_record_of_this_boot_not_understood_is_refused(
    node: Node, spec: dict[str, Any]
) -> None:
    live = await node.claim("live", ["gpu-0"])
    assert (await node.state.prepare([live]))[live.uid].error == ""
    node.spec_path(live.uid).write_text(json.dumps(spec))
    with pytest.raises(RecordError, match=node.spec_path(live.uid).name):
        await node.restart()
    assert node.reservations() == {"gpu-0": live.uid}


async def test_a_device_recorded_for_two_claims_is_refused(node: Node) -> None:
    first = await node.claim("first", ["gpu-2"])
    second = await node.claim("second", ["gpu-3"])
    await node.state.prepare([first, second])
    # The spec of "second" names gpu-3; its reservation now names "first" (a record
    # edited by hand, or one of two releases that both think they hold it).
    link = node.config.plugin_dir / "devices" / "gpu-3"
    link.unlink()
    link.symlink_to(f"{first.uid}:default:first")
    with pytest.raises(RecordError, match=r"devices/gpu-3 is a record of the current boot") as err:
        await node.restart()
    assert "reserved for claim default/first" in str(err.value)
    assert "default/second" in str(err.value)
    # Nothing was changed: the person who looks finds what the plugin found.
    assert set(node.prepared()) == {first.uid, second.uid}
    assert node.reservations() == {"gpu-2": first.uid, "gpu-3": first.uid}


async def test_reboot_drops_prepared_claims(node: Node) -> None:
    before = await node.claim("before", ["gpu-1"])
    after = await node.claim("after", ["gpu-1"])
    assert (await node.state.prepare([before]))[before.uid].error == ""
    node.config.boot_id_path.write_text("boot-2\n")
    state = await node.restart()
    assert not node.spec_path(before.uid).exists()
    assert (node.config.plugin_dir / "boot_id").read_text() == "boot-2\n"
    assert node.reservations() == {}
    assert (await state.prepare([after]))[after.uid].error == ""


@pytest.mark.parametrize("damage", [_corrupt, _truncate], ids=["corrupt", "truncated"])
async def test_torn_record_of_an_earlier_boot_does_not_make_the_node_unready(
    node: Node, damage: Any
) -> None:
    """What a power loss can leave: a torn spec (a CDI root on disk rather than tmpfs)
    and a reservation of the boot that ended."""
    before = await node.claim("before", ["gpu-1"])
    after = await node.claim("after", ["gpu-1"])
    assert (await node.state.prepare([before]))[before.uid].error == ""
    spec = json.loads(node.spec_path(before.uid).read_text())
    assert spec["annotations"]["gpu-dra.io/boot-id"] == "boot-1"
    damage(node.spec_path(before.uid))
    node.config.boot_id_path.write_text("boot-2\n")
    state = await node.restart()
    assert not node.spec_path(before.uid).exists()
    assert node.reservations() == {}
    assert (await state.prepare([after]))[after.uid].error == ""


async def test_nvidia_driver_checkpoint_refuses_to_start(
    api_client: Session, tmp_path: Path
) -> None:
    api = api_client
    config = _config(tmp_path)
    config.plugin_dir.mkdir(parents=True)
    nvidia = {
        "checksum": 3264921913,
        "v1": {"preparedClaims": {}},
        "v2": {"checksum": 1, "preparedClaims": {}, "nodeBootID": "boot-1"},
    }
    (config.plugin_dir / "checkpoint.json").write_text(json.dumps(nvidia))
    with pytest.raises(ForeignCheckpointError, match="To migrate"):
        await DeviceState.open(config, api, devices_of(_inventory("p5.48xlarge", tmp_path), config))
    assert json.loads((config.plugin_dir / "checkpoint.json").read_text()) == nvidia


async def test_real_gpu_node_without_container_toolkit_refuses_to_start(
    api_client: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    config = _config(tmp_path, nvml_mode="system", container_driver_root=tmp_path / "host")
    with pytest.raises(ToolkitError, match="nvidia-ctk"):
        await DeviceState.open(
            config, api_client, devices_of(_inventory("p5.48xlarge", tmp_path), config)
        )


async def test_nvidia_driver_cdi_spec_refuses_to_start(api_client: Session, tmp_path: Path) -> None:
    api = api_client
    config = _config(tmp_path)
    config.cdi_root.mkdir(parents=True)
    foreign = config.cdi_root / "k8s.gpu.nvidia.com-claim_abc.yaml"
    foreign.write_text(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\n"
        "devices:\n- name: abc-gpu-0\n  containerEdits: {env: [A=1]}\n"
    )
    with pytest.raises(ForeignStateError, match="To migrate"):
        await DeviceState.open(config, api, devices_of(_inventory("p5.48xlarge", tmp_path), config))
    assert foreign.exists()


async def test_version_1_checkpoint_is_upgraded(node: Node) -> None:
    live = await node.claim("old", ["gpu-2"])
    rival = await node.claim("new", ["gpu-2"])
    prepared = await node.state.prepare([live])
    record = node.prepared()[live.uid]
    data = {
        "preparedClaims": {
            live.uid: {
                "namespace": "default",
                "name": "old",
                "devices": [
                    {
                        "requestNames": ["gpu"],
                        "poolName": NODE,
                        "deviceName": "gpu-2",
                        "gpuUUID": dict(record.devices[0].identity)["gpu-uuid"],
                        "cdiDeviceIDs": list(record.devices[0].cdi_device_ids),
                    }
                ],
            }
        }
    }
    node.checkpoint_path.write_text(
        json.dumps(
            {"kind": "GpuDraCheckpoint", "version": 1, "checksum": _checksum(data), "data": data}
        )
    )
    for name in node.reservations():  # a 0.1.0 node had none
        (node.config.plugin_dir / "devices" / name).unlink()
    state = await node.restart()
    assert checkpoint.is_marker(node.checkpoint_path.read_bytes())
    assert node.reservations() == {"gpu-2": live.uid}
    assert await state.prepare([live]) == prepared
    assert "already prepared" in (await state.prepare([rival]))[rival.uid].error


async def test_interrupted_prepare_is_rolled_back_and_redone(node: Node) -> None:
    ref = await node.claim("interrupted", ["gpu-3"])
    rival = await node.claim("rival", ["gpu-3"])
    prepared = await node.state.prepare([ref])
    # What a crash after the reservation, before the CDI write, leaves.
    node.spec_path(ref.uid).unlink()
    state = await node.restart()
    assert "already prepared" in (await state.prepare([rival]))[rival.uid].error  # still reserved
    assert await state.prepare([ref]) == prepared
    assert node.reservations() == {"gpu-3": ref.uid}
    assert_valid_spec(node.spec(ref.uid))


async def test_temp_files_of_a_killed_write_are_swept_at_startup(node: Node) -> None:
    kept = await node.claim("kept", ["gpu-4"])
    await node.state.prepare([kept])
    litter = [
        node.config.cdi_root / f".{node.spec_path(kept.uid).name}.0badc0de.tmp",
        node.config.plugin_dir / ".boot_id.0badc0de.tmp",
    ]
    for path in litter:
        path.write_text("half")
    unrelated = node.config.cdi_root / "vendor.example.com-thing.json"
    unrelated.write_text("{}")
    await node.restart()
    assert node.spec_path(kept.uid).exists()
    assert not any(path.exists() for path in litter)
    assert unrelated.exists()


# ---- reconciliation -----------------------------------------------------------------------


async def test_reconcile_unprepares_claims_gone_from_the_api_server(
    node: Node, apiserver: LocalApiServer
) -> None:
    deleted = await node.claim("deleted", ["gpu-1"])
    recreated = await node.claim("recreated", ["gpu-2"])
    alive = await node.claim("alive", ["gpu-3"])
    await node.state.prepare([deleted, recreated, alive])
    await delete_claim(node.api, deleted)
    await delete_claim(node.api, recreated)
    await node.claim("recreated", ["gpu-2"])  # same name, new UID
    apiserver.faults.forbid("get", "resourceclaims")
    await node.state.reconcile()  # 403 proves nothing: everything stays
    assert len(node.prepared()) == 3
    apiserver.faults.clear()
    apiserver.faults.fail("get", "resourceclaims", code=500, times=-1)
    await node.state.reconcile()  # nor does a 500
    assert len(node.prepared()) == 3
    apiserver.faults.clear()
    apiserver.faults.serve_resource_v1 = False
    await node.state.reconcile()  # a 404 for the API path is not a 404 for the claim
    assert len(node.prepared()) == 3
    apiserver.faults.clear()
    await node.state.reconcile()
    assert set(node.prepared()) == {alive.uid}
    assert node.reservations() == {"gpu-3": alive.uid}
    assert not node.spec_path(deleted.uid).exists()
    assert not node.spec_path(recreated.uid).exists()
    assert node.spec_path(alive.uid).exists()


async def test_cancelled_prepare_leaves_consistent_state(
    node: Node, apiserver: LocalApiServer
) -> None:
    ref = await node.claim("cancelled", ["gpu-6"])
    apiserver.faults.delay("get", "resourceclaims", ref.name, seconds=0.2, times=1)
    task = asyncio.create_task(node.state.prepare([ref]))
    with pytest.raises(TimeoutError):  # the kubelet gives up while the GET is in flight
        await asyncio.wait_for(asyncio.shield(task), 0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The work the kubelet gave up on finishes; its retry waits for it and gets its answer.
    result = await node.state.prepare([ref])
    assert result[ref.uid].error == ""
    assert set(node.prepared()) == {ref.uid}
    assert node.reservations() == {"gpu-6": ref.uid}


def test_crashpoint_kills_only_at_its_name() -> None:
    code = (
        "from driver.common.crashpoints import crashpoint\n"
        "crashpoint('a'); crashpoint('b'); print('survived')"
    )
    env = {"GPU_DRA_CRASHPOINT": "b", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == -9 and "survived" not in proc.stdout
    env["GPU_DRA_CRASHPOINT"] = "c"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "survived" in proc.stdout
