"""libnvidia-ml.so.1 found under a driver root, and the simulated C library behind real pynvml.

``--nvml system`` runs are processes of their own (see tests/simroot.py); the C library's
own behaviour is driven here through pynvml, in this process.
"""

import ctypes
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pynvml
import pytest
import yaml

from driver.nvml import Nvml
from driver.nvml.faults import Faults, write_state_file
from driver.nvml.library import LIBRARY_DIRS, SONAME, candidates, find
from driver.nvml.sim import build
from driver.nvml.simulated import HARDWARE_ENV, SimulatedNode, SimulatedNvml
from drivers.gpu.model.discovery import NvmlMissingError, discover
from tests.simroot import NODE, fake_root, gpu_dra, host_has_nvml

# -- where the library is found ---------------------------------------------------------


def _install(lib_dir: Path, version: str = "580.95.05") -> Path:
    lib_dir.mkdir(parents=True, exist_ok=True)
    real = lib_dir / f"libnvidia-ml.so.{version}"
    real.write_bytes(b"\x7fELF placeholder")
    (lib_dir / SONAME).symlink_to(real.name)
    return real


@pytest.mark.parametrize("directory", LIBRARY_DIRS)
def test_found_in_each_distribution_layout(tmp_path: Path, directory: str) -> None:
    assert find(tmp_path) is None
    assert find(tmp_path) is None and tmp_path / directory / SONAME in candidates(tmp_path)
    real = _install(tmp_path / directory)
    assert find(tmp_path) == real


def test_al2023_wins_over_later_directories(tmp_path: Path) -> None:
    first = _install(tmp_path / "usr/lib64")
    _install(tmp_path / "usr/lib/x86_64-linux-gnu")
    assert find(tmp_path) == first


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    real = _install(tmp_path / "opt/nvidia/lib")
    lib64 = tmp_path / "usr/lib64"
    lib64.mkdir(parents=True)
    (lib64 / SONAME).symlink_to("/opt/nvidia/lib/libnvidia-ml.so.1")  # as seen from the root
    assert find(tmp_path) == real


def test_symlinks_never_lead_out_of_the_root(tmp_path: Path) -> None:
    outside = _install(tmp_path / "outside")
    root = tmp_path / "root"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64" / SONAME).symlink_to(outside)  # a host path: not in the root
    ubuntu = root / "usr/lib/x86_64-linux-gnu"
    ubuntu.mkdir(parents=True)
    (ubuntu / SONAME).symlink_to("../../../../outside/libnvidia-ml.so.1")  # .. stops at root
    (root / "lib64").mkdir()
    (root / "lib64" / SONAME).symlink_to(SONAME)  # a loop
    assert outside.is_file() and (ubuntu / SONAME).resolve() == outside.resolve()
    assert find(root) is None


def test_not_found_names_every_path_tried_and_what_to_set(tmp_path: Path) -> None:
    if host_has_nvml():
        pytest.skip("this machine has an NVIDIA driver on the default library path")
    _, env = fake_root(tmp_path / "unused")
    result = gpu_dra(
        "discover", "--nvml", "system", "--container-driver-root", str(tmp_path), env=env
    )
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    for path in candidates(tmp_path):
        assert str(path) in line
    assert "--container-driver-root" in line and "nvidiaDriverRoot" in line


# -- the real pynvml over the C library in a fake root ---------------------------------


def test_the_copy_under_the_root_is_the_one_mapped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _, env = fake_root(root)
    code = (
        "import sys; from pathlib import Path; from driver.nvml import library; "
        "print(library.load(Path(sys.argv[1])))\n"
        "print(*[path for path, _ in library.mapped_copies()])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env
    )
    real = root / "usr/lib64/libnvidia-ml.so.580.95.05"
    assert result.stdout.splitlines() == [str(real), str(real)], result.stderr


@pytest.mark.parametrize("profile", ["p5.48xlarge", "g6e.12xlarge", "p6e-gb200.36xlarge"])
def test_system_nvml_in_a_fake_root_publishes_what_the_profile_says(
    tmp_path: Path, profile: str
) -> None:
    root = tmp_path / "root"
    node, env = fake_root(root, profile)
    args = ("--node-name", NODE, "-o", "yaml")
    system = gpu_dra(
        "discover", "--nvml", "system", "--container-driver-root", str(root),
        "--sysfs-root", str(root), *args, env=env,
    )  # fmt: skip
    simulated = gpu_dra("discover", "--nvml", "simulated", "--profile", profile, *args, env=env)
    assert system.returncode == 0, system.stderr
    assert simulated.returncode == 0, simulated.stderr
    slices = list(yaml.safe_load_all(system.stdout))
    assert slices == list(yaml.safe_load_all(simulated.stdout))
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert len(devices) == node.profile.count


