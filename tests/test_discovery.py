import ctypes
import inspect
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pynvml
import pytest
import yaml

from driver.common.errors import PermanentError, RetryableError
from driver.nvml import Nvml, backend
from driver.nvml.faults import Faults, QueryFault, SimulationConfigError, write_state_file
from driver.nvml.library import OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS
from driver.nvml.profile import UnknownProfileError, load_profile, profile_names
from driver.nvml.sim.build import library as built_library
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import (
    NvmlMissingError,
    NvmlNotReadyError,
    discover,
    normalize_pci_bus_id,
)
from drivers.gpu.model.inventory import Inventory


def _node(
    tmp_path: Path, profile: str = "p5.48xlarge", name: str = "node-a", **kw: object
) -> SimulatedNode:
    return SimulatedNode(profile, name, tmp_path / name, **kw)  # type: ignore[arg-type]


def _discover(node: SimulatedNode) -> Inventory:
    return discover(node.nvml, sysfs_root=node.sysfs_root)


def test_every_shipped_profile_is_discovered(tmp_path: Path) -> None:
    names = profile_names()
    assert {"p5.48xlarge", "p5e.48xlarge", "p4d.24xlarge", "p6-b200.48xlarge"} <= set(names)
    assert {"g6e.12xlarge", "g6e.48xlarge", "g6.xlarge", "g5.48xlarge"} <= set(names)
    for name in names:
        node = _node(tmp_path, name)
        inventory = _discover(node)
        assert len(inventory.gpus) == node.profile.count, name
        assert inventory.skipped == ()


def test_p5_facts(tmp_path: Path) -> None:
    inventory = _discover(_node(tmp_path))
    assert inventory.driver_version == "580.95.05"
    assert inventory.cuda_driver_version == (13, 0)
    gpus = inventory.gpus
    assert [g.device_name for g in gpus] == [f"gpu-{i}" for i in range(8)]
    assert {g.product_name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.architecture for g in gpus} == {"Hopper"}
    assert {g.brand for g in gpus} == {"Nvidia"}
    assert {g.cuda_compute_capability for g in gpus} == {(9, 0)}
    assert {g.memory_bytes for g in gpus} == {81559 * 1024 * 1024}
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0].pci_bus_id == "0000:53:00.0"
    assert gpus[5].pci_bus_id == "0000:a8:00.0"  # NVML says 00000000:A8:00.0
    assert gpus[0].pcie_root == "pci0000:44"
    # All eight sit behind the NVSwitches: one clique. p5 fabric info is all-zero: no fabric.
    assert {g.nvlink_clique for g in gpus} == {0}
    assert {g.fabric_cluster_uuid for g in gpus} == {None}
    assert len({g.uuid for g in gpus}) == 8


def test_two_nodes_get_different_uuids(tmp_path: Path) -> None:
    a = _discover(_node(tmp_path, name="node-a"))
    b = _discover(_node(tmp_path, name="node-b"))
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in b.gpus}
    again = _discover(_node(tmp_path, name="node-a"))
    assert [g.uuid for g in again.gpus] == [g.uuid for g in a.gpus]


def test_pcie_only_node_has_no_cliques(tmp_path: Path) -> None:
    inventory = _discover(_node(tmp_path, "g6e.12xlarge"))
    assert len(inventory.gpus) == 4
    assert {g.nvlink_clique for g in inventory.gpus} == {None}
    assert {g.architecture for g in inventory.gpus} == {"Ada Lovelace"}
    assert {g.mig_enabled for g in inventory.gpus} == {False}


def test_bridged_pairs_are_two_cliques(tmp_path: Path) -> None:
    inventory = _discover(_node(tmp_path, "synthetic-bridged-pairs"))
    assert [g.nvlink_clique for g in inventory.gpus] == [0, 0, 1, 1]


def test_non_transitive_links_from_a_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "chain.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "count": 3,
                "gpu": {
                    "name": "NVIDIA A100 80GB PCIe",
                    "brand": "NVIDIA",
                    "architecture": "AMPERE",
                    "computeCapability": "8.0",
                    "memoryMiB": 81920,
                },
                "nvlink": {"topology": "links", "links": [[0, 1], [1, 2]], "linksPerGpu": 2},
            }
        )
    )
    inventory = _discover(_node(tmp_path, str(profile)))
    assert [g.nvlink_clique for g in inventory.gpus] == [0, 0, None]


