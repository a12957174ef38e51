"""Realistic mistakes, each with the exact problem ``gpu-dra validate`` reports for it.

Each case is one manifest set with one mistake a user makes (a typo in an attribute, a
quantity written as people write it, a pod naming the wrong claim, ...) and every line
validate prints for it: field path, message and, where one exists, the suggestion. The
last tests prove the other side: no problem on the chart's examples, nor on claims
written the way NVIDIA's DRA driver documents them for gpu.nvidia.com.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.apiserver import LocalApiServer
from tools.validation import Severity, parse_version, validate_sources

ROOT = Path(__file__).parent.parent
GPU = 'device.attributes["gpu.nvidia.com"]'
CAP = 'device.capacity["gpu.nvidia.com"]'
# Every capacity a device of ours may publish (GPUs: memory; MIG devices: the rest).
CAPACITIES = (
    "copyEngines, decoders, encoders, jpegEngines, memory, "
    + ", ".join(f"memorySlice{i}" for i in range(8))
    + ", multiprocessors, ofaEngines"
)
SELECTOR = "spec.devices.requests[0].exactly.selectors[0].cel.expression"
OPAQUE_PATH = "spec.devices.config[0].opaque.parameters"
GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}


def claim(
    *selectors: str,
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    name: str = "c",
    requests: list[dict[str, Any]] | None = None,
    **exactly: Any,
) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            **({"selectors": [{"cel": {"expression": s}} for s in selectors]} if selectors else {}),
            **exactly,
        },
    }
    devices: dict[str, Any] = {"requests": requests or [request]}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def template(name: str = "t", requests: tuple[str, ...] = ("gpu",)) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        for r in requests
                    ]
                }
            }
        },
    }


def gpu_config(**parameters: Any) -> list[dict[str, Any]]:
    return [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {**GPU_CONFIG, **parameters}}}]


def mig_claim(config: list[dict[str, Any]]) -> dict[str, Any]:
    return claim(
        config=config,
        requests=[{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}],
    )


def opaque(driver: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"opaque": {"driver": driver, "parameters": parameters}}]


# A class of the files that selects every device of the driver: GPUs and MIG devices alike.
ANY_NVIDIA = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "any.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
}
UID = "bb55e2a1-7c3d-4f0e-9a8b-0123456789ea"
ONLY_GPU_CONFIG = 'the plugin would reject it: GpuConfig: field "kind": '
MIG_SHARING = (
    "sharing (TimeSlicing, MPS) is not supported on MIG devices; write the config without "
    "sharing for these requests"
)


def pod_spec(
    uses: str = "gpu", entries: list[dict[str, Any]] | None = None, request: str | None = None
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": uses, **({"request": request} if request else {})}
    return {
        "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [ref]}}],
        "resourceClaims": entries
        if entries is not None
        else [{"name": "gpu", "resourceClaimTemplateName": "t"}],
    }


def pod(**kwargs: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": pod_spec(**kwargs),
    }


def job(**kwargs: Any) -> dict[str, Any]:
    spec = {**pod_spec(**kwargs), "restartPolicy": "Never"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": spec}},
    }


def deployment(**kwargs: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_spec(**kwargs)},
        },
    }


def device_class(expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "h100.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


# (id, documents, Kubernetes version, [(object, field path, severity, exact message)])
MISTAKES: list[tuple[str, list[dict[str, Any]], str, list[tuple[str, str, str, str]]]] = [
    (
        "misspelled attribute",
        [claim(f'{GPU}.prodcutName == "NVIDIA H100 80GB HBM3"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:36: gpu.nvidia.com publishes no attribute 'prodcutName'; did you mean "
                "productName?",
            ),
        ],
    ),
    (
        "attribute in the wrong case",
        [claim(f'{GPU}.productname.startsWith("NVIDIA H100")')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:36: gpu.nvidia.com publishes no attribute 'productname'; did you mean "
                "productName?",
            ),
        ],
    ),
    (
        "attribute by index, misspelled",
        [claim(f'{GPU}["cudaComputeCapabilty"].isGreaterThan(semver("8.0.0"))')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:36: gpu.nvidia.com publishes no attribute 'cudaComputeCapabilty'; did you "
                "mean cudaComputeCapability?",
            ),
        ],
    ),
    (
        "quantity with a byte suffix",
        [claim(f'{CAP}.memory.compareTo(quantity("40GiB")) >= 0')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:61: quantity('40GiB') fails on every device: not a quantity; did you mean "
                'quantity("40Gi")?',
            ),
        ],
    ),
    (
        "quantity with a space and GB",
        [claim(f'{CAP}.memory.compareTo(quantity("80 GB")) >= 0')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:61: quantity('80 GB') fails on every device: not a quantity; did you mean "
                'quantity("80G")?',
            ),
        ],
    ),
    (
        "quantity that is no number",
        [claim(f'{CAP}.memory.compareTo(quantity("lots")) >= 0')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:61: quantity('lots') fails on every device: not a quantity; e.g. 40Gi, "
                "512Mi, 80G",
            ),
        ],
    ),
    (
        "semver with two parts",
        [claim(f'{GPU}.cudaDriverVersion.isGreaterThan(semver("12.4"))')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:76: semver('12.4') fails on every device: no major, minor and patch version "
                "in '12.4'; did you mean semver(\"12.4.0\")?",
            ),
        ],
    ),
    (
        "semver as nvidia-smi prints it",
        [claim(f'{GPU}.driverVersion.compareTo(semver("580.95.05")) >= 0')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:68: semver('580.95.05') fails on every device: patch number must not contain "
                "leading zeroes '05' of '580.95.05'; did you mean semver(\"580.95.5\")?",
            ),
        ],
    ),
    (
        "int attribute against a string",
        [claim(f'{GPU}.memory == "81559"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:44: attribute memory is an int, compared with a string: never true; write "
                "the number without quotes",
            ),
        ],
    ),
    (
        "string attribute against an int",
        [claim(f"{GPU}.productName == 100")],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:49: attribute productName is a string, compared with an int: never true; "
                "compare it with a string",
            ),
        ],
    ),
    (
        "version against a string",
        [claim(f'{GPU}.driverVersion == "580.95.5"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:51: attribute driverVersion is a version, compared with a string: never "
                'true; write semver("580.95.5")',
            ),
        ],
    ),
    (
        "version ordered with >=",
        [claim(f'{GPU}.cudaDriverVersion >= semver("12.4.0")')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:55: attribute cudaDriverVersion is a version: compare with semver(...) "
                "through compareTo, isGreaterThan or isLessThan, not >=",
            ),
        ],
    ),
    (
        "capacity compared with an int",
        [claim(f"{CAP}.memory.isGreaterThan(40)")],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "invalid CEL: 1:55: found no matching overload for 'isGreaterThan' applied to "
                "'kubernetes.Quantity.(int)'"
                " (must be a bool expression over device, in Kubernetes' DRA CEL)",
            ),
        ],
    ),
    (
        "attribute domain misspelled",
        [claim('device.attributes["gpu.nvidia.co"].productName == "x"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:18: no driver publishes domain 'gpu.nvidia.co'; did you mean gpu.nvidia.com?",
            ),
        ],
    ),
    (
        "qualified name as the map key",
        [claim('device.attributes["gpu.nvidia.com/productName"] == "x"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "invalid CEL: 1:49: found no matching overload for '_==_' applied to "
                "'(map(string, dyn), string)'"
                " (must be a bool expression over device, in Kubernetes' DRA CEL)",
            ),
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:18: device.attributes is keyed by domain alone: write "
                'device.attributes["gpu.nvidia.com"].productName, not '
                'device.attributes["gpu.nvidia.com/productName"]',
            ),
        ],
    ),
    (
        "domain level left out",
        [claim('device.attributes.productName == "x"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "invalid CEL: 1:31: found no matching overload for '_==_' applied to "
                "'(map(string, dyn), string)'"
                " (must be a bool expression over device, in Kubernetes' DRA CEL)",
            ),
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:18: device.attributes is keyed by domain: write "
                'device.attributes["gpu.nvidia.com"].productName',
            ),
        ],
    ),
    (
        "driver name misspelled",
        [claim('device.driver == "gpu.nvidia.co"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:18: no driver is named 'gpu.nvidia.co'; did you mean gpu.nvidia.com?",
            ),
        ],
    ),
    (
        "presence test with a typo",
        [claim(f'"nvlinkdomain" in {GPU} && {GPU}.nvlinkDomain != ""')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:1: gpu.nvidia.com publishes no attribute 'nvlinkdomain'; did you mean "
                "nvlinkDomain?",
            ),
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "warning",
                "1:93: nvlinkDomain is absent on GPUs without it, where this expression fails "
                "and stops the claim's allocation on that node: guard it with "
                '"nvlinkDomain" in device.attributes["gpu.nvidia.com"] && ...',
            ),
        ],
    ),
    (
        "optional attribute read without a guard",
        [claim(f'{GPU}.nvlinkDomain.startsWith("node-a")')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "warning",
                "1:36: nvlinkDomain is absent on GPUs without it, where this expression fails "
                "and stops the claim's allocation on that node: guard it with "
                '"nvlinkDomain" in device.attributes["gpu.nvidia.com"] && ...',
            ),
        ],
    ),
    (
        "string method on an int",
        [claim(f'{GPU}.memory.startsWith("8")')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:54: attribute memory is an int: it has no method startsWith() (it has none: "
                "use operators such as == and <)",
            ),
        ],
    ),
    (
        "capacity name abbreviated",
        [claim(f'{CAP}.mem.compareTo(quantity("40Gi")) >= 0')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "1:34: gpu.nvidia.com publishes no capacity 'mem' (it has: "
                f"{CAPACITIES}); did you mean memory?",
            ),
        ],
    ),
    (
        "mistake on the second line",
        [claim(f'{GPU}.type == "gpu" &&\n  {GPU}.archtecture == "Hopper"')],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "error",
                "2:38: gpu.nvidia.com publishes no attribute 'archtecture'; did you mean "
                "architecture?",
            ),
        ],
    ),
    (
        "class selector misspelled",
        [device_class(f'{GPU}.prodName.startsWith("NVIDIA H100")')],
        "1.34",
        [
            (
                "DeviceClass/h100.nvidia.com",
                "spec.selectors[0].cel.expression",
                "error",
                "1:36: gpu.nvidia.com publishes no attribute 'prodName'; did you mean productName?",
            ),
        ],
    ),
    (
        "matchAttribute misspelled",
        [claim(count=4, constraints=[{"matchAttribute": "gpu.nvidia.com/nvlinkdomain"}])],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.constraints[0].matchAttribute",
                "error",
                "'gpu.nvidia.com/nvlinkdomain': gpu.nvidia.com publishes no attribute "
                "'nvlinkdomain', so the constraint can never be met; did you mean "
                "gpu.nvidia.com/nvlinkDomain?",
            ),
        ],
    ),
    (
        "matchAttribute on the standard domain misspelled",
        [claim(count=2, constraints=[{"matchAttribute": "resource.kubernetes.io/pcieroot"}])],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.constraints[0].matchAttribute",
                "error",
                "'resource.kubernetes.io/pcieroot': resource.kubernetes.io publishes no "
                "attribute 'pcieroot', so the constraint can never be met; did you mean "
                "resource.kubernetes.io/pcieRoot?",
            ),
        ],
    ),
    (
        "matchAttribute abbreviated",
        [claim(count=4, constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}])],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.constraints[0].matchAttribute",
                "error",
                "'gpu.nvidia.com/numa': gpu.nvidia.com publishes no attribute 'numa', so the "
                "constraint can never be met; did you mean gpu.nvidia.com/numaNode?",
            ),
        ],
    ),
    (
        "matchAttribute domain misspelled",
        [claim(count=4, constraints=[{"matchAttribute": "gpu.nvidia.co/nvlinkDomain"}])],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.constraints[0].matchAttribute",
                "error",
                "'gpu.nvidia.co/nvlinkDomain': no driver publishes domain 'gpu.nvidia.co'; did "
                "you mean gpu.nvidia.com?",
            ),
        ],
    ),
    (
        "capacity request in words",
        [claim(capacity={"requests": {"memory": "forty"}})],
        "1.36",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.capacity.requests.memory",
                "error",
                "'forty' is not a quantity (e.g. 40Gi, 512Mi); the API server rejects it",
            ),
        ],
    ),
    (
        "capacity request misspelled",
        [claim(capacity={"requests": {"memroy": "40Gi"}})],
        "1.36",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.capacity.requests.memroy",
                "error",
                f"gpu.nvidia.com publishes no capacity 'memroy' (it has: {CAPACITIES}); did "
                "you mean memory?",
            ),
        ],
    ),
    (
        "GpuConfig field misspelled",
        [claim(config=gpu_config(sharng={"strategy": "TimeSlicing"}))],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                'the plugin would reject it: GpuConfig: field "sharng": unknown field, not '
                "allowed (allowed there: apiVersion, kind, sharing); did you mean sharing?",
            ),
        ],
    ),
    (
        "GpuConfig without apiVersion",
        [
            claim(
                config=[
                    {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}
                ]
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                'the plugin would reject it: GpuConfig: field "apiVersion": required',
            ),
        ],
    ),
    (
        "GpuConfig of another kind",
        [
            claim(
                config=[
                    {
                        "opaque": {
                            "driver": "gpu.nvidia.com",
                            "parameters": {**GPU_CONFIG, "kind": "MigDeviceConfig"},
                        }
                    }
                ]
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                "the plugin would reject it: GpuConfig: field \"kind\": 'MigDeviceConfig' is "
                "not supported (only GpuConfig): NVIDIA's config for MIG devices; this driver "
                "configures a MIG device with a GpuConfig, and shares none (drop the config, or "
                "write kind GpuConfig without sharing)",
            ),
        ],
    ),
    (
        "GpuConfig with a nested typo",
        [
            claim(
                config=gpu_config(
                    sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercent": 50}}
                )
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                "the plugin would reject it: GpuConfig: field "
                '"sharing.mpsConfig.defaultActiveThreadPercent": unknown field, not allowed '
                "(allowed there: defaultActiveThreadPercentage, "
                "defaultPerDevicePinnedMemoryLimit, defaultPinnedDeviceMemoryLimit); did you "
                "mean defaultActiveThreadPercentage?",
            ),
        ],
    ),
    (
        "GpuConfig out of range",
        [
            claim(
                config=gpu_config(
                    sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}
                )
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                "the plugin would reject it: GpuConfig: field "
                '"sharing.mpsConfig.defaultActiveThreadPercentage": 150: Input should be less '
                "than or equal to 100",
            ),
        ],
    ),
    (
        "GpuConfig with an unknown strategy",
        [claim(config=gpu_config(sharing={"strategy": "TimeSlice"}))],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.parameters",
                "error",
                'the plugin would reject it: GpuConfig: field "sharing.strategy": unknown GPU '
                "sharing strategy TimeSlice (must be TimeSlicing or MPS)",
            ),
        ],
    ),
    (
        "GpuConfig sharing on a MIG request",
        [mig_claim(gpu_config(sharing={"strategy": "TimeSlicing"}))],
        "1.34",
        [
            (
                "ResourceClaim/c",
                OPAQUE_PATH,
                "error",
                "the plugin would reject it at prepare on request 'gpu', whose class "
                "mig.nvidia.com and selectors select only MIG devices: field "
                f"\"sharing.strategy\": 'TimeSlicing': {MIG_SHARING}",
            ),
        ],
    ),
    (
        "GpuConfig sharing in a class of MIG devices",
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "shared-mig.example.com"},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": 'device.driver == "gpu.nvidia.com" && '
                                f'{GPU}.type == "mig"'
                            }
                        }
                    ],
                    "config": gpu_config(sharing={"strategy": "TimeSlicing"}),
                },
            }
        ],
        "1.34",
        [
            (
                "DeviceClass/shared-mig.example.com",
                "spec.config[0].opaque.parameters",
                "error",
                "the plugin would reject it at prepare on every request of this class, whose "
                "selectors select only MIG devices: field "
                f"\"sharing.strategy\": 'TimeSlicing': {MIG_SHARING}",
            ),
        ],
    ),
    (
        "GpuConfig sharing on a request that may get a MIG device",
        [
            ANY_NVIDIA,
            claim(
                config=gpu_config(sharing={"strategy": "MPS"}),
                requests=[{"name": "gpu", "exactly": {"deviceClassName": "any.nvidia.com"}}],
            ),
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                OPAQUE_PATH,
                "warning",
                "the plugin would reject it at prepare on request 'gpu', whose class "
                "any.nvidia.com and selectors select MIG devices among others (refused if it "
                f"gets one): field \"sharing.strategy\": 'MPS': {MIG_SHARING}",
            ),
        ],
    ),
    (
        "two GpuConfigs for one request",
        [
            claim(
                config=gpu_config(sharing={"strategy": "MPS"})
                + gpu_config(sharing={"strategy": "TimeSlicing"})
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[1]",
                "error",
                "the plugin would reject the claim at prepare: config[0] and config[1] both "
                "configure request gpu differently: conflicting configs for one device (at "
                "most one must apply)",
            ),
        ],
    ),
    (
        "NVIDIA's VfioDeviceConfig",
        [
            claim(
                config=opaque(
                    "gpu.nvidia.com",
                    {**GPU_CONFIG, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "x"}},
                )
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                OPAQUE_PATH,
                "error",
                ONLY_GPU_CONFIG + "'VfioDeviceConfig' is not supported (only GpuConfig): "
                "NVIDIA's VFIO passthrough config; this driver has no passthrough devices",
            ),
        ],
    ),
    (
        "a ComputeDomain config under the GPU driver",
        [
            claim(
                config=opaque(
                    "gpu.nvidia.com",
                    {**GPU_CONFIG, "kind": "ComputeDomainChannelConfig", "domainID": UID},
                )
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                OPAQUE_PATH,
                "error",
                ONLY_GPU_CONFIG + "'ComputeDomainChannelConfig' is not supported (only "
                "GpuConfig): a config of driver compute-domain.nvidia.com: write that driver",
            ),
        ],
    ),
    (
        "GpuConfig for a misspelled driver",
        [claim(config=opaque("gpu.nvidia.co", {**GPU_CONFIG, "sharing": {"strategy": "MPS"}}))],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.driver",
                "error",
                "the plugin would reject it at prepare on request 'gpu': field "
                "\"opaque.driver\": a GpuConfig for driver 'gpu.nvidia.co', but its requests "
                "are allocated from 'gpu.nvidia.com'; it would be ignored (write "
                "'gpu.nvidia.com')",
            ),
        ],
    ),
    (
        "a config for a driver nobody publishes",
        [claim(config=opaque("efa.example.com", {"mode": "fast"}))],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.config[0].opaque.driver",
                "error",
                "'efa.example.com': no DeviceClass of the chart, the files given or the "
                "cluster selects devices of this driver (known: compute-domain.nvidia.com, "
                "gpu.nvidia.com), so the config applies to nothing (--defined-elsewhere if it "
                "is)",
            ),
        ],
    ),
    (
        "every unknown field of an object",
        [
            claim(
                requests=[
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "cuont": 2,
                            "selector": [],
                        },
                    }
                ]
            )
        ],
        "1.34",
        [
            (
                "ResourceClaim/c",
                "spec.devices.requests[0].exactly.cuont",
                "error",
                "unknown field 'cuont'; did you mean count?; unknown field 'selector' too (did "
                "you mean selectors?)",
            ),
        ],
    ),
    (
        "adminAccess in a namespace without the label",
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "team", "labels": {"tier": "ml"}},
            },
            {
                **claim(adminAccess=True),
                "metadata": {"name": "c", "namespace": "team"},
            },
        ],
        "1.34",
        [
            (
                "ResourceClaim/team/c",
                "spec.devices.requests[0].exactly.adminAccess",
                "error",
                "true: namespace 'team' has no label resource.kubernetes.io/admin-access, and "
                "the API server allows admin access only with "
                'resource.kubernetes.io/admin-access: "true"',
            ),
        ],
    ),
    (
        "container names a claim the pod lacks",
        [template(), pod(uses="gpus")],
        "1.34",
        [
            (
                "Pod/p",
                "spec.containers[0].resources.claims[0].name",
                "error",
                "the pod has no resourceClaims entry 'gpus', so the pod can never start; must be "
                "one of its entries (gpu); did you mean gpu?",
            ),
            (
                "Pod/p",
                "spec.resourceClaims[0]",
                "warning",
                "no container lists 'gpu' in resources.claims: its devices are allocated but no "
                "container gets them (each entry must be in some container's resources.claims, "
                "or be removed)",
            ),
        ],
    ),
    (
        "pod names a template nobody wrote",
        [
            template("single-gpu"),
            pod(entries=[{"name": "gpu", "resourceClaimTemplateName": "single-gpus"}]),
        ],
        "1.34",
        [
            (
                "Pod/p",
                "spec.resourceClaims[0].resourceClaimTemplateName",
                "error",
                "no ResourceClaimTemplate 'single-gpus' in namespace 'default' in the files "
                "given or the cluster (known there: single-gpu): the pod stays pending; did you "
                "mean single-gpu? (--defined-elsewhere if it is)",
            ),
        ],
    ),
    (
        "pod names a template as a claim",
        [template(), pod(entries=[{"name": "gpu", "resourceClaimName": "t"}])],
        "1.34",
        [
            (
                "Pod/p",
                "spec.resourceClaims[0].resourceClaimName",
                "error",
                "no ResourceClaim 't' in namespace 'default' in the files given or the cluster "
                "(known there: none): the pod stays pending; a ResourceClaimTemplate of that "
                "name exists: use resourceClaimTemplateName (--defined-elsewhere if it is)",
            ),
        ],
    ),
    (
        "container names a request the claim lacks",
        [template(requests=("gpus",)), pod(request="gpu")],
        "1.34",
        [
            (
                "Pod/p",
                "spec.containers[0].resources.claims[0].request",
                "error",
                "claim 'gpu' has no request 'gpu' (requests: gpus); did you mean gpus?",
            ),
        ],
    ),
    (
        "job template container names a missing claim",
        [template(), job(uses="gpu0")],
        "1.34",
        [
            (
                "Job/j",
                "spec.template.spec.containers[0].resources.claims[0].name",
                "error",
                "the pod has no resourceClaims entry 'gpu0', so the pod can never start; must be "
                "one of its entries (gpu); did you mean gpu?",
            ),
            (
                "Job/j",
                "spec.template.spec.resourceClaims[0]",
                "warning",
                "no container lists 'gpu' in resources.claims: its devices are allocated but no "
                "container gets them (each entry must be in some container's resources.claims, "
                "or be removed)",
            ),
        ],
    ),
    (
        "deployment entry names both a claim and a template",
        [
            template(),
            claim(name="t"),
            deployment(
                entries=[
                    {"name": "gpu", "resourceClaimName": "t", "resourceClaimTemplateName": "t"}
                ]
            ),
        ],
        "1.34",
        [
            (
                "Deployment/d",
                "spec.template.spec.resourceClaims[0]",
                "error",
                "exactly one of resourceClaimName and resourceClaimTemplateName",
            ),
        ],
    ),
    (
        "pod claim no container uses",
        [
            template(),
            pod(
                entries=[
                    {"name": "gpu", "resourceClaimTemplateName": "t"},
                    {"name": "extra", "resourceClaimTemplateName": "t"},
                ]
            ),
        ],
        "1.34",
        [
            (
                "Pod/p",
                "spec.resourceClaims[1]",
                "warning",
                "no container lists 'extra' in resources.claims: its devices are allocated but "
                "no container gets them (each entry must be in some container's "
                "resources.claims, or be removed)",
            ),
        ],
    ),
]


@pytest.mark.parametrize(
    ("documents", "version", "expected"),
    [pytest.param(docs, version, want, id=name) for name, docs, version, want in MISTAKES],
)
def test_mistake_is_reported_exactly(
    documents: list[dict[str, Any]], version: str, expected: list[tuple[str, str, str, str]]
) -> None:
    problems = validate_sources(
        [("m.yaml", yaml.safe_dump_all(documents))], version=parse_version(version)
    )
    got = [(p.obj, p.path, p.severity.value, p.message) for p in problems]
    assert got == expected
    assert any(p.severity is Severity.ERROR for p in problems) or all(
        e[2] == "warning" for e in expected
    )


def test_the_table_is_large_enough_and_every_case_is_a_problem() -> None:
    assert len(MISTAKES) >= 30
    assert all(want for _, _, _, want in MISTAKES)


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.yaml"))


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_no_false_positive_on_the_chart_examples_and_nvidia_style_claims(version: str) -> None:
    from tests.chart_render import render

    chart = yaml.safe_dump_all([o for o in render() if o["kind"] == "DeviceClass"])
    files = [
        *_files(ROOT / "charts" / "examples"),
        *_files(ROOT / "tests" / "data" / "nvidia-style"),
    ]
    assert len(files) >= 14
    # The EFA driver's class, which gpu-with-efa.yaml names, comes from the EFA chart.
    efa = ROOT / "tests" / "data" / "efa-deviceclass.yaml"
    sources = [("chart", chart), (str(efa), efa.read_text())]
    sources += [(str(f), f.read_text()) for f in files]
    problems = validate_sources(sources, version=parse_version(version))
    # Gated fields of the older version are warnings by design (extendedResourceName on 1.34).
    errors = [str(p) for p in problems if p.severity is Severity.ERROR]
    assert errors == []
    if version == "1.37":
        assert [str(p) for p in problems] == []


async def test_cluster_supplies_the_templates_a_pod_names(
    apiserver: LocalApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from cli import main

    apiserver.seed(
        {**template("single-gpu"), "metadata": {"name": "single-gpu", "namespace": "default"}}
    )
    kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump(pod(entries=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]))
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(pod(entries=[{"name": "gpu", "resourceClaimTemplateName": "singel-gpu"}]))
    )
    capsys.readouterr()
    argv = ["validate", "--cluster", "--kubeconfig", kubeconfig]
    assert await asyncio.to_thread(main, [*argv, str(good)]) == 0
    assert capsys.readouterr().out == "1 object, no problems\n"
    assert await asyncio.to_thread(main, [*argv, str(bad)]) == 1
    out = capsys.readouterr().out
    assert out == (
        f"{bad}: Pod/p: spec.resourceClaims[0].resourceClaimTemplateName: error: no "
        "ResourceClaimTemplate 'singel-gpu' in namespace 'default' in the files given or the "
        "cluster (known there: single-gpu): the pod stays pending; did you mean single-gpu? "
        "(--defined-elsewhere if it is)\n"
    )
    # Without the cluster no template is known: an error still, a warning when the
    # templates are defined elsewhere.
    assert await asyncio.to_thread(main, ["validate", str(bad)]) == 1
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["validate", "--defined-elsewhere", str(bad)]) == 0
    assert ": warning: no ResourceClaimTemplate 'singel-gpu'" in capsys.readouterr().out


def test_exit_status_is_documented_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli import build_parser, main

    sub = build_parser()._subparsers
    assert sub is not None
    text = next(
        p.format_help()
        for a in sub._group_actions
        for name, p in getattr(a, "choices", {}).items()
        if name == "validate"
    )
    assert "0  no errors" in text and "1  at least one error" in text and "2  usage error" in text
    clean = tmp_path / "clean.yaml"
    clean.write_text(yaml.safe_dump(claim()))
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(claim(f"{GPU}.prodcutName == 'x'")))
    capsys.readouterr()
    assert main(["validate", str(clean), str(clean)]) == 0
    # A clean run says what it read: silence would not tell that the file was read at all.
    assert capsys.readouterr().out == "2 objects, no problems\n"
    assert main(["validate", str(broken)]) == 1
    assert "no problems" not in capsys.readouterr().out
    assert main(["validate", "--kubeconfig", "k", str(clean)]) == 2
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit) as usage:
        main(["validate"])
    assert usage.value.code == 2


NVIDIA = ROOT / "tests" / "data" / "nvidia"
# NVIDIA's examples this driver does not take, and every line validate prints for them.
NVIDIA_REFUSED = {
    ("bats-gpu-simple-mig-ts.yaml", "spec.spec.devices.config[0].opaque.parameters"): (
        "'MigDeviceConfig' is not supported (only GpuConfig): NVIDIA's config for MIG devices"
    ),
    ("gpu-test-vfio-config.yaml", "spec.spec.devices.config[0].opaque.parameters"): (
        "'VfioDeviceConfig' is not supported (only GpuConfig): NVIDIA's VFIO passthrough config"
    ),
    # NVIDIA's VFIO class, which this chart does not install.
    ("gpu-test-vfio-config.yaml", "spec.spec.devices.requests[0].exactly.deviceClassName"): (
        "no DeviceClass 'vfio.gpu.nvidia.com'"
    ),
    # A mistake in NVIDIA's example: the pod's namespace is not the template's.
    ("gpu-test-vfio-config.yaml", "spec.resourceClaims[0].resourceClaimTemplateName"): (
        "no ResourceClaimTemplate 'single-gpu-full-vfioconfig' in namespace 'gpu-test-vfiopci'"
    ),
}


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_nvidia_examples_pass_where_this_driver_takes_them(version: str) -> None:
    files = _files(NVIDIA)
    assert len(files) == 16
    sources = [(str(f), f.read_text()) for f in files]
    problems = validate_sources(sources, version=parse_version(version))
    got = {(Path(p.file).name, p.path): p.message for p in problems}
    assert set(got) == set(NVIDIA_REFUSED)
    for key, fragment in NVIDIA_REFUSED.items():
        assert fragment in got[key]
    assert all(p.severity is Severity.ERROR for p in problems)
    # Their configs are NVIDIA's GpuConfig sharing and ComputeDomain channels: all read.
    configs = [f for f in files if "kind: GpuConfig" in f.read_text()]
    assert len(configs) >= 5


RUN_TOGETHER = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: t
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
apiVersion: v1
kind: Pod
metadata:
  name: p
"""


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        # Two documents without "---": read leniently, the template would vanish into the pod.
        (RUN_TOGETHER, "line 12, column 1", "duplicate key 'apiVersion' (first at line 1)"),
        (
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels: {x: '1', x: '2'}\n",
            "line 5, column 20",
            "duplicate key 'x' (first at line 5)",
        ),
    ],
)
def test_a_key_written_twice_is_an_error_at_its_line(text: str, where: str, fragment: str) -> None:
    (problem,) = validate_sources([("m.yaml", text)])
    assert (problem.obj, problem.path, problem.severity) == ("yaml", where, Severity.ERROR)
    assert fragment in problem.message
    assert "'---'" in problem.message
    # The same documents apart are fine, and a merge key may repeat a key.
    fixed = RUN_TOGETHER.replace("apiVersion: v1\n", "---\napiVersion: v1\n")
    assert all("duplicate" not in p.message for p in validate_sources([("m.yaml", fixed)]))
    merged = "a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n"
    assert all("duplicate" not in p.message for p in validate_sources([("m.yaml", merged)]))


