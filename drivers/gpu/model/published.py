"""What this driver's devices publish, by name and type: the contract between the publisher
and ``gpu-dra validate``.

Plain constants, so the offline tools check claims against them without loading the device
kinds (and with them the API client): the kinds build devices from this table, and
tests/test_resourceslice.py checks every device they build against it.
"""

# The attributes Kubernetes itself names (pciBusID, pcieRoot, numaNode).
STANDARD_DOMAIN = "resource.kubernetes.io"

# Every attribute a GPU device may carry, by domain, with its value type (the key of the
# v1 DeviceAttribute: "string", "int", "bool", "version"). Unqualified names belong to the
# driver's domain.
DRIVER_ATTRIBUTES: dict[str, str] = {
    "architecture": "string",
    "brand": "string",
    "cudaComputeCapability": "version",
    "cudaDriverVersion": "version",
    "driverVersion": "version",
    "index": "int",
    "memory": "int",
    "minor": "int",
    "model": "string",
    "numaNode": "int",
    "nvlinkDomain": "string",
    "parentUUID": "string",  # MIG devices
    "productName": "string",
    "profile": "string",  # MIG devices: "1g.10gb"
    "type": "string",
    "uuid": "string",
}
STANDARD_ATTRIBUTES: dict[str, str] = {
    "numaNode": "int",
    "pciBusID": "string",
    "pcieRoot": "string",
}
DRIVER_CAPACITIES = frozenset(
    {"memory"}
    # MIG devices, with the names NVIDIA's driver publishes.
    | {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"}
    | {f"memorySlice{i}" for i in range(8)}
)
# Absent on hardware without them (no NUMA information, no PCIe root, no NVLink peer): a
# selector that reads one fails on such a GPU unless it guards with `in` or has().
OPTIONAL_ATTRIBUTES = frozenset({"numaNode", "pcieRoot", "nvlinkDomain"})

GIB = 1 << 30
# A shared GPU's memory (consumable capacity, drivers.gpu.kinds.capacity) is taken in whole
# GiB: at least MEMORY_MIN, rounded up to a multiple of MEMORY_STEP.
MEMORY_MIN = GIB
MEMORY_STEP = GIB
