"""Seeded random CEL selector cases: a GPU-like device and a boolean expression over it.

The expressions mix attribute lookups (string, int, bool, version; qualified and not;
present, missing and of an unknown domain), capacities (quantities), ``device.driver`` and
``device.allowMultipleAllocations``, the Kubernetes libraries (quantity, semver, regex,
lists), the string extension, arithmetic, comparisons, ``in``, ``has``, the conditional
and the logical operators, plus expressions that must fail: wrong types, missing keys,
overflow, division by zero, syntax errors, undeclared names, non-boolean results.
"""

from __future__ import annotations

import random
from typing import Any

DRIVER = "gpu.nvidia.com"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
PCI = 'device.attributes["resource.kubernetes.io"]'

_MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S", ""]
_ARCH = ["Hopper", "Ada Lovelace", "Ampere", "Blackwell"]
_VERSIONS = ["9.0.0", "8.9.0", "8.0.0", "580.95.5", "550.127.8", "12.4.0", "1.0.0-rc.1"]
_QTY = ["80Gi", "24Gi", "40Gi", "48Gi", "81559Mi", "1", "0", "500m", "1.5", "4", "2Ki", "1e3"]
_WORDS = ["NVIDIA", "H100", "nvidia", "L4", "A100", "", "gpu", "pci0000"]