def test_installed_the_library_finds_its_hardware_file_above_itself(tmp_path: Path) -> None:
    """The plugin's pod: no $GPU_DRA_SIM_NVML (the chart sets its environment), and the
    root seen at another path than the host's (its mount point in the container)."""
    host = tmp_path / "host-root"
    fake_root(host, "p4d.24xlarge-mig")
    args = ("--node-name", NODE, "-o", "yaml", "--nvml", "system")
    env = {k: v for k, v in os.environ.items() if k != HARDWARE_ENV}
    before = gpu_dra("discover", *args, "--container-driver-root", str(host),
                     "--sysfs-root", str(host), env=env)  # fmt: skip
    mounted = host.rename(tmp_path / "driver-root")  # the file's root line names the old path
    after = gpu_dra("discover", *args, "--container-driver-root", str(mounted),
                    "--sysfs-root", str(mounted), env=env)  # fmt: skip
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    devices = [d for s in yaml.safe_load_all(after.stdout) for d in s["spec"]["devices"]]
    assert len(devices) == 4 + 4 * 3  # 4 whole GPUs, 4 in MIG mode with 3 instances each
    assert after.stdout == before.stdout
    mounted.joinpath("run/gpu-dra-sim/nvml-hardware").unlink()
    gone = gpu_dra("discover", *args, "--container-driver-root", str(mounted), env=env)
    assert gone.returncode != 0
    assert "no /run/gpu-dra-sim/nvml-hardware above the library" in gone.stderr


def test_an_older_library_names_the_symbol_and_the_driver_needed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _, env = fake_root(root, omit=("nvmlDeviceGetArchitecture",))
    result = gpu_dra("discover", "--nvml", "system", "--container-driver-root", str(root), env=env)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "has no nvmlDeviceGetArchitecture" in line and "R450 or later" in line


def test_a_library_that_fails_init(tmp_path: Path) -> None:
    root = tmp_path / "root"
    node, env = fake_root(root)
    hardware = node.nvml.hardware_file
    argv = ("discover", "--nvml", "system", "--container-driver-root", str(root))
    text = hardware.read_text()
    hardware.write_text(
        text.replace("init ok", f"init {pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH}")
    )
    mismatch = gpu_dra(*argv, env=env)
    assert mismatch.returncode == 75 and "not ready" in mismatch.stderr  # a driver upgrade
    hardware.write_text(text + "gpu banana\n")
    malformed = gpu_dra(*argv, env=env)
    assert malformed.returncode == 1
    assert f"line {len(text.splitlines()) + 1} is malformed" in malformed.stderr
    assert "NVML cannot be initialized: Unknown Error" in malformed.stderr
    hardware.unlink()
    unreadable = gpu_dra(*argv, env=env)
    assert unreadable.returncode == 1 and f"cannot read ${HARDWARE_ENV}" in unreadable.stderr


# -- the C library through pynvml, in this process ----------------------------------


class _UnplugDuring:
    """Discovery's NVML, pulling GPU ``minor`` off the bus once discovery has read its name."""

    def __init__(self, nvml: SimulatedNvml, minor: int) -> None:
        self._nvml = nvml
        self._minor = minor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        name = str(self._nvml.nvmlDeviceGetName(handle))
        if self._nvml.nvmlDeviceGetMinorNumber(handle) == self._minor:
            self._nvml.faults = Faults(removed_gpus=frozenset({self._minor}))
            self._nvml.nvmlInit()  # another NVML client sees the bus change
            self._nvml.nvmlShutdown()
        return name


def test_a_gpu_lost_in_the_middle_of_discovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = SimulatedNode("p5.48xlarge", "mid", tmp_path / "mid")
    with caplog.at_level(logging.WARNING, logger="drivers.gpu.model.discovery"):
        inventory = discover(cast(Nvml, _UnplugDuring(node.nvml, 3)), sysfs_root=node.sysfs_root)
    # NVML re-indexed the survivors under the first reading (GPU 4 took index 3, which had
    # failed); the count changed, so the GPUs were read again: all seven are there.
    assert [g.minor for g in inventory.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert inventory.skipped == ()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.getMessage(), getattr(r, "was", None), getattr(r, "now", None)) for r in warned] == [
        ("the GPU count changed during discovery; reading the GPUs again", 8, 7)
    ]


def test_init_fault_from_the_profile_layer(tmp_path: Path) -> None:
    node = SimulatedNode("g6.xlarge", "gone", tmp_path / "gone", faults=Faults(nvml="missing"))
    with pytest.raises(NvmlMissingError):
        discover(node.nvml, sysfs_root=node.sysfs_root)


