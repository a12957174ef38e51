"""Release 0.1.0's checkpoint format (versions, checksum, foreign files), read to migrate."""

import json

import pytest

from kubeletplugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    ClaimState,
    CorruptCheckpointError,
    DeviceRecord,
    ForeignCheckpointError,
    UnknownCheckpointError,
    decode,
    encode,
    is_marker,
    marker,
)


def _record(
    uid: str, device: str = "gpu-0", state: ClaimState = ClaimState.PREPARE_COMPLETED
) -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state=state,
        devices=(
            DeviceRecord(
                request_names=("gpu",),
                pool_name="node-a",
                device_name=device,
                gpu_uuid=f"GPU-{device}",
                cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={uid}-{device}",),
                share_id=None,
                admin_access=False,
            ),
        ),
    )


def _checkpoint() -> Checkpoint:
    return Checkpoint(
        boot_id="boot-1",
        claims={"u1": _record("u1"), "u2": _record("u2", "gpu-1", ClaimState.PREPARE_STARTED)},
    )


def test_round_trip() -> None:
    checkpoint = _checkpoint()
    assert decode(encode(checkpoint)) == checkpoint


def test_checksum_mismatch_is_corrupt() -> None:
    document = json.loads(encode(_checkpoint()))
    document["data"]["claims"]["u1"]["devices"][0]["deviceName"] = "gpu-7"
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode(json.dumps(document).encode())


@pytest.mark.parametrize("cut", [0, 1, 40, -2])
def test_truncated_file_is_corrupt(cut: int) -> None:
    raw = encode(_checkpoint())
    with pytest.raises(CorruptCheckpointError):
        decode(raw[:cut])


def test_unknown_fields_are_tolerated() -> None:
    document = json.loads(encode(_checkpoint()))
    data = document["data"]
    data["futureTopLevel"] = {"x": 1}
    data["claims"]["u1"]["futureClaimField"] = True
    data["claims"]["u1"]["devices"][0]["futureDeviceField"] = [1, 2]
    # A writer that adds fields computes the checksum over them, as ours does.
    from kubeletplugin.checkpoint import _checksum

    document["checksum"] = _checksum(data)
    assert decode(json.dumps(document).encode()) == _checkpoint()
    document["version"] = 7  # a newer writer: refused, never read as what it may not be
    with pytest.raises(UnknownCheckpointError, match="version 7"):
        decode(json.dumps(document).encode())


def test_claims_under_another_key_are_refused_not_read_as_none() -> None:
    from kubeletplugin.checkpoint import _checksum

    document = json.loads(encode(_checkpoint()))
    document["data"]["preparedClaims"] = document["data"].pop("claims")
    document["checksum"] = _checksum(document["data"])
    with pytest.raises(UnknownCheckpointError, match="layout"):
        decode(json.dumps(document).encode())


def test_the_marker_is_what_0_1_0_reads_as_a_corrupt_checkpoint() -> None:
    # 0.1.0's decode (this one, for versions 1 and 2) checks the checksum before the
    # version: the marker is "corrupt" to it, so it rebuilds from the CDI specs.
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode(marker())
    assert is_marker(marker()) and not is_marker(encode(_checkpoint()))


def test_version_1_is_upgraded() -> None:
    from kubeletplugin.checkpoint import _checksum

    data = {
        "preparedClaims": {
            "u1": {
                "namespace": "default",
                "name": "claim-u1",
                "devices": [
                    {
                        "requestNames": ["gpu"],
                        "poolName": "node-a",
                        "deviceName": "gpu-0",
                        "gpuUUID": "GPU-gpu-0",
                        "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=u1-gpu-0"],
                    }
                ],
            }
        }
    }
    raw = json.dumps(
        {"kind": "GpuDraCheckpoint", "version": 1, "checksum": _checksum(data), "data": data}
    ).encode()
    upgraded = decode(raw)
    assert upgraded.boot_id == ""
    assert upgraded.claims == {"u1": _record("u1")}
    assert json.loads(encode(upgraded))["version"] == 2


def test_nvidia_driver_checkpoint_is_foreign() -> None:
    nvidia = {
        "checksum": 1234567,
        "v1": {"preparedClaims": {}},
        "v2": {"checksum": 42, "preparedClaims": {}, "nodeBootID": "x"},
    }
    with pytest.raises(ForeignCheckpointError, match="migrate"):
        decode(
            json.dumps(nvidia).encode(),
            path="/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json",
        )