def device(rng: random.Random) -> dict[str, Any]:
    """A device as a v1 ResourceSlice lists it; some attributes left out at random."""
    attrs: dict[str, Any] = {
        "type": {"string": rng.choice(["gpu", "mig", "vfio"])},
        "productName": {"string": rng.choice(_MODELS)},
        "architecture": {"string": rng.choice(_ARCH)},
        "index": {"int": rng.randrange(8)},
        "memory": {"int": rng.choice([23034, 40960, 46068, 81559, 0, -1])},
        "migCapable": {"bool": rng.random() < 0.5},
        "cudaComputeCapability": {"version": rng.choice(_VERSIONS[:4])},
        "driverVersion": {"version": rng.choice(_VERSIONS)},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{rng.randrange(16):02x}"},
        f"{DRIVER}/nvlinkDomain": {"string": f"node-a.nvlink-{rng.randrange(2)}"},
    }
    for name in list(attrs):
        if rng.random() < 0.12:
            del attrs[name]
    caps = {"memory": {"value": rng.choice(_QTY)}, "example.com/slots": {"value": rng.choice(_QTY)}}
    if rng.random() < 0.15:
        del caps["memory"]
    out: dict[str, Any] = {"name": f"gpu-{rng.randrange(8)}", "attributes": attrs}
    out["capacity"] = caps
    if rng.random() < 0.3:
        out["allowMultipleAllocations"] = rng.random() < 0.5
    return out


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def q(self, items: list[str]) -> str:
        return '"' + self.rng.choice(items) + '"'

    def int_(self, d: int) -> str:
        r = self.rng.randrange(9 if d > 0 else 3)
        if r == 0:
            return str(self.rng.choice([0, 1, 2, 7, 40000, 81559, -3, 9223372036854775807]))
        if r == 1:
            return f"{A}.{self.pick('index', 'memory', 'memory', 'index', 'productName')}"
        if r == 2:
            return f"{A}.driverVersion.{self.pick('major', 'minor', 'patch')}()"
        if r == 3:
            op = self.pick("+", "-", "*", "/", "%")
            return f"({self.int_(d - 1)} {op} {self.int_(d - 1)})"
        if r == 4:
            return f"size({self.str_(d - 1)})"
        if r == 5:
            return f"{self.str_(d - 1)}.indexOf({self.q(_WORDS)})"
        if r == 6:
            return f"{self.qty(d - 1)}.compareTo({self.qty(d - 1)})"
        if r == 7:
            return f"{self.qty(d - 1)}.sign()"
        return f"{self.ver(d - 1)}.compareTo({self.ver(d - 1)})"

    def str_(self, d: int) -> str:
        r = self.rng.randrange(8 if d > 0 else 3)
        if r == 0:
            return self.q(_WORDS + _MODELS)
        if r == 1:
            name = self.pick("productName", "architecture", "type", "nvlinkDomain", "missing")
            return f"{A}.{name}"
        if r == 2:
            return self.pick("device.driver", f"{PCI}.pcieRoot", f'{A}["productName"]')
        if r == 3:
            return f"{self.str_(d - 1)}.{self.pick('lowerAscii', 'upperAscii', 'trim')}()"
        if r == 4:
            return f"({self.str_(d - 1)} + {self.str_(d - 1)})"
        if r == 5:
            return f"{self.str_(d - 1)}.replace({self.q(_WORDS)}, {self.q(_WORDS)})"
        if r == 6:
            return f"{self.str_(d - 1)}.substring({self.rng.randrange(4)})"
        return f"string({self.int_(d - 1)})"

    def qty(self, d: int) -> str:
        r = self.rng.randrange(5 if d > 0 else 2)
        if r == 0:
            return f"quantity({self.q(_QTY)})"
        if r == 1:
            return f"{C}.{self.pick('memory', 'memory', 'nope')}"
        if r == 2:
            return 'device.capacity["example.com"].slots'
        if r == 3:
            return f"{self.qty(d - 1)}.{self.pick('add', 'sub')}({self.qty(d - 1)})"
        return f"{self.qty(d - 1)}.add({self.rng.randrange(-2, 5)})"

    def ver(self, d: int) -> str:
        r = self.rng.randrange(3)
        if r == 0:
            return f"semver({self.q(_VERSIONS)})"
        if r == 1:
            return f"{A}.{self.pick('driverVersion', 'cudaComputeCapability')}"
        return f"semver({self.q(['v1.2.3', '1.2', '01.2.3', '1.2.3'])}, true)"

    def bool_(self, d: int) -> str:
        r = self.rng.randrange(21 if d > 0 else 4)
        if r == 0:
            return self.pick("true", "false", f"{A}.migCapable", "device.allowMultipleAllocations")
        if r == 1:
            return f"{self.str_(d - 1)} {self.pick('==', '!=', '<', '>=')} {self.str_(d - 1)}"
        if r == 2:
            op = self.pick("==", "!=", "<", "<=", ">", ">=")
            return f"{self.int_(d - 1)} {op} {self.int_(d - 1)}"
        if r == 3:
            name = self.pick("productName", "memory", "missing", "migCapable", "nvlinkDomain")
            return self.pick(f'"{name}" in {A}', f"has({A}.{name})")
        if r == 4:
            return f"{self.bool_(d - 1)} {self.pick('&&', '||')} {self.bool_(d - 1)}"
        if r == 5:
            return f"!({self.bool_(d - 1)})"  # never "!!x": see test_cel_oracle
        if r == 6:
            return f"({self.bool_(d - 1)} ? {self.bool_(d - 1)} : {self.bool_(d - 1)})"
        if r == 7:
            fn = self.pick("startsWith", "endsWith", "contains", "matches")
            arg = self.q(["NVIDIA", "H100", "^NVIDIA (H|A)100", "[", "L4$", ""])
            return f"{self.str_(d - 1)}.{fn}({arg})"
        if r == 8:
            fn = self.pick("isLessThan", "isGreaterThan")
            return f"{self.qty(d - 1)}.{fn}({self.qty(d - 1)})"
        if r == 9:
            return f"{self.qty(d - 1)}.isInteger()"
        if r == 10:
            fn = self.pick("isLessThan", "isGreaterThan")
            return f"{self.ver(d - 1)}.{fn}({self.ver(d - 1)})"
        if r == 11:
            return f"{self.ver(d - 1)} {self.pick('==', '!=')} {self.ver(d - 1)}"
        if r == 12:
            return self.pick(
                f"isQuantity({self.q([*_QTY, 'x', '1.2.3', ''])})",
                f"isSemver({self.q([*_VERSIONS, 'x', 'v1.0.0', '1.2'])})",
            )
        if r == 13:
            return f"{self.str_(d - 1)} in [{self.q(_WORDS)}, {self.q(_MODELS)}]"
        if r == 14:
            sep = self.q([" ", "-", ""])
            return f"{self.str_(d - 1)}.split({sep}).size() > {self.rng.randrange(3)}"
        if r == 15:
            lit = self.pick("1", "1.5", "80000u", '"1"', "null", "true")
            return f"{A}.{self.pick('memory', 'index', 'productName', 'migCapable')} == {lit}"
        if r == 16:
            return f"{self.qty(d - 1)}.asInteger() {self.pick('>', '==', '<')} {self.int_(d - 1)}"
        if r == 17:
            limit = self.pick("1.0", "0.5", "85899345920.0")
            return f"{self.qty(d - 1)}.asApproximateFloat() > {limit}"
        if r == 18:
            domain = self.pick("other.com", DRIVER, "resource.kubernetes.io")
            return f'device.attributes["{domain}"].{self.pick("x", "pcieRoot", "type")} == "gpu"'
        if r == 19:
            return self.more(d)
        return f"{self.int_(d - 1)} {self.pick('<', '==')} {A}.{self.pick('memory', 'productName')}"

    def more(self, d: int) -> str:
        """Macros over the attribute maps, more string functions, bind, lists."""
        r = self.rng.randrange(9)
        if r == 0:
            var = self.pick("k", "name")
            test = self.pick(f'{var}.startsWith("m")', f'{var} == "memory"', f"size({var}) > 5")
            macro = self.pick("exists", "all", "exists_one")
            return f"{A}.{macro}({var}, {test})"
        if r == 1:
            at = self.rng.randrange(-1, 6)
            return f"{self.str_(d - 1)}.charAt({at}) == {self.q(['N', 'a', ''])}"
        if r == 2:
            word = self.q(_WORDS)
            return f"{self.str_(d - 1)}.lastIndexOf({word}) >= {self.rng.randrange(-1, 3)}"
        if r == 3:
            offset = self.rng.randrange(-1, 30)
            return f"{self.str_(d - 1)}.indexOf({self.q(_WORDS)}, {offset}) > 0"
        if r == 4:
            # string(...) keeps the literal homogeneous: see test_cel_oracle on dyn elements.
            first, second = self.str_(d - 1), self.str_(d - 1)
            return f"[string({first}), string({second})].join({self.q([' ', ''])}).size() > 4"
        if r == 5:
            return f"cel.bind(x, {self.int_(d - 1)}, x > 3 && x < 100000)"
        if r == 6:
            items = ", ".join(str(self.rng.randrange(-2, 9)) for _ in range(self.rng.randrange(4)))
            fn = self.pick("isSorted()", "sum() > 3", "min() < 2", "max() >= 8")
            return f"[{items}].{fn}"
        if r == 7:
            return f'{self.str_(d - 1)}.find({self.q(["[0-9]+", "H[0-9]*", "("])}) != ""'
        return f"size({A}) {self.pick('>', '==', '<')} {self.rng.randrange(12)}"


# Expressions the API server refuses to compile, mixed in so the compile path is checked too.
_BROKEN = [
    "1 +",
    "device.attributes[",
    "nope == 1",
    "device.nodriver == 1",
    f"{A}.memory + 1",
    '"gpu"',
    "quantity(5).isInteger()",
    f"{C}.memory == 1",
    f'{C}.memory.compareTo("80Gi") > 0',
    "device.driver.size() > 1u",
    'semver("1.0.0").major() == "1"',
    "size(device.attributes) > 0 && device.driver",
    f"{A}.memory > 1 ? 2 : 3",
    "device.driver = 'x'",
]


def expression(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(_BROKEN)
    return _Gen(rng).bool_(rng.randrange(1, 4))


def cases(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"kind": "cel", "expression": expression(rng), "driver": DRIVER, "device": device(rng)}
        for _ in range(count)
    ]