def test_xid_events_reach_the_event_sets_that_watch_the_gpu(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    write_state_file(state, {"xidEvents": [{"gpu": 1, "xid": 79}, {"gpu": 2, "xid": 48}]})
    node = SimulatedNode("g6e.12xlarge", "ev", tmp_path / "ev", state_file=state)
    node.nvml.nvmlInit()
    events = pynvml.nvmlEventSetCreate()
    try:
        gpu1 = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetSupportedEventTypes(gpu1) & pynvml.nvmlEventTypeXidCriticalError
        pynvml.nvmlDeviceRegisterEvents(gpu1, pynvml.nvmlEventTypeXidCriticalError, events)
        data = pynvml.nvmlEventSetWait_v2(events, 1000)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
        assert pynvml.nvmlDeviceGetMinorNumber(data.device) == 1
        with pytest.raises(pynvml.NVMLError_Timeout):  # 79 came once; GPU 2 is not watched
            pynvml.nvmlEventSetWait_v2(events, 10)

        # A waiter wakes when a re-init brings a new XID.
        got: list[int] = []
        waiter = threading.Thread(
            target=lambda: got.append(int(pynvml.nvmlEventSetWait_v2(events, 10_000).eventData))
        )
        waiter.start()
        xids = [{"gpu": 1, "xid": 79}, {"gpu": 2, "xid": 48}, {"gpu": 1, "xid": 13}]
        write_state_file(state, {"xidEvents": xids})
        node.nvml.nvmlInit()
        pynvml.nvmlShutdown()
        waiter.join(15)
        assert got == [13]
    finally:
        pynvml.nvmlEventSetFree(events)
        pynvml.nvmlShutdown()


def test_mig_mode_off_has_no_mig_devices_and_lifecycle_not_supported(tmp_path: Path) -> None:
    node = SimulatedNode("p5.48xlarge", "mig", tmp_path / "mig")
    node.nvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMigMode(gpu) == [0, 0]
        # A real H200 with MIG off: no MIG devices to walk, and every profile's full count.
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 0
        remaining = [pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, p) for p in
                     (19, 14, 9, 5, 0, 20, 15)]  # fmt: skip
        assert remaining == [7, 3, 2, 1, 1, 1, 4]
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # no profile of that ID
            pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 99)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu).value == 0  # pynvml returns the c_uint
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # MIG mode is off
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceCreateGpuInstance(gpu, 0)
    finally:
        pynvml.nvmlShutdown()


def test_index_and_virtualization_mode(tmp_path: Path) -> None:
    """nvmlDeviceGetIndex, which NVIDIA's plugin asks through its toolkit's CDI library: a
    GPU's place on the bus; a MIG device's, the index that finds it again (NVML's doc)."""
    node = SimulatedNode("p4d.24xlarge-mig", "index", tmp_path / "index")
    node.nvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        assert [pynvml.nvmlDeviceGetIndex(g) for g in gpus] == list(range(count))
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpus[0], i) for i in range(3)]
        assert [pynvml.nvmlDeviceGetIndex(m) for m in migs] == [0, 1, 2]
        uuids = {pynvml.nvmlDeviceGetUUID(m) for m in migs}
        again = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(
            gpus[0], pynvml.nvmlDeviceGetIndex(migs[2])
        )
        assert (
            pynvml.nvmlDeviceGetUUID(again) == pynvml.nvmlDeviceGetUUID(migs[2]) and len(uuids) == 3
        )
        # Passed through to the VM, as on EC2; a MIG device handle is refused as by every
        # whole-GPU query (NVIDIA's plugin asks this before dynamic MIG).
        assert pynvml.nvmlDeviceGetVirtualizationMode(gpus[0]) == 1
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetVirtualizationMode(migs[0])
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a null pointer for the answer
            pynvml.nvmlDeviceGetIndex(ctypes.cast(0, pynvml.c_nvmlDevice_t))
    finally:
        pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetIndex(gpus[0])


def test_call_trace_lists_each_call_with_its_answer(tmp_path: Path) -> None:
    """$GPU_DRA_SIM_NVML_TRACE: how NVIDIA's plugin's calls were listed (one process, whose
    first call opens the file)."""
    root = tmp_path / "root"
    _, env = fake_root(root, "p5e.48xlarge")
    trace = tmp_path / "trace"
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); n = ctypes.c_uint();"
        "lib.nvmlInit_v2(); lib.nvmlDeviceGetCount_v2(ctypes.byref(n));"
        "lib.nvmlDeviceGetIndex(None, ctypes.byref(n)); lib.nvmlShutdown();"
        "lib.nvmlDeviceGetCount_v2(ctypes.byref(n))"
    )
    library = str(root / "usr/lib64" / SONAME)
    env["GPU_DRA_SIM_NVML_TRACE"] = str(trace)
    done = subprocess.run([sys.executable, "-c", code, library], env=env, check=False)
    assert done.returncode == 0
    assert trace.read_text().splitlines() == [
        "nvmlInit_v2 0",
        "nvmlDeviceGetCount_v2 0",
        "nvmlDeviceGetIndex 2",
        "nvmlShutdown 0",
        "nvmlDeviceGetCount_v2 1",
    ]