def test_admin_access_is_judged_by_the_namespace_given() -> None:
    def namespace(labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "ops", "labels": labels},
        }

    admin = {**claim(adminAccess=True), "metadata": {"name": "c", "namespace": "ops"}}
    label = "resource.kubernetes.io/admin-access"

    def found(*docs: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (p.severity.value, p.message)
            for p in validate_sources([("m.yaml", yaml.safe_dump_all(docs))])
        ]

    assert found(namespace({label: "true"}), admin) == []
    ((severity, message),) = found(namespace({label: "false"}), admin)
    assert severity == "error" and f"namespace 'ops' has {label}: 'false'" in message
    ((severity, message),) = found(admin)  # no Namespace given: the server may still refuse
    assert severity == "warning" and "namespace 'ops' is not in the files given" in message


async def test_cluster_supplies_the_namespaces_admin_access_needs(
    apiserver: LocalApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from cli import main

    label = "resource.kubernetes.io/admin-access"
    apiserver.seed(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "ops", "labels": {label: "true"}},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
    )
    kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    files = {}
    for namespace in ("ops", "team"):
        files[namespace] = tmp_path / f"{namespace}.yaml"
        files[namespace].write_text(
            yaml.safe_dump(
                {**claim(adminAccess=True), "metadata": {"name": "c", "namespace": namespace}}
            )
        )
    argv = ["validate", "--cluster", "--kubeconfig", kubeconfig]
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*argv, str(files["ops"])]) == 0
    assert capsys.readouterr().out == "1 object, no problems\n"
    assert await asyncio.to_thread(main, [*argv, str(files["team"])]) == 1
    assert capsys.readouterr().out == (
        f"{files['team']}: ResourceClaim/team/c: spec.devices.requests[0].exactly.adminAccess: "
        f"error: true: namespace 'team' has no label {label}, and the API server allows admin "
        f'access only with {label}: "true"\n'
    )


def test_the_config_a_request_gets_is_the_one_judged_on_its_devices() -> None:
    # The plugin's choice (api.config.choose): the last config that applies wins. After the
    # one for every request, the one naming the MIG request (no sharing) is what it gets.
    for_all = gpu_config(sharing={"strategy": "TimeSlicing"})
    for_mig = [{**gpu_config()[0], "requests": ["gpu"]}]
    assert validate_sources([("m.yaml", yaml.safe_dump(mig_claim(for_all + for_mig)))]) == []
    (problem,) = validate_sources([("m.yaml", yaml.safe_dump(mig_claim(for_mig + for_all)))])
    assert problem.path == "spec.devices.config[1].opaque.parameters"
    assert "select only MIG devices" in problem.message
