"""The supervised-loop policy: what a failed round of a background loop leads to."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from driver.common.supervise import OnFailure, supervised


def _rounds(*outcomes: Exception | None) -> tuple[list[int], Callable[[], Awaitable[None]]]:
    done: list[int] = []
    queue = list(outcomes)

    async def round_() -> None:
        done.append(1)
        if not queue:  # the rounds are spent: end the loop as a cancellation would
            raise asyncio.CancelledError
        outcome = queue.pop(0)
        if outcome is not None:
            raise outcome

    return done, round_


async def test_continue_logs_a_repeated_failure_once_and_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done, round_ = _rounds(OSError("disk full"), OSError("disk full"), None, OSError("gone"))
    caplog.set_level(logging.INFO, logger="driver.common.supervise")
    with pytest.raises(asyncio.CancelledError):
        await supervised("t", round_, OnFailure.CONTINUE, pause=0)
    assert len(done) == 5  # every failure was followed by another round
    lines = [(r.getMessage(), getattr(r, "error", "")) for r in caplog.records]
    assert lines == [
        ("background loop round failed: going on", "OSError: disk full"),
        ("background loop round succeeded again", ""),
        ("background loop round failed: going on", "OSError: gone"),
    ]


async def test_not_ready_reports_until_a_round_succeeds() -> None:
    events: list[str] = []
    _, round_ = _rounds(OSError("a"), OSError("a"), None)
    with pytest.raises(asyncio.CancelledError):
        await supervised(
            "t",
            round_,
            OnFailure.NOT_READY,
            pause=0,
            not_ready=events.append,
            ready=lambda: events.append("ready"),
        )
    assert events == ["t: OSError: a", "t: OSError: a", "ready"]


async def test_exit_ends_the_loop_with_the_error() -> None:
    done, round_ = _rounds(None, ValueError("bad"), None)
    with pytest.raises(ValueError, match="bad"):
        await supervised("t", round_, OnFailure.EXIT, pause=0)
    assert len(done) == 2


async def test_not_ready_without_its_callbacks_is_refused() -> None:
    _, round_ = _rounds()
    with pytest.raises(ValueError, match="NOT_READY"):
        await supervised("t", round_, OnFailure.NOT_READY)
