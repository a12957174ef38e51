"""CDI claim specs: schema-valid, CDI naming rules, rebuildable, foreign specs detected."""

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from driver.devicekind import NodeDevice, PreparedClaim, PreparedDevice
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds.gpu import CONTROL_NODES, node_device, own_node
from drivers.gpu.model.inventory import Gpu, Inventory
from kubeletplugin import cdi
from kubeletplugin.containertoolkit import base_edits, translate_edits
from kubeletplugin.records import Records

# The CDI specification's own schema, kept as test data (see its README for the origin).
SCHEMA_DIR = Path(__file__).resolve().parent / "data" / "cdi-schema"

# CDI SPEC.md naming rules (the JSON schema does not check them).
_KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")
_DEVICE_NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$")


@cache
def _validator() -> Any:
    from jsonschema import Draft7Validator
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    return Draft7Validator(schema, registry=registry)


def assert_valid_spec(spec: dict[str, Any]) -> None:
    """Schema-valid, and kind, device names and cdiVersion as the CDI rules want them."""
    errors = sorted(_validator().iter_errors(spec), key=str)
    assert not errors, [e.message for e in errors]
    assert _KIND.match(spec["kind"]), spec["kind"]
    assert spec["devices"], "a spec needs at least one device"
    for device in spec["devices"]:
        assert _DEVICE_NAME.match(device["name"]), device["name"]
        # The CDI library's Device.validate: "invalid device, empty device edits".
        assert any(device["containerEdits"].values()), f"{device['name']}: empty device edits"
    assert spec["cdiVersion"] == cdi.min_version(spec)
    assert tuple(int(p) for p in spec["cdiVersion"].split(".")) >= (0, 6, 0)  # annotations


def make_gpu(minor: int) -> Gpu:
    return Gpu(
        index=minor,
        minor=minor,
        uuid=f"GPU-{minor:08d}-aaaa-bbbb-cccc-000000000000",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=80 * 2**30,
        pci_bus_id=f"0000:{minor + 16:02x}:00.0",
        pcie_root=None,
        numa_node=0,
        mig_enabled=False,
    )


GPUS = {g.device_name: g for g in (make_gpu(i) for i in range(8))}
_INVENTORY = Inventory("580.95.05", (13, 0), tuple(GPUS.values()))
DEVICES: dict[str, NodeDevice] = {
    name: node_device(gpu, _INVENTORY, node_name="node-a") for name, gpu in GPUS.items()
}
UID = "0b0c1f8e-6a3b-4b8a-9d1e-3f0f5c2d7e11"


def _record(*devices: str, admin: bool = False) -> PreparedClaim:
    return PreparedClaim(
        uid=UID,
        namespace="team-a",
        name="train",
        devices=tuple(
            PreparedDevice(
                request_names=("gpus",),
                pool_name="node-a",
                device_name=d,
                cdi_device_ids=(cdi.cdi_device_id(UID, d, None, GPU),),
                admin_access=admin,
                kind="gpu",
                identity=(("gpu-uuid", GPUS[d].uuid),),
            )
            for d in devices
        ),
    )


def build(claim: PreparedClaim, base: Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """The claim's spec on DEVICES, its kinds' edits asked as the claim state asks them."""
    edits = {
        kind: GPU.kinds[kind].claim_edits(of_kind, claim)
        for kind, of_kind in cdi.kinds_of(claim, DEVICES).items()
    }
    return cdi.build_claim_spec(claim, DEVICES, base, edits, flavor=GPU, **options)


def test_claim_spec_contents() -> None:
    spec = build(_record("gpu-3", "gpu-1"), {})
    assert_valid_spec(spec)
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["cdiVersion"] == "0.6.0"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-1", f"{UID}-gpu-3"]
    assert spec["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia1"}]}
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == list(CONTROL_NODES)
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert f"GPU_DRA_VISIBLE_GPU_UUIDS={GPUS['gpu-1'].uuid},{GPUS['gpu-3'].uuid}" in edits["env"]
    assert spec["annotations"][cdi.CLAIM_UID] == UID
    assert spec["annotations"][cdi.CLAIM_NAMESPACE] == "team-a"
    assert spec["annotations"][cdi.CLAIM_NAME] == "train"
    assert spec["devices"][1]["annotations"][cdi.GPU_UUID] == GPUS["gpu-3"].uuid


