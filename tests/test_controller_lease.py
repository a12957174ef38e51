"""The publisher-lease rule (pure), the lease against a squatter on the local API server,
and the retry backoff."""

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from driver.common.wire import format_micro_time, parse_time
from driver.kube.backoff import Backoff
from driver.kube.lease import (
    CLOCK_SKEW,
    HOLDER_STARTED,
    LEASE_DURATION,
    Candidate,
    Decision,
    decide,
)
from driver.slices import SliceController
from drivers.gpu.kinds import gpu_kinds, node_devices
from sandbox.apiserver import LocalApiServer
from tests.test_controller import Hardware

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NOW = START + timedelta(hours=2)  # every lease below was renewed a moment ago
ME = Candidate(identity="me", started=START)
decide_now = partial(decide, now=NOW)


def lease(
    holder: str | None, acquired: datetime | None, *, renewed: datetime | None = NOW
) -> dict[str, Any]:
    spec: dict[str, object] = {"leaseDurationSeconds": int(LEASE_DURATION)}
    if holder is not None:
        spec["holderIdentity"] = holder
    if acquired is not None:
        spec["acquireTime"] = format_micro_time(acquired)
    if renewed is not None:
        spec["renewTime"] = format_micro_time(renewed)
    return {"metadata": {"name": "gpu.nvidia.com-node-1"}, "spec": spec}


def test_no_lease_is_created() -> None:
    assert decide_now(None, ME) is Decision.CREATE


def test_own_lease_is_held() -> None:
    assert decide_now(lease("me", START + timedelta(hours=1)), ME) is Decision.HOLD


def test_lease_acquired_before_we_started_is_taken() -> None:
    assert decide_now(lease("old", START - timedelta(seconds=1)), ME) is Decision.TAKE


def test_lease_acquired_after_we_started_means_a_newer_instance_publishes() -> None:
    assert decide_now(lease("new", START + timedelta(microseconds=1)), ME) is Decision.YIELD


def test_the_holders_start_decides_not_when_it_took_the_lease() -> None:
    """Two instances race on a fresh node; the older one may take the lease last."""
    older_holder = lease("old", START + timedelta(seconds=5))
    older_holder["metadata"]["annotations"] = {
        HOLDER_STARTED: format_micro_time(START - timedelta(seconds=1))
    }
    assert decide_now(older_holder, ME) is Decision.TAKE
    newer_holder = lease("new", START - timedelta(seconds=5))
    newer_holder["metadata"]["annotations"] = {
        HOLDER_STARTED: format_micro_time(START + timedelta(seconds=1))
    }
    assert decide_now(newer_holder, ME) is Decision.YIELD


def test_released_or_unreadable_lease_is_taken() -> None:
    assert decide_now(lease(None, START + timedelta(hours=1)), ME) is Decision.TAKE
    assert decide_now(lease("", START + timedelta(hours=1)), ME) is Decision.TAKE
    broken = lease("other", None)
    broken["spec"].update(holderIdentity="other", acquireTime="yesterday")
    assert decide_now(broken, ME) is Decision.TAKE


def test_a_start_in_the_future_is_not_believed() -> None:
    """A forged (or broken) clock would otherwise win every contest, forever."""
    squatter = lease("squatter", NOW)
    squatter["metadata"]["annotations"] = {
        HOLDER_STARTED: format_micro_time(NOW + timedelta(days=3650))
    }
    assert decide_now(squatter, ME) is Decision.TAKE
    within_skew = lease("new", NOW)
    within_skew["metadata"]["annotations"] = {HOLDER_STARTED: format_micro_time(NOW + CLOCK_SKEW)}
    assert decide_now(within_skew, ME) is Decision.YIELD


def test_a_lease_not_renewed_within_its_duration_expires() -> None:
    late = NOW - timedelta(seconds=LEASE_DURATION + 1)
    assert decide_now(lease("new", START + timedelta(seconds=1), renewed=late), ME) is Decision.TAKE
    fresh = NOW - timedelta(seconds=LEASE_DURATION - 1)
    assert (
        decide_now(lease("new", START + timedelta(seconds=1), renewed=fresh), ME) is Decision.YIELD
    )