def test_bad_arguments_get_error_codes(tmp_path: Path) -> None:
    node = SimulatedNode("p6e-gb200.36xlarge", "bad", tmp_path / "bad")
    node.nvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetUUID(pynvml.c_nvmlDevice_t())  # NULL
        foreign = ctypes.cast(ctypes.pointer(ctypes.c_int(5)), pynvml.c_nvmlDevice_t)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetUUID(foreign)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(4)
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        lib = pynvml.nvmlLib
        short = ctypes.create_string_buffer(4)
        assert lib.nvmlDeviceGetUUID(gpu, short, 4) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert lib.nvmlDeviceGetCount_v2(None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        info = pynvml.c_nvmlGpuFabricInfoV_t()
        info.version = 0  # a struct version this library does not know
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetGpuFabricInfoV(gpu, ctypes.pointer(info))
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(gpu, 18)  # 18 links wired of 36
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(gpu, 36)
    finally:
        pynvml.nvmlShutdown()


def test_concurrent_inits_and_queries_agree(tmp_path: Path) -> None:
    node = SimulatedNode("p5.48xlarge", "busy", tmp_path / "busy")
    node.nvml.nvmlInit()  # renders the file the threads' inits re-read
    expected = [g.uuid for g in node.nvml.gpus]
    seen: list[list[str]] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(50):
                pynvml.nvmlInit()
                count = pynvml.nvmlDeviceGetCount()
                seen.append(
                    [
                        pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                        for i in range(count)
                    ]
                )
                pynvml.nvmlShutdown()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    pynvml.nvmlShutdown()
    assert errors == []
    assert len(seen) == 300 and all(uuids == expected for uuids in seen)


# -- building the library -----------------------------------------------------------


def test_library_is_cached_and_rebuilt_when_its_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    first = build.library()
    built_at = first.stat().st_mtime_ns
    assert build.library() == first and first.stat().st_mtime_ns == built_at
    original = build.source()
    monkeypatch.setattr(build, "source", lambda: original + b"\n/* edited */\n")
    second = build.library()
    assert second != first and second.parent.parent == first.parent.parent
    assert SONAME.encode() in second.read_bytes()


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.BuildError, match=r"no C compiler \(cc\)"):
        build.library()


def _fabric_of(node: SimulatedNode) -> tuple[int, int, int, bytes]:
    node.nvml.nvmlInit()
    try:
        info = pynvml.c_nvmlGpuFabricInfoV_t()
        info.version = pynvml.nvmlGpuFabricInfo_v2
        pynvml.nvmlDeviceGetGpuFabricInfoV(
            pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.pointer(info)
        )
        return info.state, info.status, info.cliqueId, bytes(info.clusterUuid)
    finally:
        pynvml.nvmlShutdown()


def test_fabric_answers_per_gpu(tmp_path: Path) -> None:
    # The real H200 answers the call, with the state "not supported" and nothing else.
    h200 = SimulatedNode("p5e.48xlarge", "h200", tmp_path / "h200")
    assert _fabric_of(h200) == (pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0, 0, bytes(16))
    h100 = SimulatedNode("p5.48xlarge", "h100", tmp_path / "h100")
    assert _fabric_of(h100) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, 0, bytes(16))
    gb200 = SimulatedNode("p6e-gb200.36xlarge", "gb200", tmp_path / "gb200")
    state, _, clique, cluster = _fabric_of(gb200)
    assert (state, clique) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 32766) and any(cluster)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # Ampere has no fabric call
        _fabric_of(SimulatedNode("p4d.24xlarge", "a100", tmp_path / "a100"))


def test_supported_event_types_and_what_registers(tmp_path: Path) -> None:
    xid_dbe = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    for profile, supported in (("p5e.48xlarge", 0xFF9F), ("p5.48xlarge", 0x8)):
        SimulatedNode(profile, "ev", tmp_path / profile).nvml.nvmlInit()
        events = pynvml.nvmlEventSetCreate()
        try:
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetSupportedEventTypes(gpu) == supported
            if supported & pynvml.nvmlEventTypeDoubleBitEccError:
                pynvml.nvmlDeviceRegisterEvents(gpu, xid_dbe, events)
            else:  # a type the GPU does not report is refused
                with pytest.raises(pynvml.NVMLError_NotSupported):
                    pynvml.nvmlDeviceRegisterEvents(gpu, xid_dbe, events)
        finally:
            pynvml.nvmlEventSetFree(events)
            pynvml.nvmlShutdown()