def test_cdi_device_id_is_fully_qualified() -> None:
    assert cdi.cdi_device_id(UID, "gpu-0", None, GPU) == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"


def test_base_edits_are_merged_and_version_follows_fields() -> None:
    base = {
        "env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"],
        "mounts": [
            {
                "hostPath": "/usr/lib64/libcuda.so.580.95.05",
                "containerPath": "/usr/lib64/libcuda.so.580.95.05",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"],
            }
        ],
    }
    spec = build(_record("gpu-0"), base)
    assert_valid_spec(spec)
    assert spec["containerEdits"]["env"][0] == "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
    assert spec["containerEdits"]["mounts"] == base["mounts"]
    assert spec["containerEdits"]["hooks"] == base["hooks"]
    assert base["env"] == ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"]  # input not mutated
    with_gids = build(_record("gpu-0"), {"additionalGids": [44]})
    assert_valid_spec(with_gids)
    assert with_gids["cdiVersion"] == "0.7.0"


def test_spec_round_trips_to_the_record(tmp_path: Path) -> None:
    record = _record("gpu-2", "gpu-5", admin=True)
    records = Records(tmp_path / "plugin", tmp_path, boot_id="boot-1", flavor=GPU)
    spec = build(record, {}, boot_id="boot-1")
    records.write_spec(UID, cdi.encode(spec))
    path = tmp_path / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    assert records.spec_files() == [path]
    assert cdi.claim_from_spec(json.loads(path.read_text()), GPU) == record
    assert cdi.boot_of(spec) == "boot-1"
    assert records.remove_spec(UID)
    assert not records.remove_spec(UID)  # idempotent


def test_nvidia_driver_specs_are_foreign_others_ignored(tmp_path: Path) -> None:
    nvidia_claim = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": f"{UID}-gpu-0", "containerEdits": {"env": ["X=1"]}}],
    }
    assert cdi.is_foreign(nvidia_claim, GPU) and not cdi.is_ours(nvidia_claim)
    (tmp_path / f"k8s.gpu.nvidia.com-claim_{UID}.yaml").write_text(json.dumps(nvidia_claim))
    # The container toolkit's own static spec is not a DRA driver's: not even looked at.
    (tmp_path / "nvidia.yaml").write_text(json.dumps({**nvidia_claim, "kind": "nvidia.com/gpu"}))
    records = Records(tmp_path / "plugin", tmp_path, boot_id="boot-1", flavor=GPU)
    assert [p.name for p in records.spec_files()] == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
    ours = build(_record("gpu-0"), {})
    assert cdi.is_ours(ours) and not cdi.is_foreign(ours, GPU)


def test_a_spec_this_release_cannot_read_is_an_error_not_an_empty_claim() -> None:
    spec = build(_record("gpu-0"), {})
    newer = {**spec, "annotations": {**spec["annotations"], cdi.RECORD_VERSION: "3"}}
    with pytest.raises(cdi.SpecError, match="newer"):
        cdi.claim_from_spec(newer, GPU)
    unknown_kind = json.loads(json.dumps(spec))
    unknown_kind["devices"][0]["annotations"][cdi.DEVICE_KIND] = "quantum"
    with pytest.raises(cdi.SpecError, match="unknown kind"):
        cdi.claim_from_spec(unknown_kind, GPU)
    with pytest.raises(cdi.SpecError, match="layout"):
        cdi.claim_from_spec({**spec, "devices": None}, GPU)


