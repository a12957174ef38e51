"""The readiness check the daemon pod's probes run: ``nvidia-imex-ctl -c <config> -q``.

As NVIDIA's ``check``: a node without a clique is ready at once (nothing runs there, and the
controller counts such a pod Ready from the pod's own readiness); otherwise the local IMEX is
asked once, and only an exit status of 0 with exactly ``READY`` and a newline is ready.
"""

import asyncio
from dataclasses import dataclass
from pathlib import Path

from cluster.imexdaemon.peers import has_clique

READY = "READY\n"
NO_CLIQUE = "check succeeded (noop, clique ID is empty)"


@dataclass(frozen=True, slots=True)
class Result:
    ready: bool
    line: str  # what the probe prints: the reason when not ready


def judge(returncode: int, output: str, ctl: str) -> Result:
    """Pure: what ``nvidia-imex-ctl``'s exit status and combined output mean."""
    shown = " ".join(output.split())[:200] or "(no output)"
    if returncode != 0:
        return Result(False, f"IMEX daemon check failed: {ctl} exited {returncode}: {shown}")
    if output != READY:
        return Result(False, f"IMEX daemon not ready: {shown}")
    return Result(True, "IMEX daemon ready")


async def check(*, clique_id: str, ctl: str, config: Path, limit: float = 8.0) -> Result:
    """Run the check; ``limit`` (seconds) stays under the probes' 10 s so the answer is ours."""
    if not has_clique(clique_id):
        return Result(True, NO_CLIQUE)
    try:
        proc = await asyncio.create_subprocess_exec(
            ctl,
            "-c",
            str(config),
            "-q",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        return Result(False, f"IMEX daemon check failed: cannot run {ctl}: {exc.strerror}")
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return Result(False, f"IMEX daemon check failed: {ctl} gave no answer in {limit:g} s")
    return judge(proc.returncode or 0, out.decode(errors="replace"), ctl)
