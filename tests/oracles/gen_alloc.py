"""Seeded random allocation cases: nodes, ResourceSlices, DeviceClasses, one claim.

GPU-like devices (string, int, bool and version attributes, a quantity capacity) in
node-local pools of one or two drivers, sometimes split over several slices, sometimes
incomplete, outdated or invalid (a duplicate device name); shared pools for all nodes or
a node selector; devices taken by other claims. Classes and requests select with CEL
(some selectors fail at runtime on devices that lack an attribute); requests ask for
ExactCount or All, alone or as firstAvailable alternatives, with admin access, and with
tolerations for device taints; matchAttribute constraints tie requests together.

Twins: some cases add nodes that copy another node's pools but for the node's name (the
pools', the slices', an NVLink domain named after the node), as the nodes of one instance
type do, so that allocation once per node shape (tools/allocation/shapes.py) is
compared too, with other claims holding devices on some twins and not on others.

Partitionable devices (1.36): some nodes also have a pool of MIG-like placements of one
GPU, each consuming the memory slices (and multiprocessors) it occupies from a counter set
published in a counter-only slice, so that overlapping placements exclude each other.

Per version (1.34 or 1.36) the generator writes only what that version's API server
keeps: device taints need DRADeviceTaints (beta, on, from 1.36), so 1.34 cases carry none;
nor do they carry consumable capacity (DRAConsumableCapacity, beta from 1.36): GPUs with
``allowMultipleAllocations`` and a request policy of each kind the API server accepts,
requests with ``capacity.requests`` (some rounded up by the policy, some beyond it, some
naming a capacity no device has), and other claims holding shares of those GPUs.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

GPU = "gpu.nvidia.com"
NIC = "nic.example.com"
NODES = ("node-a", "node-b", "node-c")
_MODELS = ("H100", "A100", "L4")
_MEMORY = {"H100": ("80Gi", 81559), "A100": ("40Gi", 40960), "L4": ("24Gi", 23034)}
_DRIVER_VERSIONS = ("550.127.8", "570.86.15", "580.95.5")
_TAINT_KEYS = ("example.com/unhealthy", "example.com/maintenance")
# (profile, multiprocessors, memory slice starts, memory slices) of an A100-40GB's MIG.
_PLACEMENTS = (
    ("1g", 14, range(7), 1),
    ("2g", 28, (0, 2, 4), 2),
    ("3g", 42, (0, 4), 4),
    ("4g", 56, (0,), 4),
    ("7g", 98, (0,), 8),
)

# Class selectors (all compile; some fail at runtime on a device without the attribute).
_CLASS_SELECTORS = {
    "gpu": [f'device.driver == "{GPU}"'],
    "h100": [f'device.driver == "{GPU}"', f'device.attributes["{GPU}"].model == "H100"'],
    "big": [
        f'device.driver == "{GPU}"',
        f'device.capacity["{GPU}"].memory.compareTo(quantity("40Gi")) >= 0',
    ],
    "nic": [f'device.driver == "{NIC}"'],
    "any": ["true"],
}
_REQUEST_SELECTORS = (
    f'device.attributes["{GPU}"].index < 4',
    f'device.attributes["{GPU}"].migCapable',
    f'device.attributes["{GPU}"].driverVersion.isGreaterThan(semver("560.0.0"))',
    f'device.attributes["{GPU}"].model.startsWith("A") || device.driver == "{NIC}"',
    f'"migCapable" in device.attributes["{GPU}"] && device.attributes["{GPU}"].migCapable',
    f'device.capacity["{GPU}"].memory.isLessThan(quantity("48Gi"))',
    f'device.attributes["{GPU}"].model in ["H100", "L4"]',
)
# Off the 1Gi step: 500Mi, 20500Mi. No fractions such as 20.5Gi: upstream holds those as an
# inf.Dec, which its capacity check then changes in place (see test_allocator_oracle.py).
_CAPACITY_REQUESTS = ("500Mi", "1Gi", "10Gi", "20Gi", "20500Mi", "40Gi", "48Gi", "100Gi")
_HELD = ("1Gi", "8Gi", "20Gi", "40Gi")


def _policy(rng: random.Random, memory: str) -> dict[str, Any] | None:
    """A request policy the API server accepts for a capacity of ``memory`` (whole Gi)."""
    value = memory.removesuffix("Gi")
    kind = rng.randrange(5)
    if kind == 0:  # ours: whole GiB, default the whole device
        return {"default": memory, "validRange": {"min": "1Gi", "max": memory, "step": "1Gi"}}
    if kind == 1:
        return {"default": "1Gi", "validRange": {"min": "1Gi", "max": memory, "step": "1Gi"}}
    if kind == 2:  # no step, no max
        return {"default": "4Gi", "validRange": {"min": "2Gi"}}
    if kind == 3:
        return {"default": "8Gi", "validValues": ["8Gi", "16Gi", f"{value}Gi"]}
    return None  # shared without a policy: a share not asking takes it all


_MATCH_ATTRIBUTES = (
    f"{GPU}/nvlinkDomain",
    "resource.kubernetes.io/pcieRoot",
    f"{GPU}/model",
    "model",  # unqualified: never matches (constraints take fully qualified names)
    f"{GPU}/numa",
)


class _Gen:
    def __init__(self, rng: random.Random, version: str) -> None:
        self.rng = rng
        self.version = version
        self.devices: list[tuple[str, str, str]] = []  # (driver, pool, device) published
        self.shared: set[tuple[str, str, str]] = set()  # of them, allowMultipleAllocations
        self._shared_next = False

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def gpu(self, name: str, node: str, index: int) -> dict[str, Any]:
        model = self.rng.choice(_MODELS)
        memory, mib = _MEMORY[model]
        attrs: dict[str, Any] = {
            "model": {"string": model},
            "index": {"int": index},
            "memory": {"int": mib},
            "migCapable": {"bool": model != "L4"},
            "driverVersion": {"version": self.rng.choice(_DRIVER_VERSIONS)},
            "nvlinkDomain": {"string": f"{node}.nvlink-{self.rng.randrange(2)}"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{self.rng.randrange(3)}"},
            "numa": {"int": self.rng.randrange(2)},
        }
        for key in list(attrs):
            if self.chance(0.04):
                del attrs[key]  # a device without the attribute: selectors may fail on it
        device: dict[str, Any] = {
            "name": name,
            "attributes": attrs,
            "capacity": {"memory": {"value": memory}},
        }
        self._shared_next = False
        if self.version != "1.34" and self.chance(0.3):
            device["allowMultipleAllocations"] = True
            policy = _policy(self.rng, memory)
            if policy is not None:
                device["capacity"]["memory"]["requestPolicy"] = policy
            self._shared_next = True
        if self.version != "1.34" and self.chance(0.12):
            device["taints"] = [
                {
                    "key": self.rng.choice(_TAINT_KEYS),
                    "value": self.rng.choice(("", "xid-79")),
                    "effect": self.rng.choice(("NoSchedule", "NoExecute", "None")),
                }
            ]
        return device

    def nic(self, name: str, node: str) -> dict[str, Any]:
        return {
            "name": name,
            "attributes": {
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{self.rng.randrange(3)}"}
            },
        }

    def pool_slices(
        self, driver: str, pool: str, node: str | None, where: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """One pool: its slices of the current generation, maybe an old one, maybe broken."""
        count = self.rng.choice((1, 1, 1, 2))
        generation = self.rng.randrange(1, 3)
        out: list[dict[str, Any]] = []
        index = 0
        for part in range(count):
            if count > 1 and part == 1 and self.chance(0.15):
                continue  # incomplete: a slice of the pool is missing
            devices: list[dict[str, Any]] = []
            for _ in range(self.rng.randrange(0, 7)):
                name = f"{'gpu' if driver == GPU else 'nic'}-{index}"
                if self.chance(0.03) and index > 0:
                    name = f"{'gpu' if driver == GPU else 'nic'}-0"  # duplicate: invalid pool
                owner = node or "fabric"
                self._shared_next = False
                devices.append(
                    self.gpu(name, owner, index) if driver == GPU else self.nic(name, owner)
                )
                self.devices.append((driver, pool, name))
                if self._shared_next:
                    self.shared.add((driver, pool, name))
                index += 1
            out.append(
                self.slice(
                    f"{pool}-{driver}-{part}", driver, pool, generation, count, where, devices
                )
            )
        if self.chance(0.1):
            # An outdated generation: ignored by the scheduler, whatever it lists.
            old = [
                self.gpu("gpu-old", node or "fabric", 9)
                if driver == GPU
                else self.nic("nic-old", node or "fabric")
            ]
            out.append(
                self.slice(f"{pool}-{driver}-old", driver, pool, generation - 1, 1, where, old)
            )
        return out

    def twin(self, slices: list[dict[str, Any]], source: str, node: str) -> list[dict[str, Any]]:
        """The node-local slices of ``source`` as ``node`` would publish them."""
        out: list[dict[str, Any]] = []
        for original in slices:
            if original["spec"].get("nodeName") != source:
                continue
            s = json.loads(json.dumps(original))
            spec = s["spec"]
            spec["nodeName"] = node
            pool = spec["pool"]["name"]
            spec["pool"]["name"] = node + pool.removeprefix(source)
            s["metadata"]["name"] = node + s["metadata"]["name"].removeprefix(source)
            for device in spec.get("devices") or ():
                domain = device["attributes"].get("nvlinkDomain")
                if domain is not None:
                    domain["string"] = node + domain["string"].removeprefix(source)
                key = (spec["driver"], spec["pool"]["name"], device["name"])
                self.devices.append(key)
                if device.get("allowMultipleAllocations"):
                    self.shared.add(key)
            out.append(s)
        return out

    def mig_pool(self, node: str) -> list[dict[str, Any]]:
        """A pool of one GPU's placements and the counter set they consume."""
        pool = f"{node}-mig"
        counters = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
        counters["multiprocessors"] = {"value": "98"}
        counter_set = {"name": "gpu-0-counters", "counters": counters}
        devices: list[dict[str, Any]] = []
        for profile, sms, starts, size in _PLACEMENTS:
            for start in starts:
                if self.chance(0.3):
                    continue
                device = self.gpu(f"gpu-0-mig-{profile}-{start}", node, 0)
                consumed = {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}
                consumed["multiprocessors"] = {"value": str(sms)}
                device["consumesCounters"] = [
                    {"counterSet": "gpu-0-counters", "counters": consumed}
                ]
                devices.append(device)
                self.devices.append((GPU, pool, device["name"]))
        where = {"nodeName": node}
        counter_slice = self.slice(f"{pool}-counters", GPU, pool, 1, 2, where, [])
        del counter_slice["spec"]["devices"]
        counter_slice["spec"]["sharedCounters"] = [counter_set]
        return [counter_slice, self.slice(f"{pool}-devices", GPU, pool, 1, 2, where, devices)]

    def per_device_slice(self, nodes: list[str]) -> dict[str, Any]:
        """A pool whose devices each say where they are (DRAPartitionableDevices, 1.36)."""
        devices: list[dict[str, Any]] = []
        for index in range(self.rng.randrange(1, 5)):
            device = self.gpu(f"gpu-{index}", "fabric", index)
            r = self.rng.randrange(3)
            if r == 0:
                device["nodeName"] = self.rng.choice(nodes)
            elif r == 1:
                device["allNodes"] = True
            else:
                term = {
                    "matchExpressions": [{"key": "pool", "operator": "In", "values": ["infer"]}]
                }
                device["nodeSelector"] = {"nodeSelectorTerms": [term]}
            devices.append(device)
            self.devices.append((GPU, "spread", device["name"]))
        where = {"perDeviceNodeSelection": True}
        return self.slice("spread-0", GPU, "spread", 1, 1, where, devices)

    @staticmethod
    def slice(
        name: str,
        driver: str,
        pool: str,
        generation: int,
        count: int,
        where: dict[str, Any],
        devices: list[dict[str, Any]],
    ) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                **where,
                "devices": devices,
            },
        }

    def request_body(self, classes: list[str], admin: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"deviceClassName": self.rng.choice(classes)}
        if self.chance(0.15):
            body["allocationMode"] = "All"
        else:
            if self.chance(0.5):
                body["allocationMode"] = "ExactCount"
            if self.chance(0.8):
                body["count"] = self.rng.choice((1, 1, 2, 2, 3, 4))
                if self.chance(0.01):
                    body["count"] = 33  # beyond the 32-device claim limit: an error
        if self.chance(0.3):
            body["selectors"] = [
                {"cel": {"expression": self.rng.choice(_REQUEST_SELECTORS)}}
                for _ in range(self.rng.choice((1, 1, 2)))
            ]
        if admin and self.chance(0.08):
            body["adminAccess"] = True
        if self.version != "1.34" and self.chance(0.3):
            requests = {"memory": self.rng.choice(_CAPACITY_REQUESTS)}
            if self.chance(0.03):
                requests = {"cores": "1"}  # no device has it
            body["capacity"] = {"requests": requests}
        if self.version != "1.34" and self.chance(0.2):
            toleration: dict[str, Any] = {"key": self.rng.choice(_TAINT_KEYS)}
            if self.chance(0.5):
                toleration["operator"] = "Exists"
            else:
                toleration["value"] = self.rng.choice(("", "xid-79"))
            if self.chance(0.5):
                toleration["effect"] = self.rng.choice(("NoSchedule", "NoExecute"))
            body["tolerations"] = [toleration]
        return body

    def claim(self, classes: list[str]) -> dict[str, Any]:
        requests: list[dict[str, Any]] = []
        for i in range(self.rng.choice((1, 1, 2, 2, 3))):
            name = f"r{i}"
            if self.chance(0.25):
                subs = [
                    {"name": f"s{j}", **self.request_body(classes, admin=False)}
                    for j in range(self.rng.randrange(1, 4))
                ]
                requests.append({"name": name, "firstAvailable": subs})
            else:
                requests.append({"name": name, "exactly": self.request_body(classes, admin=True)})
        devices: dict[str, Any] = {"requests": requests}
        constraints: list[dict[str, Any]] = []
        for _ in range(self.rng.choice((0, 0, 1, 1, 2))):
            constraint: dict[str, Any] = {"matchAttribute": self.rng.choice(_MATCH_ATTRIBUTES)}
            names = [r["name"] for r in requests]
            names += [
                f"{r['name']}/{sub['name']}"
                for r in requests
                for sub in r.get("firstAvailable", ())
            ]
            if len(names) > 1 and self.chance(0.5):
                constraint["requests"] = self.rng.sample(names, 2)
            constraints.append(constraint)
        if constraints:
            devices["constraints"] = constraints
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "claim", "namespace": "default", "uid": "uid-claim"},
            "spec": {"devices": devices},
        }

    def allocated(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n in range(self.rng.choice((0, 0, 1, 2))):
            if not self.devices:
                break
            taken = self.rng.sample(self.devices, min(len(self.devices), self.rng.randrange(1, 4)))
            admin = self.chance(0.2)
            results: list[dict[str, Any]] = []
            for d, p, name in taken:
                result: dict[str, Any] = {
                    "request": "r",
                    "driver": d,
                    "pool": p,
                    "device": name,
                    "adminAccess": admin,
                }
                if (d, p, name) in self.shared and not admin:
                    result["shareID"] = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
                    result["consumedCapacity"] = {"memory": self.rng.choice(_HELD)}
                results.append(result)
            out.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"other-{n}", "namespace": "default", "uid": f"uid-{n}"},
                    "status": {"allocation": {"devices": {"results": results}}},
                }
            )
        return out


