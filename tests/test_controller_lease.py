"""The publisher-lease rule (pure) and the retry backoff."""

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from driver.controller.backoff import Backoff
from driver.controller.lease import (
    HOLDER_STARTED,
    Candidate,
    Decision,
    decide,
    format_micro_time,
    parse_time,
)

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ME = Candidate(identity="me", started=START)


def lease(holder: str | None, acquired: datetime | None) -> dict[str, Any]:
    spec: dict[str, object] = {}
    if holder is not None:
        spec["holderIdentity"] = holder
    if acquired is not None:
        spec["acquireTime"] = format_micro_time(acquired)
    return {"metadata": {"name": "gpu.nvidia.com-node-1"}, "spec": spec}


def test_no_lease_is_created() -> None:
    assert decide(None, ME) is Decision.CREATE


def test_own_lease_is_held() -> None:
    assert decide(lease("me", START + timedelta(hours=1)), ME) is Decision.HOLD


def test_lease_acquired_before_we_started_is_taken() -> None:
    assert decide(lease("old", START - timedelta(seconds=1)), ME) is Decision.TAKE


def test_lease_acquired_after_we_started_means_a_newer_instance_publishes() -> None:
    assert decide(lease("new", START + timedelta(microseconds=1)), ME) is Decision.YIELD


def test_the_holders_start_decides_not_when_it_took_the_lease() -> None:
    """Two instances race on a fresh node; the older one may take the lease last."""
    older_holder = lease("old", START + timedelta(seconds=5))
    older_holder["metadata"]["annotations"] = {
        HOLDER_STARTED: format_micro_time(START - timedelta(seconds=1))
    }
    assert decide(older_holder, ME) is Decision.TAKE
    newer_holder = lease("new", START - timedelta(seconds=5))
    newer_holder["metadata"]["annotations"] = {
        HOLDER_STARTED: format_micro_time(START + timedelta(seconds=1))
    }
    assert decide(newer_holder, ME) is Decision.YIELD


def test_released_or_unreadable_lease_is_taken() -> None:
    assert decide(lease(None, START + timedelta(hours=1)), ME) is Decision.TAKE
    assert decide(lease("", START + timedelta(hours=1)), ME) is Decision.TAKE
    broken = lease("other", None)
    broken["spec"] = {"holderIdentity": "other", "acquireTime": "yesterday"}
    assert decide(broken, ME) is Decision.TAKE


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