def test_a_renewal_in_the_future_or_a_huge_duration_is_not_believed() -> None:
    ahead = lease("new", START + timedelta(seconds=1), renewed=NOW + CLOCK_SKEW * 2)
    assert decide_now(ahead, ME) is Decision.TAKE
    # A holder may not grant itself more time than we would: the duration is capped at ours.
    forever = lease("new", START + timedelta(seconds=1), renewed=NOW - timedelta(hours=1))
    forever["spec"]["leaseDurationSeconds"] = 10**9
    assert decide_now(forever, ME) is Decision.TAKE


def test_a_lease_nobody_renews_is_expired() -> None:
    """A lease of an older release (no duration) or garbage fields: nobody keeps it alive."""
    no_duration = lease("new", START + timedelta(seconds=1))
    del no_duration["spec"]["leaseDurationSeconds"]
    assert decide_now(no_duration, ME) is Decision.TAKE
    not_renewed = lease("new", START + timedelta(seconds=1), renewed=None)
    assert decide_now(not_renewed, ME) is Decision.TAKE
    for garbage in ("300", True, 0, -5):
        odd = lease("new", START + timedelta(seconds=1))
        odd["spec"]["leaseDurationSeconds"] = garbage
        assert decide_now(odd, ME) is Decision.TAKE, garbage


def test_micro_time_round_trips() -> None:
    moment = START + timedelta(microseconds=123456)
    text = format_micro_time(moment)
    assert text == "2026-01-01T12:00:00.123456Z"
    assert parse_time(text) == moment


def test_backoff_grows_is_capped_jittered_and_resets() -> None:
    backoff = Backoff(base=0.5, cap=4.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(4.0, 0.5 * 2**i) for i in range(12)]
    assert all(0 < d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    assert max(delays[6:]) > 2.0  # grew toward the cap
    backoff.reset()
    assert backoff.next_delay() <= 0.5


# ---- against a squatter, on the local API server --------------------------------------------

NODE = "node-1"
LEASE = f"gpu.nvidia.com-{NODE}"
NAMESPACE = "default"
TIMEOUT = 20.0


@pytest.fixture
async def controllers(
    apiserver: LocalApiServer, api_client: Any
) -> AsyncIterator[list[asyncio.Task[None]]]:
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    tasks: list[asyncio.Task[None]] = []
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _start(
    tasks: list[asyncio.Task[None]],
    api_client: Any,
    root: Path,
    identity: str,
    **faults: Any,
) -> SliceController:
    hardware = Hardware(root)
    hardware.set(**faults)
    # No resync within the test: whatever lets the victim publish is the lease's doing.
    controller = SliceController(
        api_client,
        node_name=NODE,
        driver_name="gpu.nvidia.com",
        devices=node_devices(hardware.discover, node_name=NODE, kinds=gpu_kinds()).published,
        identity=identity,
        namespace=NAMESPACE,
        resync_period=3600,
        request_timeout=2.0,
        backoff_cap=0.2,
        lease_duration=1.5,
    )
    tasks.append(asyncio.create_task(controller.run()))
    return controller


SQUATTED = "squatted"  # the squatter's slice: a holder publishes (an empty pool reads no lease)


def _squat(apiserver: LocalApiServer, *, started: datetime) -> None:
    now = datetime.now(UTC)
    apiserver.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": SQUATTED},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
    )
    apiserver.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": LEASE,
                "namespace": NAMESPACE,
                "annotations": {HOLDER_STARTED: format_micro_time(started)},
            },
            "spec": {
                "holderIdentity": "squatter",
                "acquireTime": format_micro_time(now),
                "renewTime": format_micro_time(now),
                "leaseDurationSeconds": 3600,
            },
        }
    )


def _slices(apiserver: LocalApiServer) -> int:
    """The victim's slices: the squatter's is not counted."""
    return sum(s["metadata"]["name"] != SQUATTED for s in apiserver.objects("resourceslices"))