def test_fabric_identity_only_when_complete_and_nonzero(tmp_path: Path) -> None:
    node = _node(tmp_path, "p6e-gb200.36xlarge")
    gpus = _discover(node).gpus
    assert {g.fabric_clique_id for g in gpus} == {32766}
    (cluster,) = {g.fabric_cluster_uuid for g in gpus}
    assert cluster is not None and len(cluster) == 36
    for state in ("zero", "in-progress", "not-supported", "none"):
        node.nvml.faults = Faults(fabric=state)
        gpus = _discover(node).gpus
        assert {(g.fabric_cluster_uuid, g.fabric_clique_id) for g in gpus} == {(None, None)}
        assert {g.nvlink_clique for g in gpus} == {0}  # local NVLink is still there


def test_fabric_cluster_shared_by_seed(tmp_path: Path) -> None:
    rack = Faults(fabric_cluster="rack-7")
    a = _discover(_node(tmp_path, "p6e-gb200.36xlarge", "gb-a", faults=rack))
    b = _discover(_node(tmp_path, "p6e-gb200.36xlarge", "gb-b", faults=rack))
    c = _discover(_node(tmp_path, "p6e-gb200.36xlarge", "gb-c"))
    assert a.gpus[0].fabric_cluster_uuid == b.gpus[0].fabric_cluster_uuid
    assert a.gpus[0].fabric_cluster_uuid != c.gpus[0].fabric_cluster_uuid


def test_failing_gpu_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fault = QueryFault(gpu=3, call="nvmlDeviceGetUUID", error="GpuIsLost")
    node = _node(tmp_path, faults=Faults(failing_queries=(fault,)))
    with caplog.at_level(logging.WARNING, logger="drivers.gpu.model.discovery"):
        inventory = _discover(node)
    assert [g.minor for g in inventory.gpus] == [0, 1, 2, 4, 5, 6, 7]
    (skipped,) = inventory.skipped
    assert (skipped.index, skipped.pci_bus_id) == (3, "0000:86:00.0")
    assert "GPU is lost" in skipped.error
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (record.index, record.pci_bus_id) == (3, "0000:86:00.0")  # type: ignore[attr-defined]
    assert "GPU is lost" in record.error  # type: ignore[attr-defined]
    # The remaining seven still form one NVLink clique.
    assert {g.nvlink_clique for g in inventory.gpus} == {0}


def test_failing_handle_is_skipped_without_bus_id(tmp_path: Path) -> None:
    fault = QueryFault(gpu=0, call="nvmlDeviceGetHandleByIndex")
    inventory = _discover(_node(tmp_path, faults=Faults(failing_queries=(fault,))))
    assert len(inventory.gpus) == 7
    assert inventory.skipped[0].pci_bus_id is None


def test_gpu_disappears_between_discoveries(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    node = _node(tmp_path, state_file=state)
    assert len(_discover(node).gpus) == 8
    write_state_file(state, {"removedGpus": [2]})
    inventory = _discover(node)
    # NVML re-indexes the survivors; minor numbers (device names) stay.
    assert [(g.index, g.minor) for g in inventory.gpus][1:3] == [(1, 1), (2, 3)]
    assert "gpu-2" not in inventory.by_device_name()
    assert inventory.skipped == ()
    state.unlink()
    assert len(_discover(node).gpus) == 8


def test_handle_of_a_lost_gpu_raises_gpu_is_lost(tmp_path: Path) -> None:
    node = _node(tmp_path)
    nvml = node.nvml
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(4)
    nvml.faults = Faults(removed_gpus=frozenset({4}))
    nvml.nvmlInit()  # a re-init sees the bus as it is now
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(handle)
    nvml.nvmlShutdown()
    nvml.nvmlShutdown()


def test_nvml_missing_is_permanent_and_one_line(tmp_path: Path) -> None:
    node = _node(tmp_path, faults=Faults(nvml="missing"))
    with pytest.raises(NvmlMissingError) as info:
        _discover(node)
    assert isinstance(info.value, PermanentError)
    assert isinstance(info.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    assert "\n" not in str(info.value) and "libnvidia-ml" in str(info.value)


def test_driver_not_loaded_is_retryable_never_zero_gpus(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"nvml": "not-loaded"})
    node = _node(tmp_path, state_file=state)
    with pytest.raises(NvmlNotReadyError) as info:
        _discover(node)
    assert isinstance(info.value, RetryableError)
    write_state_file(state, {"nvml": "ok"})  # the driver finished installing
    assert len(_discover(node).gpus) == 8


def test_driver_versions_from_state_file_and_profile(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"driverVersion": "535.104.05", "cudaDriverVersion": "12.2"})
    inventory = _discover(_node(tmp_path, state_file=state))
    assert (inventory.driver_version, inventory.cuda_driver_version) == ("535.104.05", (12, 2))


def test_env_var_names_the_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"nvml": "missing"})
    monkeypatch.setenv("GPU_DRA_SIM_STATE", str(state))
    with (
        backend("simulated", profile="g6.xlarge") as (nvml, sysfs_root),
        pytest.raises(NvmlMissingError),
    ):
        discover(nvml, sysfs_root=sysfs_root)


