"""The real-GPU suite's guard rails: it runs only where an NVIDIA GPU and its driver answer
NVML, it fails when a GPU setting moved while it ran, and it prints one table.

Nothing here changes a GPU setting: the plugin's nvidia-smi calls go to a recording stand-in
(its argv checked against the forms the real tool accepts), and the settings are only read,
before the first test and after the last: compute mode and MIG mode through NVML, the
time-slice policy through ``nvidia-smi compute-policy -l``.
"""

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROWS: list[tuple[str, str, str]] = []  # (check, result, detail), printed at the end


def row(check: str, result: str, detail: str = "") -> None:
    ROWS.append((check, result, detail))


def _nvml() -> Any:
    import pynvml

    from driver.nvml import library

    library.load(Path("/"))
    return pynvml


def gpu_absent() -> str | None:
    """Why this machine cannot run the suite, or None."""
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception as error:
        first = str(error).split(" (", 1)[0]  # the loader's message lists every path it tried
        return f"no NVIDIA driver answers NVML here ({type(error).__name__}: {first})"
    try:
        if nvml.nvmlDeviceGetCount() == 0:
            return "NVML answers but lists no GPU"
    finally:
        nvml.nvmlShutdown()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_absent()
    if reason is None:
        return
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):  # this suite's tests only, when run with others
            item.add_marker(pytest.mark.skip(reason=f"real-GPU suite: {reason}"))
    row("GPU", "absent", reason)


def _timeslice() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi)"
    done = subprocess.run([smi, "compute-policy", "-l"], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if "Timeslice" in line]
    return " | ".join(" ".join(line.strip("| ").split()) for line in lines) or done.stdout[:80]


def settings() -> dict[str, str]:
    """Every GPU's compute mode, MIG mode (current, pending) and time-slice policy."""
    nvml = _nvml()
    nvml.nvmlInit()
    try:
        out: dict[str, str] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            out[f"gpu{index} compute mode"] = str(nvml.nvmlDeviceGetComputeMode(handle))
            try:
                out[f"gpu{index} MIG mode"] = str(nvml.nvmlDeviceGetMigMode(handle))
            except nvml.NVMLError as error:
                out[f"gpu{index} MIG mode"] = f"({error})"
        out["time slice"] = _timeslice()
        return out
    finally:
        nvml.nvmlShutdown()


@pytest.fixture(scope="session", autouse=True)
def settings_unchanged() -> Iterator[None]:
    if gpu_absent() is not None:
        yield
        return
    before = settings()
    yield
    after = settings()
    moved = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    row("GPU settings", "unchanged" if not moved else "MOVED", str(moved or before))
    assert not moved, f"a GPU setting moved while the suite ran: {moved}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    width = max(len(check) for check, _, _ in ROWS)
    terminalreporter.section("real-GPU check")
    terminalreporter.write_line(f"{'CHECK'.ljust(width)}  RESULT      DETAIL")
    for check, result, detail in ROWS:
        terminalreporter.write_line(f"{check.ljust(width)}  {result.ljust(10)}  {detail}")
