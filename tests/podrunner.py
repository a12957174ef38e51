"""The kubelet's part for the pods pinned to one node of the local API server: each pod's
one container run as a host process (its command and environment; a hostPath volume shows
a host path at the same path, so none is translated), its status written back as the
kubelet writes it, and the process killed when the pod is deleted.

Enough of a kubelet for the MPS control daemon pods (``drivers.gpu.kinds.mpspod``): a pod
that was created, runs and serves, exits (Succeeded; a failure under ``OnFailure`` shows
as ``CrashLoopBackOff`` with its exit code, without the restart after the back-off), or is
deleted. The real kubelet runs them in level 3 (``tests/e2e/test_level3.py``).
"""

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from sandbox.apiserver import LocalApiServer

_POLL_S = 0.05


class PodRunner:
    def __init__(self, apiserver: LocalApiServer, node_name: str) -> None:
        self._apiserver = apiserver
        self._node = node_name
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # pod UID -> its container
        self._done: set[str] = set()  # pod UIDs whose container exited
        self.started: list[str] = []  # pod names, once per container start
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "PodRunner":
        self._task = asyncio.create_task(self._run(), name=f"pod-runner-{self._node}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for proc in self._procs.values():
            self._kill(proc)

    def pods(self) -> list[dict[str, Any]]:
        return [
            p for p in self._apiserver.objects("pods") if p["spec"].get("nodeName") == self._node
        ]

    def running(self) -> int:
        return sum(proc.poll() is None for proc in self._procs.values())

    async def _run(self) -> None:
        while True:
            self._step()
            await asyncio.sleep(_POLL_S)

    def _step(self) -> None:
        # No await in here: the API server serves on this loop, so what is read stays true
        # until the status is written (a pod deleted meanwhile is not written back to life).
        pods = {p["metadata"]["uid"]: p for p in self.pods()}
        for uid in list(self._procs):
            if uid not in pods:  # deleted: the kubelet stops its container
                self._kill(self._procs.pop(uid))
        for uid, pod in pods.items():
            proc = self._procs.get(uid)
            if proc is None:
                self._procs[uid] = self._start(pod)
                self.started.append(pod["metadata"]["name"])
                self._apiserver.put({**pod, "status": _running()})
            elif uid not in self._done and proc.poll() is not None:
                self._done.add(uid)
                self._apiserver.put({**pod, "status": _exited(pod, proc.returncode)})

    @staticmethod
    def _start(pod: Mapping[str, Any]) -> "subprocess.Popen[bytes]":
        (container,) = pod["spec"]["containers"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        env.update({e["name"]: e["value"] for e in container.get("env", [])})
        return subprocess.Popen(
            [*container.get("command", []), *container.get("args", [])],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @staticmethod
    def _kill(proc: "subprocess.Popen[bytes]") -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _running() -> dict[str, Any]:
    state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    return {"phase": "Running", "containerStatuses": [{"name": "c", "ready": True, "state": state}]}


def _exited(pod: Mapping[str, Any], code: int) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    if code == 0 or pod["spec"].get("restartPolicy") == "Never":
        phase = "Succeeded" if code == 0 else "Failed"
        status = {"name": "c", "ready": False, "state": {"terminated": terminated}}
        return {"phase": phase, "containerStatuses": [status]}
    waiting = {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}
    status = {"name": "c", "ready": False, "state": {"waiting": waiting},
              "lastState": {"terminated": terminated}, "restartCount": 1}  # fmt: skip
    return {"phase": "Running", "containerStatuses": [status]}
