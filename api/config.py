"""Opaque device configuration that users put in ResourceClaims and DeviceClasses.

The API group and shapes are the NVIDIA DRA driver's (``resource.nvidia.com/v1beta1``,
kind ``GpuConfig``), so manifests written for it parse here unchanged. Parsing runs
three explicit steps: defaults (what an absent config means), normalization (implied
values filled in), validation (what this driver supports). Unknown fields are rejected
at every level, and every error names the config it came from and the offending field.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from api.names import API_GROUP as API_GROUP
from api.names import API_VERSION as API_VERSION
from api.names import CHANNEL_CONFIG_KIND, COMPUTE_DOMAIN_DRIVER, DAEMON_CONFIG_KIND
from api.names import GPU_CONFIG_KIND as GPU_CONFIG_KIND

TIME_SLICING = "TimeSlicing"
MPS = "MPS"

# A Kubernetes resource.Quantity, as its parser accepts it (sign, number, suffix).
# ASCII digits only, as Kubernetes' parser and the admission policy's RE2 read them.
_QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
)


class ConfigError(ValueError):
    """An opaque config that cannot be used; the message names the config and the field."""


class _Model(BaseModel):
    # Wire names are camelCase exactly as in the NVIDIA manifests; snake_case spellings
    # are not accepted, so a typo is an unknown field, not a silent alias. Strict types, as
    # NVIDIA's Go decoder has them: "50", 50.0 or true is no thread percentage (lax parsing
    # read true as 1), and the admission policy can say the same in CEL.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True, strict=True)


class TimeSlicingConfig(_Model):
    interval: Literal["Default", "Short", "Medium", "Long"] | None = None


class MpsConfig(_Model):
    default_active_thread_percentage: int | None = Field(default=None, ge=0, le=100)
    default_pinned_device_memory_limit: str | None = None
    # Keys are a GPU index or UUID, values quantities.
    default_per_device_pinned_memory_limit: dict[str, str] | None = None

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.fullmatch(value):
            raise ValueError(f"{value!r} is not a quantity")
        return value

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _quantities(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, limit in (value or {}).items():
            if not _QUANTITY.fullmatch(limit):
                raise ValueError(f"{key}: {limit!r} is not a quantity")
        return value


class GpuSharing(_Model):
    # Any string parses, so an unsupported strategy gets a "not supported" error that
    # names it instead of a generic enum mismatch.
    strategy: str
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: MpsConfig | None = None


class GpuConfig(_Model):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None

    @classmethod
    def default(cls) -> "GpuConfig":
        """What a device gets when no config matches it: the whole GPU, not shared."""
        return cls.model_validate({"apiVersion": API_VERSION, "kind": GPU_CONFIG_KIND})

    def normalized(self) -> "GpuConfig":
        """Fill in what a setting implies (as the NVIDIA driver does)."""
        sharing = self.sharing
        if sharing is None:
            return self
        if sharing.strategy == TIME_SLICING and sharing.time_slicing_config is None:
            sharing = sharing.model_copy(
                update={"time_slicing_config": TimeSlicingConfig(interval="Default")}
            )
        if sharing.strategy == MPS and sharing.mps_config is None:
            sharing = sharing.model_copy(update={"mps_config": MpsConfig()})
        return self.model_copy(update={"sharing": sharing})

    def validate_supported(self) -> None:
        """Reject what parses but this driver cannot do."""
        if self.sharing is None:
            return
        strategy = self.sharing.strategy
        if strategy not in (TIME_SLICING, MPS):
            raise ConfigError(
                f'field "sharing.strategy": unknown GPU sharing strategy {strategy} (must be '
                f"{TIME_SLICING} or {MPS})"
            )
        if strategy == TIME_SLICING and self.sharing.mps_config is not None:
            raise ConfigError(f'field "sharing.mpsConfig": not allowed with strategy {strategy}')
        if strategy == MPS and self.sharing.time_slicing_config is not None:
            raise ConfigError(
                f'field "sharing.timeSlicingConfig": not allowed with strategy {strategy}'
            )

    def sharing_settings(self) -> tuple[tuple[str, str], ...]:
        """What a prepared device records of its sharing: flat, so any kind can keep it.

        ``(("interval", "Short"), ("strategy", "TimeSlicing"))``, or ``()`` unshared.
        Call it on a normalized config.
        """
        sharing = self.sharing
        if sharing is None:
            return ()
        settings = [("strategy", sharing.strategy)]
        if sharing.time_slicing_config is not None:
            settings.append(("interval", sharing.time_slicing_config.interval or "Default"))
        mps = sharing.mps_config
        if mps is not None:
            if mps.default_active_thread_percentage is not None:
                settings.append(
                    ("activeThreadPercentage", str(mps.default_active_thread_percentage))
                )
            if mps.default_pinned_device_memory_limit is not None:
                settings.append(("pinnedMemoryLimit", mps.default_pinned_device_memory_limit))
            for key, limit in (mps.default_per_device_pinned_memory_limit or {}).items():
                settings.append((f"pinnedMemoryLimit/{key}", limit))
        return tuple(sorted(settings))


def _fields_of(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The wire names the object at ``loc`` of ``model`` takes; [] where no model is there."""
    for part in loc:
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        inner = [a for a in (field.annotation, *get_args(field.annotation)) if _is_model(a)]
        if not inner:
            return []
        model = inner[0]
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _is_model(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(exc: ValidationError, model: type[BaseModel]) -> str:
    """One part per field, each naming the field and what was written there: pydantic's
    messages alone show neither the value nor, for an unknown field, what is allowed. Every
    unknown field is listed, not only the first."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(root)"
        if error["type"] == "extra_forbidden":
            allowed = _fields_of(model, tuple(error["loc"][:-1]))
            parts.append(
                f'field "{field}": unknown field, not allowed'
                + (f" (allowed there: {', '.join(allowed)})" if allowed else "")
            )
        elif error["type"] == "missing":
            parts.append(f'field "{field}": required')
        else:
            parts.append(f'field "{field}": {_shown(error["input"])}: {error["msg"]}')
    return "; ".join(parts)


# NVIDIA's other opaque config kinds of this API group, and why this driver takes none of
# them: a manifest written for NVIDIA's driver gets the reason, not only a refusal.
NVIDIA_KINDS: Mapping[str, str] = {
    "MigDeviceConfig": (
        "NVIDIA's config for MIG devices; this driver configures a MIG device with a "
        "GpuConfig, and shares none (drop the config, or write kind GpuConfig without sharing)"
    ),
    "VfioDeviceConfig": (
        "NVIDIA's VFIO passthrough config; this driver has no passthrough devices"
    ),
    CHANNEL_CONFIG_KIND: f"a config of driver {COMPUTE_DOMAIN_DRIVER}: write that driver",
    DAEMON_CONFIG_KIND: f"a config of driver {COMPUTE_DOMAIN_DRIVER}: write that driver",
}


@dataclass(frozen=True, slots=True)
class AppliedConfig:
    """One decoded opaque config of a claim's allocation, and whom it applies to."""

    requests: tuple[str, ...]  # none: every request
    source: str  # how messages name it
    config: Any  # the decoded model
    origin: str  # "class" (a DeviceClass's, copied into the claim) or "claim"


def applies(requests: Sequence[str], request: str) -> bool:
    """Whether a config for ``requests`` applies to ``request`` (``req`` or ``req/sub``)."""
    return not requests or request in requests or request.split("/", 1)[0] in requests


def choose(request: str, configs: Sequence[AppliedConfig]) -> AppliedConfig | None:
    """The config that applies to ``request``, of ``configs`` in their order (class configs
    first): the last matching one wins. A claim config overrides a class config, one naming
    the request overrides one for all requests; two of the same origin and reach that differ
    are a conflict, refused (ConfigError) rather than settled by their order. The plugin
    plans a claim with it, and ``gpu-dra validate`` judges a manifest with it."""
    chosen: AppliedConfig | None = None
    for entry in configs:
        if applies(entry.requests, request):
            if (
                chosen is not None
                and chosen.origin == entry.origin
                and bool(chosen.requests) == bool(entry.requests)
                and chosen.config != entry.config
            ):
                raise ConfigError(
                    f"{chosen.source} and {entry.source} both configure request {request} "
                    "differently: conflicting configs for one device (at most one must apply)"
                )
            chosen = entry
    return chosen


def misaddressed(parameters: Any, driver: Any, ours: str, kinds: tuple[str, ...]) -> str | None:
    """Why a config addressed to ``driver`` but of one of ``kinds`` (the configs of driver
    ``ours``) is refused where it applies to requests allocated from ``ours``, or None: a typo
    of the driver name, and ignoring it would hand out an unshared GPU where sharing was
    asked for. The plugin refuses a claim with it, and ``gpu-dra validate`` a manifest."""
    if (
        driver != ours
        and isinstance(parameters, Mapping)
        and str(parameters.get("apiVersion", "")).startswith(API_GROUP + "/")
        and parameters.get("kind") in kinds
    ):
        return (
            f'field "opaque.driver": a {parameters["kind"]} for driver {driver!r}, but its '
            f"requests are allocated from {ours!r}; it would be ignored (write {ours!r})"
        )
    return None


# A device's published ``type`` attribute, for the configs each takes.
MIG_TYPE = "mig"


def refused_on(device_type: str, settings: tuple[tuple[str, str], ...]) -> str | None:
    """Why a device of ``device_type`` cannot be prepared with a config whose
    ``sharing_settings()`` are ``settings``, or None. The MIG kinds refuse at prepare with
    it, and ``gpu-dra validate`` judges a request's config with it."""
    strategy = dict(settings).get("strategy")
    if device_type == MIG_TYPE and strategy:
        return (
            f'field "sharing.strategy": {strategy!r}: sharing (TimeSlicing, MPS) is not '
            "supported on MIG devices; write the config without sharing for these requests"
        )
    return None


def decode_gpu_config(parameters: Mapping[str, Any] | None, *, source: str) -> GpuConfig:
    """Default and normalize one opaque config's ``parameters``; shape errors only.

    ``source`` says which config this is (e.g. ``opaque config #1 (from claim, requests
    gpu)``) and starts every error message.
    """
    if parameters is None:
        return GpuConfig.default()
    if not isinstance(parameters, Mapping):
        raise ConfigError(
            f"{source}: parameters must be an object, got {type(parameters).__name__}"
        )
    kind = parameters.get("kind")
    if kind not in (None, GPU_CONFIG_KIND):
        why = NVIDIA_KINDS.get(kind) if isinstance(kind, str) else None
        raise ConfigError(
            f'{source}: field "kind": {kind!r} is not supported (only {GPU_CONFIG_KIND})'
            + (f": {why}" if why else "")
        )
    try:
        config = GpuConfig.model_validate(dict(parameters))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, GpuConfig)}") from exc
    return config.normalized()


def validate_gpu_config(config: GpuConfig, *, source: str) -> GpuConfig:
    """The validation step, for a config that applies to a device."""
    try:
        config.validate_supported()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return config


def parse_gpu_config(parameters: Mapping[str, Any] | None, *, source: str) -> GpuConfig:
    """All three steps: default, normalize, validate."""
    return validate_gpu_config(decode_gpu_config(parameters, source=source), source=source)
