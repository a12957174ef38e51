"""One policy for what a background loop does when a round of it fails.

A daemon's loops (the health monitor, probes, reconcilers) each used to decide this
for themselves: one caught everything, another nothing, so a single failed disk write
ended the process. :func:`supervised` runs a loop's rounds and applies the policy it
is given, named where the loop is started:

- ``CONTINUE``: log and go on; the next round may succeed (a full disk, a slow server);
- ``NOT_READY``: as ``CONTINUE``, and report the node not ready until a round succeeds
  (the loop's work is what the node's readiness promises);
- ``EXIT``: log and end the loop with the error; its owner ends the process, whose
  restart is the only repair.

A failure is logged once while it repeats (the same message), and once when a round
succeeds again, so a loop failing every second does not flood the log.
"""

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

from driver.common.logs import kv

log = logging.getLogger(__name__)


class OnFailure(enum.Enum):
    CONTINUE = "continue"
    NOT_READY = "not-ready"
    EXIT = "exit"


async def supervised(
    name: str,
    round_: Callable[[], Awaitable[None]],
    on_failure: OnFailure,
    *,
    pause: float = 1.0,
    not_ready: Callable[[str], None] | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """``round_`` again and again until cancelled, a failed round handled by ``on_failure``.

    ``pause``: seconds after a failed round before the next, so a round that fails at
    once does not spin. ``not_ready``/``ready``: the node's readiness, for ``NOT_READY``.
    """
    if on_failure is OnFailure.NOT_READY and (not_ready is None or ready is None):
        raise ValueError(f"loop {name}: NOT_READY needs not_ready and ready")
    failing = ""  # the message of the failure last logged; "" while rounds succeed
    while True:
        try:
            await round_()
        except Exception as exc:  # CancelledError is not an Exception: it still ends the loop
            if on_failure is OnFailure.EXIT:
                log.error("background loop failed: ending it", extra=kv(loop=name, error=exc))
                raise
            message = f"{type(exc).__name__}: {exc}"
            if message != failing:
                log.error(
                    "background loop round failed: going on",
                    extra=kv(loop=name, error=message, policy=on_failure.value),
                )
                failing = message
            if not_ready is not None and on_failure is OnFailure.NOT_READY:
                not_ready(f"{name}: {message}")
            await asyncio.sleep(pause)
            continue
        if failing:
            log.info("background loop round succeeded again", extra=kv(loop=name))
            failing = ""
            if ready is not None and on_failure is OnFailure.NOT_READY:
                ready()
