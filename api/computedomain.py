"""The ComputeDomain driver's opaque configs: ``ComputeDomainChannelConfig`` (on a workload's
IMEX channel) and ``ComputeDomainDaemonConfig`` (on the IMEX daemon's claim).

NVIDIA's shapes (``api/nvidia.com/resource/v1beta1/computedomainconfig.go``), so the
ResourceClaimTemplates NVIDIA's controller writes parse here unchanged, through the same three
steps as ``GpuConfig`` (api/config.py): defaults, normalization, validation. The controller
writes these configs, not users; a user can still write one into a claim of their own, so the
decoder is as strict as GpuConfig's: unknown fields refused, strict types, errors naming the
config and the field.

Two places where it is stricter than NVIDIA's, both for what the node does with the value:
``domainID`` must be a UID as the API server writes ``metadata.uid`` (NVIDIA only refuses an
empty one), because the node driver writes it into a Node label value and a directory name;
and ``allocationMode`` must be ``All`` or ``Single`` (the CRD's enum, which the controller
copies), where NVIDIA's plugin would read any other string as Single.
"""

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, ValidationError

from api.config import ConfigError, _describe, _Model
from api.names import ALLOCATION_ALL as ALLOCATION_ALL
from api.names import ALLOCATION_MODES as ALLOCATION_MODES
from api.names import ALLOCATION_SINGLE as ALLOCATION_SINGLE
from api.names import API_VERSION
from api.names import CHANNEL_CONFIG_KIND as CHANNEL_CONFIG_KIND
from api.names import DAEMON_CONFIG_KIND as DAEMON_CONFIG_KIND

KINDS: Final = (CHANNEL_CONFIG_KIND, DAEMON_CONFIG_KIND)

# metadata.uid as the API server writes it (google/uuid, lowercase); the same rule as
# driver.common.limits.is_uid, which this layer cannot import.
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _domain_id_error(domain_id: str) -> str | None:
    if not domain_id:
        return 'field "domainID": cannot be empty'
    if not _UID.fullmatch(domain_id):
        shown = domain_id if len(domain_id) <= 80 else domain_id[:77] + "..."
        return (
            f'field "domainID": {shown!r} is not a ComputeDomain UID (a lowercase canonical '
            "UUID, as the API server writes metadata.uid)"
        )
    return None


class ComputeDomainChannelConfig(_Model):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["ComputeDomainChannelConfig"]
    # Go: `json:"domainID"`, not omitempty, so absent reads as "" and validation says so.
    domain_id: str = Field(default="", alias="domainID")
    # Go: omitempty; absent means Single.
    allocation_mode: Literal["All", "Single"] | None = None

    @classmethod
    def default(cls) -> "ComputeDomainChannelConfig":
        """What a channel device gets when no config matches it: NVIDIA's default, which
        names no domain and so fails validation (a channel is always some domain's)."""
        return cls.model_validate({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND})

    def normalized(self) -> "ComputeDomainChannelConfig":
        """Nothing is implied (NVIDIA's Normalize is a no-op): an absent allocationMode stays
        absent, and :attr:`all_channels` reads it as Single."""
        return self

    def validate_supported(self) -> None:
        if (why := _domain_id_error(self.domain_id)) is not None:
            raise ConfigError(why)

    @property
    def all_channels(self) -> bool:
        """Every IMEX channel of the node (allocationMode All), or only channel 0."""
        return self.allocation_mode == ALLOCATION_ALL


class ComputeDomainDaemonConfig(_Model):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["ComputeDomainDaemonConfig"]
    domain_id: str = Field(default="", alias="domainID")

    @classmethod
    def default(cls) -> "ComputeDomainDaemonConfig":
        """What a daemon device gets when no config matches it; fails validation, as
        NVIDIA's does."""
        return cls.model_validate({"apiVersion": API_VERSION, "kind": DAEMON_CONFIG_KIND})

    def normalized(self) -> "ComputeDomainDaemonConfig":
        return self

    def validate_supported(self) -> None:
        if (why := _domain_id_error(self.domain_id)) is not None:
            raise ConfigError(why)


ComputeDomainConfig = ComputeDomainChannelConfig | ComputeDomainDaemonConfig
_MODELS: Final[dict[str, type[ComputeDomainChannelConfig] | type[ComputeDomainDaemonConfig]]] = {
    CHANNEL_CONFIG_KIND: ComputeDomainChannelConfig,
    DAEMON_CONFIG_KIND: ComputeDomainDaemonConfig,
}


def decode_compute_domain_config(
    parameters: Mapping[str, Any] | None, *, source: str
) -> ComputeDomainConfig:
    """Decode and normalize one opaque config's ``parameters`` by its kind; shape errors only.

    There is no default for absent parameters here, unlike GpuConfig: which default applies
    depends on the device (``ComputeDomainChannelConfig.default()`` or the daemon's), which
    the caller knows. ``source`` starts every error message.
    """
    if not isinstance(parameters, Mapping):
        got = "nothing" if parameters is None else type(parameters).__name__
        raise ConfigError(f"{source}: parameters must be an object, got {got}")
    kind = parameters.get("kind")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        what = "required" if kind is None else f"{kind!r} is not supported"
        raise ConfigError(f'{source}: field "kind": {what} (only {" or ".join(KINDS)})')
    try:
        config = model.model_validate(dict(parameters))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, model)}") from exc
    return config.normalized()


def validate_compute_domain_config(
    config: ComputeDomainConfig, *, source: str
) -> ComputeDomainConfig:
    """The validation step, for a config that applies to a device."""
    try:
        config.validate_supported()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return config


def parse_compute_domain_config(
    parameters: Mapping[str, Any] | None, *, source: str
) -> ComputeDomainConfig:
    """All three steps: decode by kind, normalize, validate."""
    config = decode_compute_domain_config(parameters, source=source)
    return validate_compute_domain_config(config, source=source)