def test_nvml_is_shut_down_after_discovery(tmp_path: Path) -> None:
    node = _node(tmp_path)
    _discover(node)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        node.nvml.nvmlDeviceGetCount()


def test_missing_sysfs_leaves_root_and_numa_unknown(tmp_path: Path) -> None:
    node = _node(tmp_path)
    inventory = discover(node.nvml, sysfs_root=tmp_path / "empty")
    assert len(inventory.gpus) == 8
    assert {(g.pcie_root, g.numa_node) for g in inventory.gpus} == {(None, None)}


def test_fabric_struct_is_filled_through_a_pointer(tmp_path: Path) -> None:
    nvml = _node(tmp_path, "p6e-gb200.36xlarge").nvml
    nvml.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), ctypes.pointer(info))
    nvml.nvmlShutdown()
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert any(bytes(info.clusterUuid)) and info.cliqueId == 32766


def test_normalize_pci_bus_id() -> None:
    assert normalize_pci_bus_id("00000000:A8:00.0") == "0000:a8:00.0"
    assert normalize_pci_bus_id("00000008:01:00.0") == "0008:01:00.0"


def test_bad_profile_and_state_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UnknownProfileError, match=r"p5\.48xlarge"):
        load_profile("p9.huge")
    no_xid = tmp_path / "no-xid.yaml"  # XIDs are the one event the library delivers
    gpu = "{name: X, brand: NVIDIA, architecture: HOPPER, computeCapability: '9.0', memoryMiB: 1"
    no_xid.write_text(f"extends: p5.48xlarge\ngpu: {gpu}, supportedEventTypes: 2}}\n")
    with pytest.raises(SimulationConfigError, match="supportedEventTypes"):
        load_profile(no_xid)
    state = tmp_path / "state.yaml"
    state.write_text("failingQueries: [{gpu: 1, call: nvmlDeviceGetUUID, error: Nope}]\n")
    node = _node(tmp_path, state_file=state)
    with pytest.raises(SimulationConfigError, match="NVMLError_Nope"):
        _discover(node)


def test_real_nvml_without_a_driver_is_missing(tmp_path: Path) -> None:
    # Its own process: this one has loaded the simulated library, which the loader would
    # hand back for any later dlopen of the soname.
    code = textwrap.dedent(
        """
        import ctypes, sys
        from pathlib import Path
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            pass
        else:
            sys.exit(3)
        from drivers.gpu.model.discovery import discover
        from driver.nvml import backend
        from driver.nvml.library import LibraryNotFoundError
        try:
            with backend("system", driver_root=Path(sys.argv[1])) as (nvml, root):
                discover(nvml, sysfs_root=root)
        except LibraryNotFoundError as exc:
            print(exc)
            sys.exit(4)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=False
    )
    if result.returncode == 3:
        pytest.skip("this machine has the NVIDIA driver; the no-driver path cannot be shown")
    assert result.returncode == 4, result.stderr
    assert "libnvidia-ml.so.1" in result.stdout and str(tmp_path / "usr/lib64") in result.stdout


def _bound_symbols(name: str) -> set[str]:
    """The C symbols a pynvml function binds, following the pynvml functions it calls."""
    source = inspect.getsource(getattr(pynvml, name))
    bound = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    if bound:
        return bound
    called = set(re.findall(r"\b(nvml\w+)\(", source)) - {name}
    return {symbol for callee in called for symbol in _bound_symbols(callee)}


def test_every_function_we_call_is_a_symbol_of_the_simulated_library() -> None:
    names = [name for name in vars(Nvml) if name.startswith("nvml")]
    assert len(names) == 37  # 29, and 8 for dynamic MIG
    bound = {symbol for name in names for symbol in _bound_symbols(name)}
    # pynvml binds the _v2 only when given a struct version, which discovery never passes.
    bound.remove("nvmlDeviceGetMemoryInfo_v2")
    # And the MIG profile queries bind their V variant (version 2, pynvml's default).
    bound -= {"nvmlDeviceGetGpuInstanceProfileInfo", "nvmlGpuInstanceGetComputeInstanceProfileInfo"}
    assert {"nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetPciInfo_v3"} <= bound
    # The table the loader checks a node's library against is exactly what pynvml binds.
    assert bound | {"nvmlErrorString"} == set(REQUIRED_SYMBOLS) | set(OPTIONAL_SYMBOLS)
    lib = ctypes.CDLL(str(built_library()))
    assert [s for s in sorted(bound | {"nvmlErrorString"}) if not hasattr(lib, s)] == []
