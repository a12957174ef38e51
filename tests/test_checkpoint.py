"""Checkpoint format (versions, checksum, foreign files) and the store (atomic, locked, batched)."""

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    CorruptCheckpointError,
    DeviceRecord,
    ForeignCheckpointError,
    decode,
    encode,
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
    document["version"] = 7  # a newer writer: read with the newest reader we have
    assert decode(json.dumps(document).encode()) == _checkpoint()


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


def _store(tmp_path: Path, corrupt: list[CorruptCheckpointError] | None = None) -> CheckpointStore:
    def on_corrupt(error: CorruptCheckpointError) -> Checkpoint:
        assert corrupt is not None, f"unexpected corrupt checkpoint: {error}"
        corrupt.append(error)
        return Checkpoint(boot_id="boot-1")

    return CheckpointStore(tmp_path, boot_id="boot-1", on_corrupt=on_corrupt)


async def test_store_writes_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert await store.update(lambda cp: (cp.with_claim(_record("u1")), "ok")) == "ok"
    assert decode(store.path.read_bytes()).claims == {"u1": _record("u1")}
    names = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.iterdir()))
    assert names == ["checkpoint.json", "checkpoint.lock"]


async def test_concurrent_updates_all_land_and_one_refusal_stays_local(tmp_path: Path) -> None:
    store = _store(tmp_path)

    def add(uid: str) -> Callable[[Checkpoint], tuple[Checkpoint, str]]:
        return lambda cp: (cp.with_claim(_record(uid, f"gpu-{uid}")), uid)

    def refuse(cp: Checkpoint) -> tuple[Checkpoint, str]:
        raise ValueError("refused")

    tasks = [store.update(add(str(i))) for i in range(30)]
    results = await asyncio.gather(*tasks, store.update(refuse), return_exceptions=True)
    assert results[:30] == [str(i) for i in range(30)]
    assert isinstance(results[30], ValueError)
    assert set(decode(store.path.read_bytes()).claims) == {str(i) for i in range(30)}


async def test_two_stores_on_one_directory_lose_no_update(tmp_path: Path) -> None:
    # Two plugin instances (surge upgrade): each re-reads under the file lock.
    first, second = _store(tmp_path), _store(tmp_path)

    def add(uid: str) -> Callable[[Checkpoint], tuple[Checkpoint, None]]:
        return lambda cp: (cp.with_claim(_record(uid, uid)), None)

    updates = [
        store.update(add(f"{n}-{i}"))
        for i in range(15)
        for n, store in (("a", first), ("b", second))
    ]
    await asyncio.gather(*updates)
    assert len(decode(tmp_path.joinpath("checkpoint.json").read_bytes()).claims) == 30


async def test_cancelled_caller_does_not_cancel_the_write(tmp_path: Path) -> None:
    store = _store(tmp_path)
    task = asyncio.create_task(store.update(lambda cp: (cp.with_claim(_record("u1")), None)))
    await asyncio.sleep(0)  # let it enqueue
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "u1" in (await store.snapshot()).claims


async def test_corrupt_file_goes_through_on_corrupt_and_is_moved_aside(tmp_path: Path) -> None:
    seen: list[CorruptCheckpointError] = []
    store = _store(tmp_path, seen)
    store.path.write_bytes(b'{"kind": "GpuDraCheckpoint", "vers')
    assert (await store.snapshot()).claims == {}
    assert len(seen) == 1
    # on_corrupt here does not move the file itself; the store rewrote a valid one.
    assert decode(store.path.read_bytes()).boot_id == "boot-1"
    aside = store.move_aside()
    assert aside.name.startswith("checkpoint.json.corrupt-")
    assert not store.path.exists()


async def test_foreign_file_fails_every_update(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.path.write_text(json.dumps({"checksum": 1, "v1": {}, "v2": {}}))
    with pytest.raises(ForeignCheckpointError):
        await store.update(lambda cp: (cp.with_claim(_record("u1")), None))
    assert json.loads(store.path.read_text()) == {"checksum": 1, "v1": {}, "v2": {}}
