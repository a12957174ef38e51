"""The sweep at start ends what a killed run left, and never a process that reused its pid."""

import os
import subprocess
from pathlib import Path

from tests.e2e.cluster import sweep


def test_sweep_kills_the_runs_leftovers_and_spares_a_reused_pid(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "pids").mkdir(parents=True)
    sleep = "/bin/sleep"
    left = subprocess.Popen([sleep, "60"], start_new_session=True)
    (root / "pids" / "leftover").write_text(f"{left.pid} {sleep}")
    # This test's own pid, recorded as if an earlier run's etcd had had it.
    (root / "pids" / "reused").write_text(f"{os.getpid()} /cache/etcd")
    sweep(root)
    assert left.wait(timeout=10) == -9
    assert not root.exists()
