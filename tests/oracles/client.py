"""The Python side of the reference oracle: one Go process, cases streamed through it.

``Oracle.ask`` sends every case as one JSON line and reads one answer line per case, in
order. A writer thread feeds stdin while the caller reads stdout, so neither pipe fills
up whatever the number of cases. See ``cmd/oracle/main.go`` for the case and answer shapes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any


class OracleError(Exception):
    """The oracle process failed or answered out of turn."""


class Oracle:
    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen(
            [str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1 << 16,
        )

    def ask(self, cases: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Answers to ``cases``, in order; each case gets an ``id`` if it has none."""
        numbered = [{**c, "id": c.get("id", i)} for i, c in enumerate(cases)]
        stdin, stdout = self._pipes()
        failure: list[BaseException] = []

        def feed() -> None:
            try:
                for case in numbered:
                    stdin.write(json.dumps(case, separators=(",", ":")) + "\n")
                stdin.flush()
            except (OSError, ValueError) as exc:  # a dead process: the reader reports it
                failure.append(exc)

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        finished = False
        try:
            for case in numbered:
                line = stdout.readline()
                if not line:
                    raise OracleError(f"oracle exited: {self._stderr_tail()}")
                answer: dict[str, Any] = json.loads(line)
                if answer.get("id") != case["id"]:
                    raise OracleError(f"answer {answer.get('id')} for case {case['id']}")
                yield answer
            finished = True
        finally:
            if not finished:
                # The caller stopped early: a writer blocked on a full pipe only gets out
                # when the process goes, and the process is out of step anyway.
                self._proc.kill()
            writer.join(timeout=30)
        if failure:
            raise OracleError(f"writing cases failed: {failure[0]}")

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        if self._proc.stdin is None or self._proc.stdout is None:
            raise OracleError("oracle pipes are closed")
        return self._proc.stdin, self._proc.stdout

    def _stderr_tail(self) -> str:
        self._proc.kill()
        _, err = self._proc.communicate(timeout=10)
        return (err or "")[-2000:] or f"exit status {self._proc.returncode}"

    def close(self) -> None:
        if self._proc.poll() is None:
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Oracle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
