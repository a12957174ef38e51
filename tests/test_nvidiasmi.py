"""``nvidia-smi`` runs with the driver root's NVML preloaded: the plugin's image has none."""

import stat
from pathlib import Path

import pytest

from driver.nvml import library
from drivers.gpu.kinds import GpuKindContext, GpuNode
from drivers.gpu.model.nvidiasmi import NvidiaSmi, NvidiaSmiError, NvidiaSmiMissingError

# Prints the library it was given, as the loader would use it.
_STAND_IN = '#!/bin/sh\necho "$LD_PRELOAD" > {out}\n[ "$1" != fail ] || exit 4\n'


def _stand_in(root: Path, out: Path) -> Path:
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text(_STAND_IN.format(out=out))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return smi


def test_the_driver_roots_library_is_preloaded(tmp_path: Path) -> None:
    root = tmp_path / "driver-root"
    real = root / "usr" / "lib64" / "libnvidia-ml.so.580.95.05"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"")  # never loaded: the stand-in is a shell script
    (root / "usr" / "lib64" / "libnvidia-ml.so.1").symlink_to(real.name)
    _stand_in(root, tmp_path / "seen")
    smi = GpuKindContext(
        tmp_path, "", GpuNode(container_driver_root=root, nvml_library=library.find(root))
    ).nvidia_smi_tool()
    assert smi.path == root / "usr" / "bin" / "nvidia-smi" and smi.preload == real
    smi.run("-L")
    assert (tmp_path / "seen").read_text().strip() == str(real)


def test_without_a_library_in_the_root_nothing_is_preloaded(tmp_path: Path) -> None:
    named = _stand_in(tmp_path / "elsewhere", tmp_path / "seen")
    smi = GpuKindContext(
        tmp_path, "", GpuNode(container_driver_root=tmp_path, nvidia_smi=named)
    ).nvidia_smi_tool()
    assert smi.path == named and smi.preload is None
    smi.run("-L")
    assert (tmp_path / "seen").read_text().strip() == ""


def test_failures_are_classed(tmp_path: Path) -> None:
    smi = NvidiaSmi(_stand_in(tmp_path / "r", tmp_path / "seen"))
    with pytest.raises(NvidiaSmiError, match=r"nvidia-smi fail failed \(exit 4\)"):
        smi.run("fail")
    with pytest.raises(NvidiaSmiMissingError, match="cannot run nvidia-smi"):
        NvidiaSmi(tmp_path / "missing").run("-L")
