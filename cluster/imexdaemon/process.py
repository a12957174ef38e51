"""``nvidia-imex`` as a supervised child: started on demand, restarted with backoff, signalled.

NVIDIA's process manager looks every second whether the child has exited and restarts it at
once, however often it dies. Here the exit is awaited (a restart needs no tick), and restarts
back off from 1 s to 60 s, reset once a run lasts a minute: an IMEX that refuses its config
would otherwise restart, and log, every second for as long as the pod lives.

Its stdout and stderr are the daemon's, as NVIDIA passes them through: the pod's log has both.
"""

import asyncio
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from driver.common.errors import PermanentError
from driver.common.logs import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    first: float = 1.0
    most: float = 60.0
    stable_after: float = 60.0  # a run this long resets the delay to ``first``

    def after(self, delay: float | None, ran_for: float) -> float:
        """The delay before the next start, given the previous delay and how long it ran."""
        if delay is None or ran_for >= self.stable_after:
            return self.first
        return min(delay * 2, self.most)


def _describe(code: int) -> dict[str, object]:
    # asyncio gives -N for a child killed by signal N.
    if code < 0:
        return {"signal": signal.Signals(-code).name}
    return {"exit_code": code}


class ImexProcess:
    """One child process at a time; :meth:`run` supervises it until cancelled.

    Nothing starts until :meth:`ensure_started`, so IMEX first runs once the hosts file maps
    the first peers, as NVIDIA starts it on the first peer update. :meth:`reread` tells the
    running child to read its node config and resolve the names again (SIGUSR1), unless it
    was started after the last change and so has read it already.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        backoff: Backoff = Backoff(),
        stop_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = tuple(argv)
        self._backoff = backoff
        self._stop_timeout = stop_timeout
        self._env = dict(env) if env is not None else None
        self._wanted = asyncio.Event()
        self._child: asyncio.subprocess.Process | None = None
        self._changes = 0  # how many changes were made to what the child reads
        self._seen = 0  # how many of them the running child has read
        self.starts = 0
        self.signals = 0
        self.running = asyncio.Event()  # set while a child runs: for tests and readiness

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def ensure_started(self) -> None:
        self._wanted.set()

    def reread(self) -> bool:
        """Record a change; SIGUSR1 to a child that has not read it. True when signalled."""
        self._changes += 1
        child = self._child
        if child is None or child.returncode is not None or self._seen == self._changes:
            return False
        try:
            child.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            return False  # exited in between: its restart reads the change
        self._seen = self._changes
        self.signals += 1
        return True

    async def run(self) -> None:
        await self._wanted.wait()
        delay: float | None = None
        while True:
            started = time.monotonic()
            await self._start()
            try:
                code = await self._wait()
            except asyncio.CancelledError:
                await self._stop()
                raise
            ran_for = time.monotonic() - started
            delay = self._backoff.after(delay, ran_for)
            log.warning(
                "nvidia-imex exited: restarting it",
                extra=kv(**_describe(code), ran_for_s=round(ran_for, 3), restart_in_s=delay),
            )
            await asyncio.sleep(delay)

    async def _start(self) -> None:
        self._seen = self._changes  # a fresh child reads everything at its start
        try:
            self._child = await asyncio.create_subprocess_exec(*self._argv, env=self._env)
        except OSError as exc:
            raise PermanentError(f"cannot start {self._argv[0]}: {exc.strerror}") from exc
        self.starts += 1
        self.running.set()
        log.info(
            "nvidia-imex started",
            extra=kv(pid=self._child.pid, command=" ".join(self._argv), starts=self.starts),
        )

    async def _wait(self) -> int:
        assert self._child is not None
        try:
            return await self._child.wait()
        finally:
            if self._child.returncode is not None:
                self._child = None
                self.running.clear()

    async def _stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout``: a hung IMEX must not hold the pod."""
        child = self._child
        if child is None or child.returncode is not None:
            return
        log.info("stopping nvidia-imex", extra=kv(pid=child.pid))
        child.terminate()
        try:
            await asyncio.wait_for(child.wait(), self._stop_timeout)
        except TimeoutError:
            log.warning("nvidia-imex ignored SIGTERM: killing it", extra=kv(pid=child.pid))
            child.kill()
            await child.wait()
        self._child = None
        self.running.clear()
