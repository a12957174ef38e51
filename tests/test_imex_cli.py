"""``gpu-dra compute-domain-daemon``: NVIDIA's variables, its refusals in one line (no CDI
edits, a driver below 570.158.01, no peer source), and a node without a clique, which runs
nothing and whose check succeeds."""

import asyncio
import sys
from pathlib import Path

import pytest

from cli import build_parser
from tests.imexharness import ROOT, Daemon, clique, loopback_block, wait_for, write_peers


def test_nvidias_variables_set_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIQUE_ID", "uuid.7")
    monkeypatch.setenv("COMPUTE_DOMAIN_UUID", "cd-uid")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("MAX_NODES_PER_IMEX_DOMAIN", "9")
    monkeypatch.setenv("GPU_DRA_HOSTS_FILE", "/tmp/hosts")
    args = build_parser().parse_args(["compute-domain-daemon"])
    assert (args.action, args.clique_id, args.compute_domain_uuid) == ("run", "uuid.7", "cd-uid")
    assert (args.pod_ip, args.max_nodes_per_imex_domain) == ("10.1.2.3", 9)
    assert args.hosts_file == "/tmp/hosts"
    assert build_parser().parse_args(["compute-domain-daemon", "check"]).action == "check"


@pytest.mark.parametrize("value", ["0", "10000", "many"])
def test_a_max_nodes_without_four_digit_names_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["compute-domain-daemon", "--max-nodes-per-imex-domain", value])
    assert exited.value.code == 2
    assert "expected a number of nodes from 1 to 9999" in capsys.readouterr().err


async def _exits(daemon: Daemon, wait_s: float = 30) -> tuple[int, str]:
    assert daemon.proc is not None
    code = await asyncio.wait_for(daemon.proc.wait(), wait_s)
    return code, daemon.log.read_text()


def _error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if not line.startswith("time=")]


async def test_a_driver_below_the_floor_is_refused_in_one_line(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, node="old", ip=loopback_block(1)[0])
    state = tmp_path / "nvml-state.yaml"
    state.write_text('driverVersion: "565.57.01"\n')
    peers = tmp_path / "clique.json"
    write_peers(peers, clique([("old", daemon.ip, 0)]))
    await daemon.start(peers, "--sim-state", str(state))
    code, log = await _exits(daemon)
    assert code == 1
    assert _error_lines(log) == [
        "gpu-dra compute-domain-daemon: NVIDIA driver 565.57.01 is older than 570.158.01, "
        "the first whose IMEX daemon ComputeDomains can run (DNS names): upgrade the node's "
        "driver"
    ]
    assert not daemon.events.exists() and not (daemon.dir / "imexd").exists()


async def test_without_cdi_edits_it_says_so_as_nvidia_does(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, node="n", ip=loopback_block(1)[0])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli",
        "compute-domain-daemon",
        "run",
        env=daemon.env(),
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 1
    assert err.decode() == (
        "gpu-dra compute-domain-daemon: CDI container edits did not apply -- is CDI enabled "
        "in your container runtime?\n"
    )


async def test_without_its_pod_it_says_which_variables_to_set(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, node="n", ip=loopback_block(1)[0])
    await daemon.start(tmp_path / "unused", "--peers-file", "")
    code, log = await _exits(daemon)
    assert code == 1
    assert _error_lines(log) == [
        "gpu-dra compute-domain-daemon: --driver-namespace (POD_NAMESPACE), --pod-name "
        "(POD_NAME), --pod-uid (POD_UID) required: the daemon writes itself into its clique in "
        "the API server (or give --peers-file to follow a file instead)"
    ]


async def test_a_node_without_a_clique_idles_and_is_ready(tmp_path: Path) -> None:
    # A zero cluster UUID: the node driver passes an empty clique ID.
    daemon = Daemon(tmp_path, node="h100", ip=loopback_block(1)[0], clique_id="")
    hosts = daemon.hosts.read_text()
    await daemon.start(tmp_path / "no-such-peers-file")
    await wait_for(lambda: daemon.logged("no clique ID: IMEX is not started") == 1, "idle line")
    assert await daemon.check() == (0, "check succeeded (noop, clique ID is empty)\n")
    assert await daemon.stop() == 0
    assert daemon.hosts.read_text() == hosts
    assert not daemon.events.exists() and not (daemon.dir / "imexd").exists()
