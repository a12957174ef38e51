"""Faults for the simulated NVML: what can go wrong on a real node, on demand.

They reach the simulated ``libnvidia-ml.so.1`` rendered into its hardware file
(:mod:`driver.nvml.sim.hardware`), so a fault is an NVML return code of the C library.

The same shape comes from three places, merged field by field (later wins):
a profile's ``faults:`` section, the ``faults=`` a test passes, and the YAML
state file re-read at every ``nvmlInit()``. The state file is how a test
changes the hardware under a running subprocess (a kubelet plugin); its path
may also come from the ``GPU_DRA_SIM_STATE`` environment variable.

State file format (every key optional; a missing or empty file means no faults)::

    nvml: ok | missing | not-loaded   # missing: NVMLError_LibraryNotFound at nvmlInit;
                                      # not-loaded: NVMLError_DriverNotLoaded (driver still
                                      # installing at boot)
    removedGpus: [3]                  # minor numbers of GPUs gone from the bus; NVML
                                      # re-indexes the rest, minors stay
    failingQueries:                   # a GPU that errors on one NVML function
      - {gpu: 2, call: nvmlDeviceGetUUID, error: GpuIsLost}   # error: NVMLError_<error>,
                                                              # default Unknown
    fabric: not-supported | none | zero | in-progress | completed   # GPU fabric info, every
                                      # GPU; none: the call answers, state not supported
    fabricCluster: rack-a             # seed of the fabric cluster UUID (default: node name);
                                      # nodes with the same seed share one NVLink fabric
    xidEvents:                        # XID events of a GPU (minor), for nvmlEventSetWait
      - {gpu: 2, xid: 79}
      - {gpu: 0, xid: 94, gi: 1, ci: 0}   # on a MIG-mode GPU: the GPU instance (and compute
                                          # instance) it names; without: the whole GPU
    driverVersion: "535.104.05"       # as nvidia-smi prints it
    cudaDriverVersion: "12.2"         # CUDA driver API version
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, cast, get_args

import pynvml
import yaml

from driver.common.errors import PermanentError

NvmlState = Literal["ok", "missing", "not-loaded"]
FabricState = Literal["not-supported", "none", "zero", "in-progress", "completed"]

_NVML_STATES: frozenset[str] = frozenset(get_args(NvmlState))
FABRIC_STATES: frozenset[str] = frozenset(get_args(FabricState))
_KEYS = {
    "nvml": "nvml",
    "removedGpus": "removed_gpus",
    "failingQueries": "failing_queries",
    "fabric": "fabric",
    "fabricCluster": "fabric_cluster",
    "xidEvents": "xid_events",
    "driverVersion": "driver_version",
    "cudaDriverVersion": "cuda_driver_version",
}
_CUDA_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_CALL = re.compile(r"^nvml\w{1,59}$")


class SimulationConfigError(PermanentError):
    """A profile or state file of the simulated hardware is malformed."""


@dataclass(frozen=True, slots=True)
class QueryFault:
    """GPU ``gpu`` (minor number) raises ``NVMLError_<error>`` from NVML function ``call``."""

    gpu: int
    call: str
    error: str = "Unknown"

    def exception(self) -> Exception:
        cls = getattr(pynvml, f"NVMLError_{self.error}")
        return cast(Exception, cls())

    def code(self) -> int:
        """The ``nvmlReturn_t`` of the error."""
        error: Any = self.exception()  # pynvml sets .value on its error classes
        return int(error.value)


def gpu_lost(minor: int) -> tuple[QueryFault, ...]:
    """GPU ``minor`` fallen off the bus, as NVML tells it: every call for its handle answers
    GPU_IS_LOST (the real toolkit then says "error getting device handle ...: GPU is lost")."""
    calls = ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2",
             "nvmlDeviceGetHandleByUUID")  # fmt: skip
    return tuple(QueryFault(minor, call, "GpuIsLost") for call in calls)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """GPU ``gpu`` (minor number) reports XID ``xid`` to event sets that watch it."""

    gpu: int
    xid: int
    gi: int | None = None  # the GPU instance it names on a MIG-mode GPU; None: all of it
    ci: int | None = None  # the compute instance of ``gi``; None: all of that GI


@dataclass(frozen=True, slots=True)
class Faults:
    """Every field ``None`` means "not set here": a lower layer's value applies."""

    nvml: NvmlState | None = None
    removed_gpus: frozenset[int] | None = None
    failing_queries: tuple[QueryFault, ...] | None = None
    xid_events: tuple[XidEvent, ...] | None = None
    fabric: FabricState | None = None
    fabric_cluster: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None

    def over(self, base: "Faults") -> "Faults":
        """These faults layered on top of ``base``."""
        merged = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(base, f.name)
            for f in fields(self)
        }
        return Faults(**merged)

    def failure(self, minor: int, call: str) -> Exception | None:
        for fault in self.failing_queries or ():
            if fault.gpu == minor and fault.call == call:
                return fault.exception()
        return None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, source: str) -> "Faults":
        """Parse the YAML shape documented in this module; errors name ``source``."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SimulationConfigError(f"{source}: faults must be a mapping, not {data!r}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise SimulationConfigError(
                f"{source}: unknown fault keys {unknown}; known: {sorted(_KEYS)}"
            )
        values: dict[str, Any] = {}
        for key, attr in _KEYS.items():
            if key in data and data[key] is not None:
                values[attr] = _parse_field(key, data[key], source)
        return cls(**values)


def _parse_field(key: str, value: Any, source: str) -> Any:
    where = f"{source}: {key}"
    if key == "nvml":
        if value not in _NVML_STATES:
            raise SimulationConfigError(f"{where}: {value!r} is not one of {sorted(_NVML_STATES)}")
        return value
    if key == "fabric":
        if value not in FABRIC_STATES:
            raise SimulationConfigError(f"{where}: {value!r} is not one of {sorted(FABRIC_STATES)}")
        return value
    if key == "removedGpus":
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise SimulationConfigError(f"{where}: expected a list of minor numbers")
        return frozenset(value)
    if key == "failingQueries":
        return tuple(_query_fault(item, where) for item in _as_list(value, where))
    if key == "xidEvents":
        return tuple(_xid_event(item, where) for item in _as_list(value, where))
    if key == "cudaDriverVersion":
        text = str(value)
        if not _CUDA_VERSION.match(text):
            raise SimulationConfigError(f"{where}: {text!r} is not MAJOR.MINOR")
        return text
    return str(value)


def _as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SimulationConfigError(f"{where}: expected a list")
    return value


def _query_fault(item: Any, where: str) -> QueryFault:
    if not isinstance(item, Mapping) or not {"gpu", "call"} <= set(item):
        raise SimulationConfigError(f"{where}: each entry needs gpu and call, got {item!r}")
    call = str(item["call"])
    if not _CALL.match(call):
        raise SimulationConfigError(f"{where}: {call!r} is not an NVML function name")
    error = str(item.get("error", "Unknown"))
    if not hasattr(pynvml, f"NVMLError_{error}"):
        raise SimulationConfigError(f"{where}: pynvml has no NVMLError_{error}")
    return QueryFault(gpu=int(item["gpu"]), call=call, error=error)


def _xid_event(item: Any, where: str) -> XidEvent:
    if not isinstance(item, Mapping) or not {"gpu", "xid"} <= set(item):
        raise SimulationConfigError(f"{where}: each entry needs gpu and xid, got {item!r}")
    unknown = sorted(set(item) - {"gpu", "xid", "gi", "ci"})
    if unknown:
        raise SimulationConfigError(f"{where}: unknown keys {unknown} in {item!r}")
    gpu, xid, gi, ci = item["gpu"], item["xid"], item.get("gi"), item.get("ci")
    if not all(isinstance(v, int) and v >= 0 for v in (gpu, xid)) or not all(
        v is None or (isinstance(v, int) and 0 <= v < 0xFFFFFFFF) for v in (gi, ci)
    ):
        raise SimulationConfigError(f"{where}: gpu, xid, gi and ci must be non-negative integers")
    if ci is not None and gi is None:
        raise SimulationConfigError(f"{where}: ci names a compute instance of a gi: give both")
    return XidEvent(gpu=gpu, xid=xid, gi=gi, ci=ci)


def cuda_version_number(text: str) -> int:
    """``"12.2"`` -> 12020, NVML's encoding of the CUDA driver version."""
    match = _CUDA_VERSION.match(text)
    if match is None:
        raise SimulationConfigError(f"CUDA driver version {text!r} is not MAJOR.MINOR")
    return int(match[1]) * 1000 + int(match[2]) * 10


def read_state_file(path: Path | None) -> Faults:
    """The faults a state file sets; a missing or empty file sets none."""
    if path is None:
        return Faults()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Faults()
    except OSError as exc:
        raise SimulationConfigError(f"cannot read state file {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SimulationConfigError(f"state file {path} is not YAML: {exc}") from exc
    return Faults.from_mapping(data, source=str(path))


def write_state_file(path: Path, faults: Mapping[str, Any]) -> None:
    """Write a state file atomically, so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(dict(faults), sort_keys=True))
    tmp.replace(path)