def test_translate_edits_maps_container_paths_to_host_paths() -> None:
    generated: dict[str, Any] = {
        "deviceNodes": [
            {"path": "/dev/nvidia0", "hostPath": "/driver-root/dev/nvidia0"},
            {"path": "/dev/nvidiactl", "hostPath": "/driver-root/dev/nvidiactl"},
            {
                "path": "/dev/nvidia-caps/nvidia-cap1",
                "hostPath": "/driver-root/dev/nvidia-caps/nvidia-cap1",
            },
        ],
        "mounts": [
            {
                "hostPath": "/driver-root/usr/lib64/libcuda.so.1",
                "containerPath": "/usr/lib64/libcuda.so.1",
            },
            {"hostPath": "/elsewhere/x", "containerPath": "/x"},
        ],
        "hooks": [{"hookName": "createContainer", "path": "/driver-root/usr/bin/nvidia-cdi-hook"}],
        "env": ["A=1"],
    }
    out = translate_edits(
        generated,
        container_root=Path("/driver-root"),
        host_root=Path("/run/nvidia/driver"),
        own_node=own_node,
    )
    assert out["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps/nvidia-cap1",
            "hostPath": "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap1",
        }
    ]
    assert out["mounts"][0]["hostPath"] == "/run/nvidia/driver/usr/lib64/libcuda.so.1"
    assert out["mounts"][1]["hostPath"] == "/elsewhere/x"
    assert out["hooks"][0]["path"] == "/run/nvidia/driver/usr/bin/nvidia-cdi-hook"
    assert out["env"] == ["A=1"]
    assert generated["mounts"][0]["hostPath"].startswith("/driver-root")  # input not mutated


async def test_simulated_nodes_need_no_toolkit(tmp_path: Path) -> None:
    assert (
        await base_edits(
            "simulated", container_root=tmp_path, host_root=Path("/"), own_node=own_node
        )
        == {}
    )


async def test_real_node_without_toolkit_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubeletplugin.containertoolkit import ToolkitError

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-ctk on PATH either
    with pytest.raises(ToolkitError, match=r"nvidia-ctk .* not found under"):
        await base_edits("system", container_root=tmp_path, host_root=Path("/"), own_node=own_node)


async def test_toolkit_output_is_used_and_translated(tmp_path: Path) -> None:
    root = tmp_path / "driver-root"
    ctk = root / "usr" / "bin" / "nvidia-ctk"
    ctk.parent.mkdir(parents=True)
    generated = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {
            "mounts": [
                {
                    "hostPath": f"{root}/usr/lib64/libcuda.so.1",
                    "containerPath": "/usr/lib64/libcuda.so.1",
                }
            ],
        },
    }
    # A stand-in for the host's nvidia-ctk: records its arguments, prints a spec.
    ctk.write_text(
        f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat <<'JSON'\n{json.dumps(generated)}\nJSON\n"
    )
    ctk.chmod(0o755)
    edits = await base_edits("system", container_root=root, host_root=Path("/"), own_node=own_node)
    assert edits == {
        "mounts": [
            {"hostPath": "/usr/lib64/libcuda.so.1", "containerPath": "/usr/lib64/libcuda.so.1"}
        ]
    }
    argv = (tmp_path / "argv").read_text()
    assert f"--driver-root={root}" in argv and "--format=json" in argv
    assert "--nvidia-ctk-path=/usr/bin/nvidia-ctk" in argv


def test_schema_check_is_not_vacuous() -> None:
    spec = build(_record("gpu-0"), {})
    spec["devices"][0]["containerEdits"]["deviceNodes"] = [{"hostPath": "/dev/nvidia0"}]
    assert list(_validator().iter_errors(spec)), "a device node without path must fail"


def test_which_specs_start_from_the_toolkits_edits() -> None:
    """Every GPU claim's; of the ComputeDomain driver's, the daemon's alone (its pod runs the
    host driver's nvidia-imex and nvidia-imex-ctl, which come with those edits), never a
    channel's (a channel is one device node)."""
    import dataclasses

    from drivers.gpu.flavor import GPU

    assert GPU.starts_from_toolkit({"gpu"}) and GPU.starts_from_toolkit(())
    cd = dataclasses.replace(GPU, toolkit_kinds=frozenset({"daemon"}))
    assert cd.starts_from_toolkit({"daemon"})
    assert not cd.starts_from_toolkit({"channel"})
    assert not dataclasses.replace(GPU, toolkit_kinds=frozenset()).starts_from_toolkit({"gpu"})
