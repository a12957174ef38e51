import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli import main
from driver.nvml.faults import write_state_file
from tests.simroot import host_has_nvml

SIM = ["discover", "--nvml", "simulated", "--node-name", "demo-node"]


def _gpu_dra(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPU_DRA_SIM_STATE"}
    if state is not None:
        env["GPU_DRA_SIM_STATE"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_yaml_output_is_the_resource_slices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--profile", "p5.48xlarge", "-o", "yaml"]) == 0
    (slice_,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert slice_["kind"] == "ResourceSlice"
    assert [d["name"] for d in slice_["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_json_output_lists_every_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--profile", "synthetic-200gpu", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "List"
    assert [len(s["spec"]["devices"]) for s in document["items"]] == [128, 72]


def test_table_has_one_row_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--profile", "p5.48xlarge", "-o", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node demo-node: 8 device(s), driver 580.95.05, CUDA 13.0")
    header, *rows = lines[2:]
    assert header.split() == [
        "DEVICE",
        "TYPE",
        "MODEL",
        "MEMORY",
        "NUMA",
        "PCI",
        "BUS",
        "ID",
        "NVLINK",
        "DOMAIN",
    ]
    assert len(rows) == 8
    assert rows[4].split() == [
        "gpu-4", "gpu", "NVIDIA-H100-80GB-HBM3", "81559", "MiB", "1", "0000:97:00.0",
        "demo-node.nvlink-0",
    ]  # fmt: skip


def test_table_lists_mig_devices_instead_of_their_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--profile", "p4d.24xlarge-mig", "-o", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node demo-node: 16 device(s)")
    rows = [line.split() for line in lines[3:]]
    assert [r[0] for r in rows[:4]] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert rows[4][:6] == [
        "gpu-0-mig-3g20gb-9-0", "mig", "3g.20gb", "NVIDIA-A100-SXM4-40GB", "19968", "MiB"
    ]  # fmt: skip
    assert [r[0] for r in rows[5:7]] == ["gpu-0-mig-2g10gb-14-4", "gpu-0-mig-1g10gb-15-6"]


def test_table_marks_missing_nvlink_and_lists_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"failingQueries": [{"gpu": 1, "call": "nvmlDeviceGetName"}]})
    code = main([*SIM, "--profile", "g6e.12xlarge", "-o", "table", "--sim-state", str(state)])
    out = capsys.readouterr().out
    assert code == 0
    assert "node demo-node: 3 device(s)" in out
    assert all(line.rstrip().endswith(" -") for line in out.splitlines()[3:6])
    assert "skipped GPU index 1 (PCI 0000:3a:00.0): Unknown Error" in out


def test_failing_gpu_yields_seven_devices_and_a_warning(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"failingQueries": [{"gpu": 6, "call": "nvmlDeviceGetMemoryInfo"}]})
    result = _gpu_dra(*SIM, "--profile", "p5.48xlarge", "-o", "yaml", state=state)
    assert result.returncode == 0, result.stderr
    (slice_,) = list(yaml.safe_load_all(result.stdout))
    assert len(slice_["spec"]["devices"]) == 7
    assert "gpu-6" not in {d["name"] for d in slice_["spec"]["devices"]}
    (warning,) = [line for line in result.stderr.splitlines() if "level=warning" in line]
    assert "index=6" in warning and "pci_bus_id=0000:b9:00.0" in warning
    assert 'error="Unknown Error"' in warning


def test_nvml_missing_is_one_line_and_nonzero(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"nvml": "missing"})
    result = _gpu_dra(*SIM, "--profile", "p5.48xlarge", state=state)
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpu-dra discover: NVML library libnvidia-ml.so.1 not found")


def test_driver_not_loaded_exits_retryable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"nvml": "not-loaded"})
    assert main([*SIM, "--profile", "g6.xlarge", "--sim-state", str(state)]) == 75
    captured = capsys.readouterr()
    assert captured.out == "" and "not ready" in captured.err


def test_unknown_profile_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--profile", "p9.huge"]) == 1
    err = capsys.readouterr().err
    assert "unknown hardware profile 'p9.huge'" in err and "p5.48xlarge" in err


def test_list_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--list-profiles"]) == 0
    assert "p6e-gb200.36xlarge" in capsys.readouterr().out.split()


def test_system_nvml_without_driver_fails_cleanly() -> None:
    if host_has_nvml():  # asked of a fresh process: this one has the simulated library
        pytest.skip("this machine has the NVIDIA driver; see the real-GPU run instead")
    result = _gpu_dra("discover", "--nvml", "system", "-o", "table")
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_help_is_complete() -> None:
    result = _gpu_dra("discover", "--help")
    assert result.returncode == 0
    for option in (
        "--nvml",
        "--profile",
        "--node-name",
        "--output",
        "--sim-state",
        "--driver-name",
    ):
        assert option in result.stdout


def test_invalid_names_are_rejected_before_printing(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["discover", "--nvml", "simulated", "--profile", "g6.xlarge", "--node-name", "My_Node"]
    )
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err.startswith("gpu-dra discover: invalid ResourceSlice: metadata.name:")


def test_simulated_node_is_named_for_its_profile(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two profiles' outputs, concatenated, must be two pools: the host's name would make one.
    monkeypatch.delenv("NODE_NAME", raising=False)
    names = []
    for profile in ("p5.48xlarge", "driver/nvml/profiles/g6e.48xlarge.yaml"):
        assert main(["discover", "--nvml", "simulated", "--profile", profile, "-o", "yaml"]) == 0
        (slice_,) = yaml.safe_load_all(capsys.readouterr().out)
        names.append(slice_["spec"]["nodeName"])
    assert names == ["sim-p5.48xlarge", "sim-g6e.48xlarge"]
    monkeypatch.setenv("NODE_NAME", "given")
    assert main(["discover", "--nvml", "simulated", "--profile", "p5.48xlarge", "-o", "table"]) == 0
    assert capsys.readouterr().out.startswith("node given:")
