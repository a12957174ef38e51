"""Seeded mutations of valid DRA manifests, to hold ``gpu-dra validate`` against the real
API server (tests/e2e/test_validate_oracle.py sends each case with ``dryRun=All``).

Pure: :func:`generate` is a function of its seed and count, so a disagreement found in one
run is the same case in the next. Each case is one manifest that differs from a valid base
(every base is accepted by the server and clean under ``validate``) by one or two mutations
of a kind a user makes: a field removed, a value of the wrong type, an enum near miss, a
list or string just at or over its limit, a number at the edge of its range, CEL that does
not compile or is not boolean, a rule across fields broken, a name that is no DNS name, an
unknown field.

Workloads (Pod, Deployment, Job) are mutated only where they touch DRA (``resourceClaims``
and the containers' ``resources.claims``): validate checks the rest of a PodSpec by the
OpenAPI schema alone, and the kubelet's own rules for images or restart policies are not
what it is for.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"
GPU_CONFIG = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
}
GPU = 'device.attributes["gpu.nvidia.com"]'

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Case:
    index: int
    base: str
    mutations: tuple[str, ...]  # "<operator> <field path>: <what>", one per mutation applied
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])


def _opaque(parameters: Any = None) -> dict[str, Any]:
    return {
        "driver": DRIVER,
        "parameters": copy.deepcopy(GPU_CONFIG) if parameters is None else parameters,
    }


def _claim_spec_exactly() -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [
                            {"cel": {"expression": f'{GPU}.productName.startsWith("NVIDIA")'}},
                            {
                                "cel": {
                                    "expression": 'device.capacity["gpu.nvidia.com"].memory'
                                    '.compareTo(quantity("40Gi")) >= 0'
                                }
                            },
                        ],
                        "tolerations": [
                            {
                                "key": "gpu.nvidia.com/xid",
                                "operator": "Equal",
                                "value": "79",
                                "effect": "NoSchedule",
                            },
                            {
                                "key": "example.com/maintenance",
                                "operator": "Exists",
                                "effect": "NoExecute",
                                "tolerationSeconds": 300,
                            },
                        ],
                    },
                }
            ],
            "constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/productName"}],
            "config": [{"requests": ["gpus"], "opaque": _opaque()}],
        }
    }


def _claim_spec_first_available() -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {
                            "name": "full",
                            "deviceClassName": "gpu.nvidia.com",
                            "count": 1,
                            "selectors": [{"cel": {"expression": f"{GPU}.memory >= 40000"}}],
                        },
                        {
                            "name": "slice",
                            "deviceClassName": "mig.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "selectors": [{"cel": {"expression": f'{GPU}.profile == "1g.10gb"'}}],
                        },
                    ],
                },
                {
                    "name": "helper",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
                },
            ],
            "constraints": [
                {"requests": ["gpu", "helper"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            ],
            "config": [{"requests": ["gpu/full"], "opaque": _opaque()}],
        }
    }


def _claim_spec_capacity() -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "share",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "capacity": {"requests": {"memory": "20Gi"}},
                    },
                },
                {"name": "other", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            ],
            "constraints": [
                {"requests": ["share", "other"], "distinctAttribute": "gpu.nvidia.com/uuid"}
            ],
        }
    }


def _pod_spec() -> dict[str, Any]:
    return {
        "resourceClaims": [
            {"name": "gpus", "resourceClaimTemplateName": "oracle-template"},
            {"name": "shared", "resourceClaimName": "oracle-claim"},
        ],
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpus", "request": "share"}, {"name": "shared"}]},
            },
            {
                "name": "sidecar",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "shared"}]},
            },
        ],
    }


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"app.kubernetes.io/name": "oracle", "tier": "gpu"}}


def _bases() -> dict[str, dict[str, Any]]:
    v1 = "resource.k8s.io/v1"
    return {
        "DeviceClass": {
            "apiVersion": v1,
            "kind": "DeviceClass",
            "metadata": _meta("oracle-gpu"),
            "spec": {
                "selectors": [
                    {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                    {"cel": {"expression": f'{GPU}.type == "gpu"'}},
                ],
                "config": [{"opaque": _opaque()}],
            },
        },
        "ResourceClaim/exactly": {
            "apiVersion": v1,
            "kind": "ResourceClaim",
            "metadata": _meta("oracle-claim"),
            "spec": _claim_spec_exactly(),
        },
        "ResourceClaim/firstAvailable": {
            "apiVersion": v1,
            "kind": "ResourceClaim",
            "metadata": _meta("oracle-first"),
            "spec": _claim_spec_first_available(),
        },
        "ResourceClaimTemplate": {
            "apiVersion": v1,
            "kind": "ResourceClaimTemplate",
            "metadata": _meta("oracle-template"),
            "spec": {"metadata": {"labels": {"app": "oracle"}}, "spec": _claim_spec_capacity()},
        },
        "ResourceClaimTemplate/firstAvailable": {
            "apiVersion": v1,
            "kind": "ResourceClaimTemplate",
            "metadata": _meta("oracle-template-first"),
            "spec": {"spec": _claim_spec_first_available()},
        },
        "Pod": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _meta("oracle-pod"),
            "spec": _pod_spec(),
        },
        "Deployment": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta("oracle-deployment"),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "oracle"}},
                "template": {"metadata": {"labels": {"app": "oracle"}}, "spec": _pod_spec()},
            },
        },
        "Job": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta("oracle-job"),
            "spec": {
                "template": {
                    "metadata": {"labels": {"app": "oracle"}},
                    "spec": {**_pod_spec(), "restartPolicy": "Never"},
                }
            },
        },
    }


BASES = _bases()
BASE_NAMES = tuple(BASES)

# Where a workload's PodSpec sits.
_POD_SPEC = {"Pod": ("spec",), "Deployment": ("spec", "template", "spec"),
             "Job": ("spec", "template", "spec")}  # fmt: skip


def base(name: str) -> dict[str, Any]:
    return copy.deepcopy(BASES[name])


# ---- paths ----------------------------------------------------------------------------


def path_text(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _walk(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))


def _mutable(doc: dict[str, Any], path: Path) -> bool:
    """Paths a mutation may touch: not apiVersion, kind or namespace (they pick the URL),
    and in a workload only what touches DRA."""
    if not path or path[0] in ("apiVersion", "kind") or path == ("metadata", "namespace"):
        return False
    pod = _POD_SPEC.get(doc["kind"])
    if pod is None:
        return True
    if path[:1] == ("metadata",):
        return True
    inner = path[len(pod) :]
    if path[: len(pod)] != pod or not inner:
        return False
    if inner[0] == "resourceClaims":
        return True
    return inner[0] == "containers" and len(inner) > 2 and inner[2] == "resources"


def paths(doc: dict[str, Any]) -> list[Path]:
    return [p for p, _ in _walk(doc) if _mutable(doc, p)]


def get(doc: Any, path: Path) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def put(doc: Any, path: Path, value: Any) -> None:
    get(doc, path[:-1])[path[-1]] = value


def delete(doc: Any, path: Path) -> None:
    del get(doc, path[:-1])[path[-1]]


def _find(doc: dict[str, Any], key: str) -> list[Path]:
    """Paths (mutable ones) whose last part is ``key``."""
    return [p for p in paths(doc) if p and p[-1] == key]


# ---- the mutation operators ------------------------------------------------------------

Mutation = Callable[[random.Random, dict[str, Any]], str | None]


def _remove(rng: random.Random, doc: dict[str, Any]) -> str | None:
    target = rng.choice(paths(doc))
    delete(doc, target)
    return f"remove {path_text(target)}"


def _other_type(rng: random.Random, value: Any) -> Any:
    choices: list[Any] = ["7", 7, 1.5, True, ["x"], {"x": "y"}, None, "", "true", -1]
    if isinstance(value, bool):
        choices = ["true", 1, None, ["true"]]
    elif isinstance(value, int):
        choices = [str(value), float(value) + 0.5, True, [value], None, {"value": value}]
    elif isinstance(value, str):
        choices = [7, True, [value], {"value": value}, None, 1.5]
    elif isinstance(value, list):
        choices = [value[0] if value else "x", {"0": value[0] if value else "x"}, "x", None, 0]
    elif isinstance(value, dict):
        choices = [[value], "x", 3, True, None]
    return rng.choice(choices)


def _retype(rng: random.Random, doc: dict[str, Any]) -> str | None:
    target = rng.choice(paths(doc))
    new = _other_type(rng, get(doc, target))
    put(doc, target, new)
    return f"retype {path_text(target)}: {new!r}"


ENUMS: dict[str, tuple[str, ...]] = {
    "allocationMode": ("ExactCount", "All"),
    "operator": ("Exists", "Equal"),
    "effect": ("NoSchedule", "NoExecute", "None"),
}


def near_misses(value: str, allowed: tuple[str, ...]) -> list[str]:
    out = [value.lower(), value.upper(), f" {value}", f"{value} ", value[:-1], value + "s",
           "", value.replace("o", "0"), *allowed]  # fmt: skip
    return [v for v in dict.fromkeys(out)]


def _enum(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [p for key in ENUMS for p in _find(doc, key)]
    # A field that may be written and is not yet: the request's allocationMode.
    candidates += [(*p, "allocationMode") for p in _find(doc, "exactly")]
    if not candidates:
        return None
    target = rng.choice(candidates)
    key = str(target[-1])
    allowed = ENUMS[key]
    current = get(doc, target[:-1]).get(key, allowed[0])
    new = rng.choice(near_misses(str(current), allowed))
    put(doc, target, new)
    return f"enum {path_text(target)}: {new!r}"


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


# list key -> (its limit, how to make the i-th item from the first)
def _renamed(item: Any, name: str) -> Any:
    item = copy.deepcopy(item)
    if isinstance(item, dict) and "name" in item:
        item["name"] = name
    return item


LIST_LIMITS = {"requests": 32, "firstAvailable": 8, "selectors": 32, "constraints": 32,
               "config": 32, "tolerations": 16}  # fmt: skip


def _grow(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [p for key in LIST_LIMITS for p in _find(doc, key)
                  if isinstance(get(doc, p), list) and get(doc, p)]  # fmt: skip
    if not candidates:
        return None
    target = rng.choice(candidates)
    key = str(target[-1])
    limit = LIST_LIMITS[key]  # a constraint's or config's references: as many as requests
    size = rng.choice([limit - 1, limit, limit + 1])
    items = get(doc, target)
    first = items[0]
    if key == "requests" and target[-2] == "devices":
        grown = [items[0], *(_renamed(first, n) for n in _names("r", size - 1))]
    elif key == "firstAvailable":
        grown = [items[0], *(_renamed(first, n) for n in _names("s", size - 1))]
    elif key == "requests":  # references to requests: name existing ones, then unknown ones
        grown = [*items, *_names("r", size - len(items))]
    else:
        grown = [first, *(copy.deepcopy(first) for _ in range(size - 1))]
    put(doc, target, grown)
    return f"grow {path_text(target)}: {size} items (limit {limit})"


# field name -> the length limit of its value, and a way to make a valid value that long
def _dns_label(n: int) -> str:
    return ("a" * n)[:n]


def _dns_subdomain(n: int) -> str:
    parts, out = [], 0
    while out < n:
        take = min(63, n - out)
        parts.append("a" * take)
        out += take + 1
    text = ".".join(parts)[:n]
    return text[:-1] + "b" if text.endswith(".") else text


STRING_LIMITS: dict[str, tuple[int, Callable[[int], str]]] = {
    "name": (63, _dns_label),  # request, subrequest, pod claim names: DNS labels
    "deviceClassName": (253, _dns_subdomain),
    "driver": (63, _dns_subdomain),
    "expression": (10 * 1024, lambda n: "true" + " " * (n - 8) + "&& true"[: n - 4]),
    "value": (63, lambda n: "v" * n),
    "key": (253, lambda n: _dns_subdomain(n - 4) + "/key" if n > 5 else "k" * n),
    "resourceClaimTemplateName": (253, _dns_subdomain),
    "resourceClaimName": (253, _dns_subdomain),
}


def _stretch(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [p for key in STRING_LIMITS for p in _find(doc, key)
                  if isinstance(get(doc, p), str)]  # fmt: skip
    meta = ("metadata", "name")
    candidates.append(meta)
    target = rng.choice(candidates)
    limit, make = (253, _dns_subdomain) if target == meta else STRING_LIMITS[str(target[-1])]
    size = rng.choice([limit - 1, limit, limit + 1])
    new = make(size)
    if target[-1] == "expression" and rng.random() < 0.5:
        # A long selector that says what the base says, padded with a comment-free space.
        new = get(doc, target) + " " * max(0, size - len(get(doc, target)))
    put(doc, target, new)
    return f"stretch {path_text(target)}: {len(new)} characters (limit {limit})"


NUMBERS = [0, 1, -1, 2, 2**31 - 1, 2**31, 2**53, -(2**31), 300, 2**63 - 1]


def _number(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [*_find(doc, "count"), *_find(doc, "tolerationSeconds"), *_find(doc, "replicas")]
    candidates += [(*p, "count") for p in _find(doc, "exactly")]
    if not candidates:
        return None
    target = rng.choice(candidates)
    new = rng.choice(NUMBERS)
    put(doc, target, new)
    return f"number {path_text(target)}: {new}"


QUANTITIES = ["20Gi", "0", "-1Gi", "1.5Gi", "1e3", "10GiB", "10 Gi", "Gi", "", "1Ki", "40G",
              "0.5", "1m", "+1Gi", "1E", "1Pi"]  # fmt: skip


def _quantity(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [p for p in _find(doc, "capacity") if isinstance(get(doc, p), dict)]
    if not candidates:
        return None
    target = (*rng.choice(candidates), "requests", "memory")
    new = rng.choice(QUANTITIES)
    get(doc, target[:-2])["requests"] = {"memory": new}
    return f"quantity {path_text(target)}: {new!r}"


CEL = [
    # compiles and is a bool
    "true", f'device.driver == "{DRIVER}"', f"{GPU}.index < 4",
    f'"productName" in {GPU}', f'{GPU}.productName.lowerAscii().contains("h100")',
    f'{GPU}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
    'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("10Gi"))',
    f'{GPU}.productName.matches("^NVIDIA (H|A)100")', 'has(device.attributes["x.io"].y)',
    "device.allowMultipleAllocations", f"{GPU}.memory > 1.5",
    f'{GPU}.productName == "a" || {GPU}.productName == "b"',
    f'device.attributes.exists(d, d == "{DRIVER}")',
    "device.attributes.all(d, device.attributes[d].all(a, a != \"\"))",
    # does not compile
    "device.driver ==", f"{GPU}.productName = \"x\"", 'devices.driver == "x"',
    "device.driver == 1", '"a" + 1', 'device.capacity["gpu.nvidia.com"].memory > 1',
    'device.driver.matches("[")', f"{GPU}.index <", "", " ", "device.nosuchfield == 1",
    'quantity("1Gi") > 1', "size(device.attributes) >", "1 +",
    'device.driver.startsWith(1)', "device.attributes[1].x", f"{GPU}.index.foo()",
    # compiles to something that is not a bool
    "device.driver", "1", '"true"', GPU, f"{GPU}.productName", "[true]", "null",
    'device.capacity["gpu.nvidia.com"].memory', "device.attributes", "1 + 2",
    # literals the Kubernetes CEL library checks
    'quantity("10Gx").isGreaterThan(quantity("1"))',
    f'{GPU}.driverVersion.isGreaterThan(semver("1.2"))',
]  # fmt: skip


def _cel(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = _find(doc, "expression")
    if not candidates:
        return None
    target = rng.choice(candidates)
    new = rng.choice(CEL)
    put(doc, target, new)
    return f"cel {path_text(target)}: {new!r}"


NAMES = ["Gpu", "gpu_0", "-gpu", "gpu-", "gpu.0", "0gpu", "gpu 0", "", "g" * 64, "a.b",
         "GPU.nvidia.com", "gpu..nvidia.com", "gpu.nvidia.com.", "x", "0"]  # fmt: skip
_NAME_KEYS = ("name", "deviceClassName", "driver", "resourceClaimTemplateName",
              "resourceClaimName", "matchAttribute", "distinctAttribute", "key")  # fmt: skip
ATTRIBUTE_NAMES = ["gpu.nvidia.com/productName", "productName", "gpu.nvidia.com/", "/productName",
                   "gpu.nvidia.com/product-name", "gpu.nvidia.com/" + "a" * 33,
                   "gpu.nvidia.com/" + "a" * 32, "GPU.nvidia.com/uuid", "a/b/c",
                   "gpu_nvidia.com/uuid", "resource.kubernetes.io/pcieRoot"]  # fmt: skip


def _rename(rng: random.Random, doc: dict[str, Any]) -> str | None:
    candidates = [p for key in _NAME_KEYS for p in _find(doc, key) if isinstance(get(doc, p), str)]
    candidates = [p for p in candidates if p != ("metadata", "labels", "key")]
    if not candidates:
        return None
    target = rng.choice(candidates)
    pool = ATTRIBUTE_NAMES if target[-1] in ("matchAttribute", "distinctAttribute") else NAMES
    new = rng.choice(pool)
    put(doc, target, new)
    return f"rename {path_text(target)}: {new!r}"


def _unknown(rng: random.Random, doc: dict[str, Any]) -> str | None:
    maps = [p for p in [(), *paths(doc)] if isinstance(get(doc, p), dict)]
    maps = [p for p in maps if p not in (("metadata", "labels"),) and "parameters" not in p]
    maps = [p for p in maps if not p or _mutable(doc, p)]
    target = rng.choice(maps)
    key = rng.choice(["extra", "Name", "count_", "selector", "deviceclassName", "request"])
    if key in get(doc, target):
        return None
    put(doc, (*target, key), "x")
    return f"unknown {path_text((*target, key))}"


LABELS = ["ok", "", "a" * 63, "a" * 64, "-x", "x_y", "x y", "x/y", "Ab.c-d_e"]
LABEL_KEYS = ["example.com/ok", "a" * 63, "a" * 64, "Example.com/x", "x/", "/x", "a/b/c",
              "example.com/" + "a" * 64, "_x", "x.y"]  # fmt: skip


def _label(rng: random.Random, doc: dict[str, Any]) -> str | None:
    where = ("metadata", "labels")
    labels = get(doc, where) if isinstance(doc.get("metadata"), dict) else None
    if not isinstance(labels, dict):
        return None
    if rng.random() < 0.5:
        new_value = rng.choice(LABELS)
        labels["tier"] = new_value
        return f"label {path_text((*where, 'tier'))}: {new_value!r}"
    new_key = rng.choice(LABEL_KEYS)
    labels[new_key] = "x"
    return f"label {path_text(where)}: key {new_key!r}"


# ---- rules across fields ---------------------------------------------------------------


def _requests_paths(doc: dict[str, Any]) -> list[Path]:
    return [p for p in _find(doc, "requests") if len(p) >= 2 and p[-2] == "devices"]


def _cross(rng: random.Random, doc: dict[str, Any]) -> str | None:
    rules = [r for r in CROSS if r[1](doc)]
    if not rules:
        return None
    name, _, apply = rng.choice(rules)
    return f"cross {name}: {apply(rng, doc)}"


def _first_request(doc: dict[str, Any]) -> Path | None:
    found = _requests_paths(doc)
    return (*found[0], 0) if found else None


def _has(key: str) -> Callable[[dict[str, Any]], bool]:
    return lambda doc: bool(_find(doc, key))


def _both_exactly_and_first(rng: random.Random, doc: dict[str, Any]) -> str:
    request = get(doc, _first_request(doc) or ())
    if "exactly" in request:
        request["firstAvailable"] = [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]
    else:
        request["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
    return "exactly and firstAvailable"


def _neither(rng: random.Random, doc: dict[str, Any]) -> str:
    request = get(doc, _first_request(doc) or ())
    request.pop("exactly", None)
    request.pop("firstAvailable", None)
    if rng.random() < 0.5:
        request["firstAvailable"] = []
    return "neither exactly nor firstAvailable"


def _all_with_count(rng: random.Random, doc: dict[str, Any]) -> str:
    target = rng.choice(_find(doc, "exactly") + _find(doc, "firstAvailable"))
    obj = get(doc, target)
    obj = obj[0] if isinstance(obj, list) else obj
    obj["allocationMode"] = "All"
    obj["count"] = rng.choice([1, 2, 0])
    return f"{path_text(target)}: allocationMode All, count {obj['count']}"


def _toleration(rng: random.Random, doc: dict[str, Any]) -> str:
    target = rng.choice(_find(doc, "tolerations"))
    toleration = get(doc, target)[0]
    choice = rng.randrange(6)
    if choice == 0:
        toleration.update(operator="Exists", value="v")
    elif choice == 1:
        toleration.pop("key", None)
        toleration["operator"] = "Equal"
    elif choice == 2:
        toleration.update(effect="NoSchedule", tolerationSeconds=60)
    elif choice == 3:
        toleration.pop("key", None)
        toleration.update(operator="Exists")
        toleration.pop("value", None)
    elif choice == 4:
        toleration.pop("operator", None)
    else:
        toleration.pop("effect", None)
        toleration["tolerationSeconds"] = 5
    return f"{path_text(target)}[0]: {toleration}"


def _constraint_both(rng: random.Random, doc: dict[str, Any]) -> str:
    constraint = get(doc, rng.choice(_find(doc, "constraints")))[0]
    if rng.random() < 0.5:
        constraint["matchAttribute"] = "gpu.nvidia.com/uuid"
        constraint["distinctAttribute"] = "gpu.nvidia.com/uuid"
        return "matchAttribute and distinctAttribute"
    constraint.pop("matchAttribute", None)
    constraint.pop("distinctAttribute", None)
    return "neither matchAttribute nor distinctAttribute"


def _reference(rng: random.Random, doc: dict[str, Any]) -> str:
    refs = [p for p in _find(doc, "requests") if p[-2] != "devices" and "capacity" not in p]
    target = rng.choice(refs)
    new = rng.choice(["nosuch", "gpu/nosuch", "gpus/x", "helper/full", "gpu/full", "gpu",
                      "gpus", "share", "a/b/c", "Gpu", "gpu//full"])  # fmt: skip
    get(doc, target).append(new)
    return f"{path_text(target)} += {new!r}"


def _duplicate_name(rng: random.Random, doc: dict[str, Any]) -> str:
    lists = [p for p in _requests_paths(doc) + _find(doc, "firstAvailable")
             + _find(doc, "resourceClaims") + _find(doc, "claims")
             if isinstance(get(doc, p), list) and get(doc, p)]  # fmt: skip
    target = rng.choice(lists)
    items = get(doc, target)
    items.append(copy.deepcopy(items[0]))
    return f"{path_text(target)}: duplicate of item 0"


def _pod_claims(rng: random.Random, doc: dict[str, Any]) -> str:
    entries = rng.choice(_find(doc, "resourceClaims"))
    claim = get(doc, entries)[0]
    choice = rng.randrange(5)
    if choice == 0:
        claim["resourceClaimName"] = "both"
        return "resourceClaimName and resourceClaimTemplateName"
    if choice == 1:
        claim.pop("resourceClaimTemplateName", None)
        claim.pop("resourceClaimName", None)
        return "neither resourceClaimName nor resourceClaimTemplateName"
    container = get(doc, rng.choice([p for p in _find(doc, "claims") if p[-2] == "resources"]))
    if choice == 2:
        container.append({"name": "nosuch"})
        return "a container names a claim the pod lacks"
    if choice == 3:
        container[0]["request"] = rng.choice(["", "Share", "a/b", "share/x", "x" * 64])
        return f"request {container[0]['request']!r}"
    container.append({"name": container[0]["name"], "request": "other"})
    return "one claim twice in a container, two requests"


def _admin_access(rng: random.Random, doc: dict[str, Any]) -> str:
    target = rng.choice(_find(doc, "exactly"))
    get(doc, target)["adminAccess"] = rng.choice([True, False])
    return f"{path_text(target)}.adminAccess"


def _capacity_cross(rng: random.Random, doc: dict[str, Any]) -> str:
    target = rng.choice(_find(doc, "exactly"))
    exactly = get(doc, target)
    choice = rng.randrange(3)
    if choice == 0:
        exactly["capacity"] = {"requests": {"memory": "10Gi"}}
        exactly["allocationMode"] = "All"
        return "capacity with allocationMode All"
    if choice == 1:
        exactly["capacity"] = {"requests": {}}
        return "empty capacity requests"
    exactly["capacity"] = {"requests": {rng.choice(["gpu.nvidia.com/memory", "Memory", "a/b/c",
                                                    "x_y", "memory"]): "1Gi"}}  # fmt: skip
    return f"capacity {exactly['capacity']}"


CROSS: list[
    tuple[str, Callable[[dict[str, Any]], bool], Callable[[random.Random, dict[str, Any]], str]]
] = [
    (
        "exactly-and-firstAvailable",
        lambda d: _first_request(d) is not None,
        _both_exactly_and_first,
    ),
    ("neither", lambda d: _first_request(d) is not None, _neither),
    (
        "all-with-count",
        lambda d: bool(_find(d, "exactly") + _find(d, "firstAvailable")),
        _all_with_count,
    ),
    ("toleration", _has("tolerations"), _toleration),
    ("constraint", _has("constraints"), _constraint_both),
    (
        "reference",
        lambda d: any(p[-2] != "devices" and "capacity" not in p for p in _find(d, "requests")),
        _reference,
    ),
    (
        "duplicate",
        lambda d: bool(_requests_paths(d) or _find(d, "resourceClaims")),
        _duplicate_name,
    ),
    ("pod-claims", _has("resourceClaims"), _pod_claims),
    ("admin-access", _has("exactly"), _admin_access),
    ("capacity", _has("exactly"), _capacity_cross),
]


OPERATORS: dict[str, Mutation] = {
    "remove": _remove, "retype": _retype, "enum": _enum, "grow": _grow, "stretch": _stretch,
    "number": _number, "quantity": _quantity, "cel": _cel, "rename": _rename,
    "unknown": _unknown, "label": _label, "cross": _cross,
}  # fmt: skip
# How often each operator is drawn: the DRA-specific ones more than the generic.
WEIGHTS = {"remove": 3, "retype": 3, "enum": 2, "grow": 2, "stretch": 2, "number": 2,
           "quantity": 1, "cel": 4, "rename": 3, "unknown": 1, "label": 1, "cross": 5}  # fmt: skip


def mutate(rng: random.Random, doc: dict[str, Any], times: int) -> list[str]:
    done: list[str] = []
    names, weights = list(WEIGHTS), list(WEIGHTS.values())
    tries = 0
    while len(done) < times and tries < 20:
        tries += 1
        op = rng.choices(names, weights)[0]
        trial = copy.deepcopy(doc)
        try:
            what = OPERATORS[op](rng, trial)
        except (TypeError, KeyError, IndexError, AttributeError, ValueError):
            # An earlier mutation took away the shape this one works on (a request made a
            # string): draw another.
            continue
        if what is not None and trial != doc:  # a value replaced by itself is no mutation
            doc.clear()
            doc.update(trial)
            done.append(what)
    return done


def generate(seed: int, count: int) -> list[Case]:
    """``count`` cases; about one in fifty is a base left as it is."""
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        name = rng.choice(BASE_NAMES)
        doc = base(name)
        times = 0 if rng.random() < 0.02 else (1 if rng.random() < 0.8 else 2)
        mutations = mutate(rng, doc, times) if times else []
        cases.append(Case(index, name, tuple(mutations), doc))
    return cases
