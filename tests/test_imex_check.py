"""The probe's check: as NVIDIA's, ready only on exit status 0 with exactly READY and a
newline; a node without a clique is ready at once."""

import asyncio
import stat
import sys
from pathlib import Path

import pytest

from cluster.imexdaemon.check import NO_CLIQUE, Result, check, judge
from cluster.imexdaemon.imexconfig import render_config, render_nodes
from tests import imexstandin
from tests.imexharness import CLIQUE, count, loopback_block, wait_for


@pytest.mark.parametrize(
    ("code", "output", "ready", "line"),
    [
        (0, "READY\n", True, "IMEX daemon ready"),
        (0, "NOT_READY\n", False, "IMEX daemon not ready: NOT_READY"),
        (0, "READY", False, "IMEX daemon not ready: READY"),
        (0, "READY\nREADY\n", False, "IMEX daemon not ready: READY READY"),
        (1, "READY\n", False, "IMEX daemon check failed: ctl exited 1: READY"),
        (3, "", False, "IMEX daemon check failed: ctl exited 3: (no output)"),
    ],
)
def test_only_exactly_ready_is_ready(code: int, output: str, ready: bool, line: str) -> None:
    assert judge(code, output, "ctl") == Result(ready, line)


async def test_no_clique_is_ready_without_asking_imex(tmp_path: Path) -> None:
    result = await check(clique_id="", ctl=str(tmp_path / "missing"), config=tmp_path / "c")
    assert result.ready and result.line == NO_CLIQUE


async def test_a_missing_ctl_is_not_ready(tmp_path: Path) -> None:
    result = await check(clique_id=CLIQUE, ctl=str(tmp_path / "missing"), config=tmp_path / "c")
    assert not result.ready and "cannot run" in result.line


async def test_a_ctl_that_hangs_is_not_ready_within_the_limit(tmp_path: Path) -> None:
    ctl = tmp_path / "hung-ctl"
    ctl.write_text(f"#!{sys.executable}\nimport signal\nsignal.pause()\n")
    ctl.chmod(ctl.stat().st_mode | stat.S_IXUSR)
    result = await check(clique_id=CLIQUE, ctl=str(ctl), config=tmp_path / "c", limit=0.5)
    assert not result.ready and "gave no answer in 0.5 s" in result.line


async def test_the_stand_ins_answer_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imex, ctl = imexstandin.install(tmp_path / "bin")
    ip = loopback_block(1)[0]
    config, nodes, hosts = tmp_path / "imexd.cfg", tmp_path / "nodes.cfg", tmp_path / "hosts"
    config.write_text(render_config(cmd_bind_ip=ip, nodes_config_path=str(nodes)))
    nodes.write_text(render_nodes(18))
    hosts.write_text(f"{ip}\tcompute-domain-daemon-0000\n")
    monkeypatch.setenv("IMEX_STANDIN_HOSTS", str(hosts))
    monkeypatch.setenv("IMEX_STANDIN_EVENTS", str(tmp_path / "events"))
    down = await check(clique_id=CLIQUE, ctl=str(ctl), config=config)
    assert not down.ready and "cannot reach the IMEX command service" in down.line
    proc = await asyncio.create_subprocess_exec(str(imex), "-c", str(config))
    try:
        await wait_for(lambda: count(tmp_path / "events", "start") == 1, "the stand-in")
        up = await check(clique_id=CLIQUE, ctl=str(ctl), config=config)
        assert up.ready
    finally:
        proc.terminate()
        await proc.wait()
