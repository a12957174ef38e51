"""How the long-running commands run: their main coroutine in one event loop, a permanent
error as one line and exit status 1, and SIGTERM or SIGINT as a clean stop."""

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

EXIT_PERMANENT = 1


def run_main(command: str, main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """``main()``'s exit status; a :class:`PermanentError` is one line on stderr, status 1."""
    from driver.common.errors import PermanentError

    try:
        return asyncio.run(main())
    except PermanentError as exc:
        print(f"gpu-dra {command}: {exc}", file=sys.stderr)
        return EXIT_PERMANENT


async def until_stopped(
    work: Coroutine[Any, Any, object], name: str, *, hup: Callable[[], None] | None = None
) -> None:
    """Run ``work`` as a task until it ends, or until SIGTERM or SIGINT cancel it: a stop
    asked for, not an error. SIGHUP calls ``hup`` where one is given."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(work, name=name)
    handled = [signal.SIGTERM, signal.SIGINT]
    for sig in handled:
        loop.add_signal_handler(sig, task.cancel)
    if hup is not None:
        loop.add_signal_handler(signal.SIGHUP, hup)
        handled.append(signal.SIGHUP)
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # we were cancelled ourselves, not by a signal
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
