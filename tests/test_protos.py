"""Wire compatibility with the kubelet: names, method paths, field numbers and types."""

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from api import protogen
from api.gen import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

_T = FieldDescriptor
_STRING, _BOOL, _MESSAGE = _T.TYPE_STRING, _T.TYPE_BOOL, _T.TYPE_MESSAGE
_INT64, _ENUM = _T.TYPE_INT64, _T.TYPE_ENUM
_REPEATED = "repeated"
_SINGLE = "single"
_MAP = "map"


def _fields(file: FileDescriptor, message: str) -> dict[str, tuple[int, int, str]]:
    desc = file.message_types_by_name[message]
    out = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            label = _MAP
        elif field.is_repeated:
            label = _REPEATED
        else:
            label = _SINGLE
        out[field.name] = (field.number, field.type, label)
    return out


def _methods(file: FileDescriptor) -> dict[str, tuple[str, str]]:
    (service,) = file.services_by_name.values()
    return {
        f"/{service.full_name}/{m.name}": (m.input_type.full_name, m.output_type.full_name)
        for m in service.methods
        if not m.client_streaming and not m.server_streaming
    }


def test_registration_wire() -> None:
    file = pluginregistration_v1_pb2.DESCRIPTOR
    assert file.package == "pluginregistration"
    assert _methods(file) == {
        "/pluginregistration.Registration/GetInfo": (
            "pluginregistration.InfoRequest",
            "pluginregistration.PluginInfo",
        ),
        "/pluginregistration.Registration/NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
        ),
    }
    assert _fields(file, "PluginInfo") == {
        "type": (1, _STRING, _SINGLE),
        "name": (2, _STRING, _SINGLE),
        "endpoint": (3, _STRING, _SINGLE),
        "supported_versions": (4, _STRING, _REPEATED),
    }
    assert _fields(file, "RegistrationStatus") == {
        "plugin_registered": (1, _BOOL, _SINGLE),
        "error": (2, _STRING, _SINGLE),
    }
    assert _fields(file, "InfoRequest") == {}
    assert _fields(file, "RegistrationStatusResponse") == {}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_wire(version: str) -> None:
    file = {"v1": dra_v1_pb2, "v1beta1": dra_v1beta1_pb2}[version].DESCRIPTOR
    pkg = f"k8s.io.kubelet.pkg.apis.dra.{version}"
    assert file.package == pkg
    assert _methods(file) == {
        f"/{pkg}.DRAPlugin/NodePrepareResources": (
            f"{pkg}.NodePrepareResourcesRequest",
            f"{pkg}.NodePrepareResourcesResponse",
        ),
        f"/{pkg}.DRAPlugin/NodeUnprepareResources": (
            f"{pkg}.NodeUnprepareResourcesRequest",
            f"{pkg}.NodeUnprepareResourcesResponse",
        ),
    }
    assert _fields(file, "Claim") == {
        "namespace": (1, _STRING, _SINGLE),
        "uid": (2, _STRING, _SINGLE),
        "name": (3, _STRING, _SINGLE),
    }
    for request in ("NodePrepareResourcesRequest", "NodeUnprepareResourcesRequest"):
        assert _fields(file, request) == {"claims": (1, _MESSAGE, _REPEATED)}
    for response in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        assert _fields(file, response) == {"claims": (1, _MESSAGE, _MAP)}
    assert _fields(file, "NodePrepareResourceResponse") == {
        "devices": (1, _MESSAGE, _REPEATED),
        "error": (2, _STRING, _SINGLE),
    }
    assert _fields(file, "NodeUnprepareResourceResponse") == {"error": (1, _STRING, _SINGLE)}
    device = {
        "request_names": (1, _STRING, _REPEATED),
        "pool_name": (2, _STRING, _SINGLE),
        "device_name": (3, _STRING, _SINGLE),
        "cdi_device_ids": (4, _STRING, _REPEATED),
    }
    if version == "v1":
        device["share_id"] = (5, _STRING, _SINGLE)
        assert file.message_types_by_name["Device"].fields_by_name["share_id"].has_presence
    assert _fields(file, "Device") == device
    map_value = file.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"]
    key, value = map_value.message_type.fields
    assert (key.type, value.message_type.name) == (_STRING, "NodePrepareResourceResponse")


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_health_wire(version: str) -> None:
    # k8s.io/kubelet/pkg/apis/dra-health/<version>/api.proto: the package is the bare version.
    file = {"v1alpha1": dra_health_v1alpha1_pb2, "v1": dra_health_v1_pb2}[version].DESCRIPTOR
    assert file.package == version
    (service,) = file.services_by_name.values()
    assert service.full_name == f"{version}.DRAResourceHealth"
    (method,) = service.methods
    assert (method.name, method.client_streaming, method.server_streaming) == (
        "NodeWatchResources",
        False,
        True,
    )
    assert (method.input_type.full_name, method.output_type.full_name) == (
        f"{version}.NodeWatchResourcesRequest",
        f"{version}.NodeWatchResourcesResponse",
    )
    assert _fields(file, "NodeWatchResourcesRequest") == {}
    assert _fields(file, "NodeWatchResourcesResponse") == {"devices": (1, _MESSAGE, _REPEATED)}
    assert _fields(file, "DeviceIdentifier") == {
        "pool_name": (1, _STRING, _SINGLE),
        "device_name": (2, _STRING, _SINGLE),
    }
    assert _fields(file, "DeviceHealth") == {
        "device": (1, _MESSAGE, _SINGLE),
        "health": (2, _ENUM, _SINGLE),
        "last_updated_time": (3, _INT64, _SINGLE),
        "health_check_timeout_seconds": (4, _INT64, _SINGLE),
        "message": (5, _STRING, _SINGLE),
    }
    status = file.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_v1beta1_bytes_parse_as_v1() -> None:
    # The v1beta1 servicer converts through the wire format; this is why that is sound.
    beta = dra_v1beta1_pb2.NodePrepareResourcesResponse()
    entry = beta.claims["uid-1"]
    entry.devices.add(request_names=["gpu"], pool_name="n", device_name="gpu-0")
    v1 = dra_v1_pb2.NodePrepareResourcesResponse.FromString(beta.SerializeToString())
    assert v1.claims["uid-1"].devices[0].device_name == "gpu-0"
    assert not v1.claims["uid-1"].devices[0].HasField("share_id")


def test_generated_code_is_current(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    names = sorted(p.name for p in written)
    committed = sorted(p.name for p in protogen.GEN_DIR.iterdir() if p.is_file())
    assert names == committed, "api/gen differs from `make proto` output in its file list"
    for path in written:
        assert path.read_bytes() == (protogen.GEN_DIR / path.name).read_bytes(), (
            f"api/gen/{path.name} is stale: run `make proto`"
        )
