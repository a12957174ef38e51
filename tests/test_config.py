"""Opaque GpuConfig parsing: NVIDIA-shaped manifests parse; errors name config and field."""

import pytest

from api.config import API_VERSION, ConfigError, GpuConfig, parse_gpu_config

SOURCE = "claim config #0 (requests gpu)"


def test_absent_parameters_mean_the_default() -> None:
    assert parse_gpu_config(None, source=SOURCE) == GpuConfig.default()
    assert GpuConfig.default().sharing is None


def test_minimal_manifest_parses() -> None:
    config = parse_gpu_config({"apiVersion": API_VERSION, "kind": "GpuConfig"}, source=SOURCE)
    assert config.api_version == "resource.nvidia.com/v1beta1"
    assert config.sharing is None


def test_unknown_top_level_field_names_source_and_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(
            {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharring": {}}, source=SOURCE
        )
    assert SOURCE in str(info.value)
    assert '"sharring"' in str(info.value)


def test_unknown_nested_field_names_its_path() -> None:
    params = {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Short"}},
    }
    with pytest.raises(ConfigError, match=r'"sharing\.timeSlicingConfig\.intervall"'):
        parse_gpu_config(params, source=SOURCE)


def test_snake_case_spelling_is_an_unknown_field() -> None:
    params = {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps_config": {}},
    }
    with pytest.raises(ConfigError, match=r'"sharing\.mps_config"'):
        parse_gpu_config(params, source=SOURCE)


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [
        (
            {"strategy": "TimeSlicing", "mpsConfig": {}},
            '"sharing.mpsConfig": not allowed with strategy TimeSlicing',
        ),
        (
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 2}},
            '"sharing.timeSlicingConfig.interval": 2: Input should be',
        ),
        (
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Tiny"}},
            "\"sharing.timeSlicingConfig.interval\": 'Tiny': Input should be",
        ),
        ({"strategy": "Fabric"}, "unknown GPU sharing strategy Fabric"),
        (
            {"strategy": "MPS", "timeSlicingConfig": {}},
            '"sharing.timeSlicingConfig": not allowed with strategy MPS',
        ),
    ],
)
def test_sharing_settings_parse_then_get_a_clear_refusal(
    sharing: dict[str, object], expected: str
) -> None:
    params = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(params, source=SOURCE)
    assert str(info.value).startswith(SOURCE)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("sharing", "settings"),
    [
        ({"strategy": "TimeSlicing"}, (("interval", "Default"), ("strategy", "TimeSlicing"))),
        (
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            (("interval", "Long"), ("strategy", "TimeSlicing")),
        ),
        (
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                },
            },
            (
                ("activeThreadPercentage", "50"),
                ("pinnedMemoryLimit", "10Gi"),
                ("pinnedMemoryLimit/0", "5Gi"),
                ("strategy", "MPS"),
            ),
        ),
        ({"strategy": "MPS"}, (("strategy", "MPS"),)),
        (None, ()),
    ],
)
def test_sharing_is_accepted_and_recorded_flat(
    sharing: dict[str, object] | None, settings: tuple[tuple[str, str], ...]
) -> None:
    params: dict[str, object] = {"apiVersion": API_VERSION, "kind": "GpuConfig"}
    if sharing is not None:
        params["sharing"] = sharing
    assert parse_gpu_config(params, source=SOURCE).sharing_settings() == settings


def test_normalize_fills_implied_settings() -> None:
    config = GpuConfig.model_validate(
        {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    ).normalized()
    assert config.sharing is not None
    assert config.sharing.time_slicing_config is not None
    assert config.sharing.time_slicing_config.interval == "Default"
    mps = GpuConfig.model_validate(
        {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    ).normalized()
    assert mps.sharing is not None and mps.sharing.mps_config is not None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"}, '"apiVersion"'),
        ({"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}, '"kind"'),
        ({"kind": "GpuConfig"}, '"apiVersion"'),
        (
            {
                "apiVersion": API_VERSION,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}},
            },
            '"sharing.mpsConfig.defaultActiveThreadPercentage"',
        ),
        (
            {
                "apiVersion": API_VERSION,
                "kind": "GpuConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"},
                },
            },
            '"sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"',
        ),
    ],
)
def test_bad_values_name_the_field(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(params, source=SOURCE)
    assert field in str(info.value)
    assert SOURCE in str(info.value)


def test_non_object_parameters_are_refused() -> None:
    with pytest.raises(ConfigError, match="must be an object"):
        parse_gpu_config(["not", "a", "map"], source=SOURCE)  # type: ignore[arg-type]
