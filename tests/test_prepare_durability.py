"""What the fast prepare path keeps: its fsyncs, their order, and the checkpoint store's hooks."""

import asyncio
import fcntl
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from kubeletplugin import cdi, checkpoint
from kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    CorruptCheckpointError,
    DeviceRecord,
    decode,
)
from kubeletplugin.state import DeviceState
from tests.test_state import _config, _inventory, create_claim


def _record(uid: str) -> ClaimRecord:
    device = DeviceRecord(("gpu",), "pool", f"gpu-{uid}", f"GPU-{uid}", (f"k/c={uid}",))
    return ClaimRecord(uid, "default", f"claim-{uid}", ClaimState.PREPARE_STARTED, (device,))


def _store(directory: Path) -> CheckpointStore:
    def on_corrupt(error: CorruptCheckpointError) -> Checkpoint:
        raise AssertionError(f"unexpected corrupt checkpoint: {error}")

    return CheckpointStore(directory, boot_id="boot-1", on_corrupt=on_corrupt)


def _exists(path: str) -> bool:
    return Path(path).exists()


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _lock_is_held(directory: Path) -> bool:
    fd = os.open(directory / checkpoint.LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


async def test_prepare_and_unprepare_fsync_what_crash_safety_needs_in_order(
    api_client: k8s.ApiClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    state = await DeviceState.open(config, api_client, _inventory("p5.48xlarge", tmp_path))
    ref = await create_claim(api_client, "durable", ["gpu-5"])
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", str(Path(f"/proc/self/fd/{fd}").readlink())))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(("rename", str(dst)))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert (await state.prepare([ref]))[ref.uid].error == ""
    prepare_events = list(events)
    assert await state.unprepare([ref]) == {ref.uid: ""}
    unprepare_events = events[len(prepare_events) :]

    plugin_dir, spec = str(config.plugin_dir), str(cdi.spec_path(config.cdi_root, ref.uid))
    checkpoint_file = str(config.plugin_dir / checkpoint.FILE_NAME)
    fsynced = [path for kind, path in prepare_events if kind == "fsync"]
    # PrepareStarted (file and directory), the CDI spec, PrepareCompleted (file only).
    assert len(fsynced) == 4, prepare_events
    assert fsynced[1] == plugin_dir
    assert [p for k, p in prepare_events if k == "rename"] == [
        checkpoint_file,
        spec,
        checkpoint_file,
    ]
    # PrepareStarted is on disk, directory entry included, before the spec is in place.
    assert prepare_events.index(("fsync", plugin_dir)) < prepare_events.index(("rename", spec))
    # Every rename is of a file fsynced before it: atomic, also across a power loss.
    for i, (kind, path) in enumerate(prepare_events + unprepare_events):
        if kind == "rename":
            before = (prepare_events + unprepare_events)[i - 1]
            assert before[0] == "fsync" and Path(before[1]).parent == Path(path).parent
    # The unprepare: the spec goes (no fsync needed), then one atomic checkpoint write.
    assert unprepare_events == [
        ("fsync", unprepare_events[0][1]),
        ("rename", checkpoint_file),
    ]
    assert not _exists(spec)
    assert ref.uid not in decode(_read(checkpoint_file)).claims


async def test_store_reparses_only_what_another_writer_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[bytes] = []
    real_decode = checkpoint.decode

    def counting_decode(raw: bytes, **kwargs: Any) -> Checkpoint:
        decoded.append(raw)
        return real_decode(raw, **kwargs)

    monkeypatch.setattr(checkpoint, "decode", counting_decode)
    ours, theirs = _store(tmp_path), _store(tmp_path)  # e.g. two plugin pods of one node

    def add(uid: str) -> Callable[[Checkpoint], tuple[Checkpoint, None]]:
        return lambda cp: (cp.with_claim(_record(uid)), None)

    await ours.update(add("a"))
    await ours.update(add("b"))
    assert decoded == []  # only our own writes since: nothing to parse
    await theirs.update(add("c"))
    assert len(decoded) == 1  # theirs read ours
    snapshot = await ours.snapshot()
    assert set(snapshot.claims) == {"a", "b", "c"}  # ours sees theirs
    assert len(decoded) == 2
    # Same size, same content but one byte: still re-read.
    raw = ours.path.read_bytes()
    ours.path.write_bytes(raw.replace(b"claim-a", b"claim-x"))
    with pytest.raises(CorruptCheckpointError):  # the checksum no longer matches
        ours.read()


async def test_store_hooks_run_under_the_lock_in_order_and_fail_alone(tmp_path: Path) -> None:
    store = _store(tmp_path)
    seen: list[str] = []

    def before() -> None:
        assert _lock_is_held(tmp_path)
        seen.append("before")

    def after(value: str) -> None:
        assert _lock_is_held(tmp_path)
        # The change is written (and readable by any process) before ``after`` runs.
        assert "ok" in decode(store.path.read_bytes()).claims
        seen.append(f"after {value}")

    def refuse() -> None:
        raise PermissionError("before refused")

    def explode(value: str) -> None:
        raise OSError(f"after failed for {value}")

    def add(uid: str) -> Callable[[Checkpoint], tuple[Checkpoint, str]]:
        return lambda cp: (cp.with_claim(_record(uid)), uid)

    results = await asyncio.gather(
        store.update(add("ok"), before=before, after=after),
        store.update(add("skipped"), before=refuse),
        store.update(add("written"), after=explode, durable=False),
        return_exceptions=True,
    )
    assert results[0] == "ok"
    assert isinstance(results[1], PermissionError)
    assert isinstance(results[2], OSError) and "written" in str(results[2])
    assert seen == ["before", "after ok"]
    # A refused ``before`` leaves the file untouched by its caller; a failed ``after``
    # comes after the write, for its caller to undo.
    assert set(decode(store.path.read_bytes()).claims) == {"ok", "written"}


async def test_after_may_return_a_second_apply_that_the_batch_writes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)
    writes: list[bool] = []
    real_write = store.write

    def counting_write(cp: Checkpoint, *, durable: bool = True) -> None:
        writes.append(durable)
        real_write(cp, durable=durable)

    monkeypatch.setattr(store, "write", counting_write)

    def start(uid: str) -> Callable[[Checkpoint], tuple[Checkpoint, str]]:
        return lambda cp: (cp.with_claim(_record(uid)), uid)

    def complete(uid: str) -> Callable[[str], Callable[[Checkpoint], tuple[Checkpoint, str]]]:
        done = replace(_record(uid), state=ClaimState.PREPARE_COMPLETED)
        return lambda value: lambda cp: (cp.with_claim(done), f"{value} done")

    updates = [store.update(start(uid), after=complete(uid)) for uid in ("a", "b", "c")]
    assert await asyncio.gather(*updates) == ["a done", "b done", "c done"]
    # One durable write for the three starts, one plain one for the three completions.
    assert writes == [True, False]
    claims = decode(store.path.read_bytes()).claims
    assert {uid: r.state for uid, r in claims.items()} == dict.fromkeys(
        "abc", ClaimState.PREPARE_COMPLETED
    )