def _holder(apiserver: LocalApiServer) -> str | None:
    leases = apiserver.objects("leases")
    return leases[0]["spec"].get("holderIdentity") if leases else None


async def _until(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_far_future_squatter_does_not_keep_a_node_from_publishing(
    apiserver: LocalApiServer,
    api_client: Any,
    controllers: list[asyncio.Task[None]],
    tmp_path: Path,
) -> None:
    _squat(apiserver, started=datetime.now(UTC) + timedelta(days=3650))
    victim = _start(controllers, api_client, tmp_path, "victim")
    await asyncio.wait_for(victim.published.wait(), TIMEOUT)
    await _until(lambda: _slices(apiserver) == 1, "the victim's slice")
    assert not victim.standby
    assert _holder(apiserver) == "victim"


async def test_a_squatter_that_stops_renewing_loses_the_lease(
    apiserver: LocalApiServer,
    api_client: Any,
    controllers: list[asyncio.Task[None]],
    tmp_path: Path,
) -> None:
    # A start a little after ours (within the skew bound): believed, while the lease is live.
    _squat(apiserver, started=datetime.now(UTC) + timedelta(seconds=20))
    victim = _start(controllers, api_client, tmp_path, "victim")
    await asyncio.wait_for(victim.published.wait(), TIMEOUT)
    # Its 3600 s are capped at our 1.5 s: not renewed, it expires, and the standby publishes.
    await _until(lambda: _slices(apiserver) == 1, "the victim's slice after the lease expired")
    assert _holder(apiserver) == "victim"


async def test_clearing_a_squatted_lease_lets_the_victim_publish_without_a_restart(
    apiserver: LocalApiServer,
    api_client: Any,
    controllers: list[asyncio.Task[None]],
    tmp_path: Path,
) -> None:
    started = datetime.now(UTC) + timedelta(seconds=20)
    _squat(apiserver, started=started)
    stop = asyncio.Event()

    async def keep_squatting() -> None:
        while not stop.is_set():
            [held] = apiserver.objects("leases")
            if held["spec"].get("holderIdentity") != "squatter":
                return
            held["spec"]["renewTime"] = format_micro_time(datetime.now(UTC))
            apiserver.put(held)
            await asyncio.sleep(0.1)

    squatter = asyncio.create_task(keep_squatting())
    victim = _start(controllers, api_client, tmp_path, "victim")
    await asyncio.wait_for(victim.published.wait(), TIMEOUT)
    assert victim.standby
    assert _slices(apiserver) == 0
    stop.set()
    await squatter
    apiserver.delete("leases", LEASE, NAMESPACE)  # what an operator does about it
    await _until(lambda: _slices(apiserver) == 1, "the victim's slice after the lease was cleared")
    assert not victim.standby


async def test_a_live_holder_renews_and_keeps_the_lease(
    apiserver: LocalApiServer,
    api_client: Any,
    controllers: list[asyncio.Task[None]],
    tmp_path: Path,
) -> None:
    old = _start(controllers, api_client, tmp_path / "old", "old")
    await asyncio.wait_for(old.published.wait(), TIMEOUT)
    # The two disagree (as two versions might), so the newer one takes the node.
    new = _start(controllers, api_client, tmp_path / "new", "new", removedGpus=[5])
    await asyncio.wait_for(new.published.wait(), TIMEOUT)
    await _until(lambda: _holder(apiserver) == "new", "the newer instance holding the lease")
    [first] = apiserver.objects("leases")
    renewals = 0
    seen = first["spec"]["renewTime"]

    def renewed_thrice() -> bool:
        nonlocal renewals, seen
        [now] = apiserver.objects("leases")
        if now["spec"]["renewTime"] != seen:
            renewals, seen = renewals + 1, now["spec"]["renewTime"]
        return renewals >= 3

    # Three renewals span more than a whole 1.5 s duration: the lease never lapsed.
    await _until(renewed_thrice, "three renewals")
    assert _holder(apiserver) == "new"
    assert not new.standby and old.standby
