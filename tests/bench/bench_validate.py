"""What judging requests against every instance profile's devices costs ``gpu-dra validate``.

The examples (charts/examples/) and NVIDIA-style manifests (tests/data/nvidia-style/) are
validated with the check on and off, interleaved in one run so the ratio is the check's cost
and not the machine's: cold (a fresh process, as the command runs: imports, the profiles'
file, the CEL grammar) and warm (in process, every cache filled). Reported: medians and the
ratio on / off.
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.validation import validate_sources

ROOT = Path(__file__).resolve().parents[2]

SETS = {
    "examples": sorted((ROOT / "charts" / "examples").glob("*.yaml")),
    "nvidia-style": sorted((ROOT / "tests" / "data" / "nvidia-style").glob("*.yaml")),
}
COLD_ROUNDS = 5
WARM_ROUNDS = 20
_COLD = """
import sys, time
from pathlib import Path
started = time.perf_counter()
from tools.validation import validate_sources
files = sys.argv[2:]
validate_sources([(f, Path(f).read_text()) for f in files], hardware_check=sys.argv[1] == "on")
print(time.perf_counter() - started)
"""


def cold(files: list[Path], on: bool) -> float:
    argv = [sys.executable, "-c", _COLD, "on" if on else "off", *map(str, files)]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def warm(sources: list[tuple[str, str]], on: bool) -> float:
    started = time.perf_counter()
    validate_sources(sources, hardware_check=on)
    return time.perf_counter() - started


def main() -> int:
    for name, files in SETS.items():
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(COLD_ROUNDS):
            for on in (False, True):
                times.setdefault(("cold", on), []).append(cold(files, on))
        sources = [(str(f), f.read_text()) for f in files]
        warm(sources, True)  # fill the caches
        for _ in range(WARM_ROUNDS):
            for on in (False, True):
                times.setdefault(("warm", on), []).append(warm(sources, on))
        for mode in ("cold", "warm"):
            without = statistics.median(times[(mode, False)])
            with_check = statistics.median(times[(mode, True)])
            print(
                f"{name} ({len(files)} files), {mode}: check off {without * 1000:.0f} ms, on "
                f"{with_check * 1000:.0f} ms, ratio {with_check / without:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
