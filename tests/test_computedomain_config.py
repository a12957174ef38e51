"""The ComputeDomain opaque configs: what NVIDIA's controller writes parses; every refusal
names the config and the field; the names module spells NVIDIA's strings."""

from typing import Any

import pytest

from api.computedomain import (
    ComputeDomainChannelConfig,
    ComputeDomainDaemonConfig,
    decode_compute_domain_config,
    parse_compute_domain_config,
    validate_compute_domain_config,
)
from api.config import API_VERSION, ConfigError
from driver.common.limits import is_uid
from drivers.computedomain import names

SOURCE = "opaque config #0 (from claim, requests channel)"
UID = "bb55e2a1-7c3d-4f0e-9a8b-0123456789ea"


def channel(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ComputeDomainChannelConfig", **fields}


def daemon(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ComputeDomainDaemonConfig", **fields}


def refusal(parameters: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_compute_domain_config(parameters, source=SOURCE)
    message = str(info.value)
    assert message.startswith(f"{SOURCE}: "), message
    return message


def test_the_workload_template_nvidia_writes_parses() -> None:
    # compute-domain-workload-claim-template.tmpl.yaml: allocationMode always written.
    for mode in ("Single", "All"):
        config = parse_compute_domain_config(
            channel(domainID=UID, allocationMode=mode), source=SOURCE
        )
        assert isinstance(config, ComputeDomainChannelConfig)
        assert (config.domain_id, config.all_channels) == (UID, mode == "All")


def test_the_daemon_template_nvidia_writes_parses() -> None:
    config = parse_compute_domain_config(daemon(domainID=UID), source=SOURCE)
    assert isinstance(config, ComputeDomainDaemonConfig)
    assert config.domain_id == UID


def test_an_absent_allocation_mode_means_one_channel_and_stays_absent() -> None:
    config = parse_compute_domain_config(channel(domainID=UID), source=SOURCE)
    assert isinstance(config, ComputeDomainChannelConfig)
    assert config.allocation_mode is None and not config.all_channels
    assert config.normalized() == config


def test_defaults_name_no_domain_and_so_fail_validation_as_nvidias_do() -> None:
    for default in (ComputeDomainChannelConfig.default(), ComputeDomainDaemonConfig.default()):
        assert default.api_version == API_VERSION and default.domain_id == ""
        with pytest.raises(ConfigError, match=r'^x: field "domainID": cannot be empty$'):
            validate_compute_domain_config(default, source="x")


def test_decode_checks_the_shape_only() -> None:
    config = decode_compute_domain_config(channel(domainID="not-a-uid"), source=SOURCE)
    assert config.domain_id == "not-a-uid"
    with pytest.raises(ConfigError, match="not a ComputeDomain UID"):
        validate_compute_domain_config(config, source=SOURCE)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (channel(), 'field "domainID": cannot be empty'),
        (channel(domainID=""), 'field "domainID": cannot be empty'),
        (daemon(), 'field "domainID": cannot be empty'),
        (channel(domainID="cd-1"), "'cd-1' is not a ComputeDomain UID"),
        (channel(domainID=UID.upper()), "is not a ComputeDomain UID"),
        (daemon(domainID=f"../{UID}"), "is not a ComputeDomain UID"),
        (daemon(domainID=f"{UID}\n"), "is not a ComputeDomain UID"),
        (channel(domainID=7), 'field "domainID": 7: Input should be a valid string'),
        (channel(domainID=None), 'field "domainID": None: Input should be a valid string'),
        # NVIDIA's JSON field is domainID: the camelCase a generator would make is unknown.
        (channel(domainId=UID), 'field "domainId": unknown field, not allowed'),
        (channel(domain_id=UID), 'field "domain_id": unknown field, not allowed'),
        (channel(domainID=UID, unexpectedField=1), '"unexpectedField": unknown field'),
        (channel(domainID=UID, allocationMode="all"), "Input should be 'All' or 'Single'"),
        (channel(domainID=UID, allocationMode=""), "Input should be 'All' or 'Single'"),
        (channel(domainID=UID, allocationMode="ExactCount"), "'All' or 'Single'"),
        (channel(domainID=UID, allocationMode=1), 'field "allocationMode"'),
        # allocationMode belongs to the channel only.
        (
            daemon(domainID=UID, allocationMode="Single"),
            '"allocationMode": unknown field, not allowed (allowed there: apiVersion, domainID, '
            "kind)",
        ),
        (channel(domainID=UID, apiVersion="resource.nvidia.com/v1"), 'field "apiVersion"'),
        ({"kind": "ComputeDomainDaemonConfig", "domainID": UID}, 'field "apiVersion"'),
        (
            {"apiVersion": API_VERSION, "domainID": UID},
            'field "kind": required (only ComputeDomainChannelConfig or ComputeDomainDaemonConfig)',
        ),
        (channel(domainID=UID, kind="GpuConfig"), "field \"kind\": 'GpuConfig' is not supported"),
        (channel(domainID=UID, kind="computeDomainChannelConfig"), "is not supported"),
        (channel(domainID=UID, kind=["ComputeDomainChannelConfig"]), "is not supported"),
        (None, "parameters must be an object, got nothing"),
        ([UID], "parameters must be an object, got list"),
        ("ComputeDomainChannelConfig", "parameters must be an object, got str"),
    ],
)
def test_refusals_name_the_config_and_the_field(parameters: Any, expected: str) -> None:
    assert expected in refusal(parameters)


def test_a_long_domain_id_is_shortened_in_the_message() -> None:
    message = refusal(daemon(domainID="x" * 5000))
    assert len(message) < 300 and message.count("x") < 100


def test_the_uid_rule_is_the_api_servers() -> None:
    # The api layer cannot import driver.common.limits; the two rules must still agree.
    for value in (UID, UID.upper(), "", "cd-1", UID[:-1], f"{UID}0", UID.replace("-", "")):
        accepted = True
        try:
            parse_compute_domain_config(daemon(domainID=value), source=SOURCE)
        except ConfigError:
            accepted = False
        assert accepted == is_uid(value), value


def test_the_configs_are_frozen() -> None:
    config = parse_compute_domain_config(daemon(domainID=UID), source=SOURCE)
    with pytest.raises(ValueError, match="frozen"):
        config.domain_id = "other"


def test_names_are_nvidias() -> None:
    # cmd/compute-domain-controller/computedomain.go, daemonset.go, cdclique.go, dnsnames.go.
    assert names.DRIVER_NAME == "compute-domain.nvidia.com"
    assert names.API_VERSION == "resource.nvidia.com/v1beta1"
    assert (names.DAEMON_CLASS, names.DEFAULT_CHANNEL_CLASS) == (
        "compute-domain-daemon.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
    )
    assert names.FINALIZER == names.COMPUTE_DOMAIN_LABEL == "resource.nvidia.com/computeDomain"
    assert names.CLIQUE_LABEL == "resource.nvidia.com/computeDomain.cliqueID"
    assert names.TARGET_LABEL == "resource.nvidia.com/computeDomainTarget"
    assert names.daemon_name(UID) == f"computedomain-daemon-{UID}"
    assert names.clique_name(UID, "c0ffee.3") == f"{UID}.c0ffee.3"
    assert names.daemon_dns_name(3) == "compute-domain-daemon-0003"
    assert names.CONFIG_KIND_OF_TYPE == {
        "channel": "ComputeDomainChannelConfig",
        "daemon": "ComputeDomainDaemonConfig",
    }
    # The class selectors, character for character as NVIDIA's chart templates have them.
    assert names.DAEMON_CLASS_SELECTOR == (
        "device.driver == 'compute-domain.nvidia.com' && "
        "device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
    )
    assert names.DEFAULT_CHANNEL_CLASS_SELECTOR == (
        "device.driver == 'compute-domain.nvidia.com' && "
        "device.attributes['compute-domain.nvidia.com'].type == 'channel' && "
        "device.attributes['compute-domain.nvidia.com'].id == 0"
    )