def case(rng: random.Random, version: str) -> dict[str, Any]:
    gen = _Gen(rng, version)
    nodes: list[dict[str, Any]] = [
        {"name": n, "labels": {"pool": rng.choice(("train", "infer"))}}
        for n in NODES[: rng.randrange(1, 4)]
    ]
    slices: list[dict[str, Any]] = []
    for node in nodes:
        slices += gen.pool_slices(GPU, node["name"], node["name"], {"nodeName": node["name"]})
        if gen.chance(0.3):
            slices += gen.pool_slices(NIC, node["name"], node["name"], {"nodeName": node["name"]})
        if version != "1.34" and gen.chance(0.3):
            slices += gen.mig_pool(node["name"])
    if gen.chance(0.3):
        source = rng.choice(nodes)
        for k in range(rng.randrange(1, 4)):
            twin = f"{source['name']}-twin{k}"
            nodes.append({"name": twin, "labels": dict(source["labels"])})
            slices += gen.twin(slices, source["name"], twin)
    if gen.chance(0.2):
        where: dict[str, Any] = {"allNodes": True}
        if gen.chance(0.5):
            term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}
            where = {"nodeSelector": {"nodeSelectorTerms": [term]}}
        slices += gen.pool_slices(rng.choice((GPU, NIC)), "fabric", None, where)
    if version != "1.34" and gen.chance(0.15):
        slices.append(gen.per_device_slice([n["name"] for n in nodes]))
    if version != "1.34":
        # 1.36 sorts a pool's slices by name; 1.34 keeps the lister's order, so its cases
        # list them by name (our order) to keep the devices picked comparable.
        rng.shuffle(slices)
    names = list(_CLASS_SELECTORS)
    classes = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in _CLASS_SELECTORS[name]]},
        }
        for name in names
    ]
    claim_classes = [*names, "missing"] if gen.chance(0.03) else names
    return {
        "kind": "allocate",
        "version": version,
        "nodes": nodes,
        "slices": slices,
        "classes": classes,
        "claim": gen.claim(claim_classes),
        "allocated": gen.allocated(),
    }


def cases(seed: int, count: int, version: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [case(rng, version) for _ in range(count)]
