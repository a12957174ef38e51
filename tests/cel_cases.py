"""The table of CEL selector cases: expression, expected outcome, and where that comes from.

Citation keys (every case names one):
  SPEC      CEL language definition, github.com/google/cel-spec doc/langdef.md
  GO-STR    cel-go ext/strings.go (the string extension, version 2 in Kubernetes)
  GO-FMT    cel-go ext/formatting.go (``format``)
  GO-BIND   cel-go ext/bindings.go (``cel.bind``)
  K8S-LIST  kubernetes staging/src/k8s.io/apiserver/pkg/cel/library/lists.go
  K8S-RE    kubernetes staging/src/k8s.io/apiserver/pkg/cel/library/regex.go
  K8S-QTY   kubernetes staging/src/k8s.io/apiserver/pkg/cel/library/quantity.go
  K8S-SEM   kubernetes staging/src/k8s.io/apiserver/pkg/cel/library/semverlib.go
  BLANG     github.com/blang/semver/v4 semver.go (Parse, Compare)
  DRA       kubernetes staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go and the
            CELDeviceSelector API documentation (lookup rules of ``device``)
  K8S-ENV   kubernetes staging/src/k8s.io/apiserver/pkg/cel/environment/base.go (what is
            valid Kubernetes CEL: optional types, cross-type numeric comparisons, sets, IP,
            CIDR, URL libraries) -> "not supported by this tool"
  K8S-COST  kubernetes pkg/apis/resource/types.go CELSelectorExpressionMaxCost = 1000000

``oracle=True`` marks standard CEL that cel-expr-python (the C++ runtime) also evaluates;
tests/test_cel.py checks our outcome against it.
"""

from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"

# A v1 ResourceSlice device as drivers.gpu.resourceslice builds it for an H100.
DEVICE: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-6d0f3c1e-8a5b-4c2d-9e7f-0a1b2c3d4e5f"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "index": {"int": 0},
        "minor": {"int": 0},
        "memory": {"int": 81559},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "migCapable": {"bool": True},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:50"},
        "gpu.nvidia.com/nvlinkDomain": {"string": "node-a.nvlink-0"},
    },
    "capacity": {"memory": {"value": "80Gi"}, "example.com/slots": {"value": "4"}},
    "allowMultipleAllocations": False,
}

VALUE = "value"  # expect: the selector evaluates to ``want`` (a bool)
EVAL_ERROR = "eval-error"  # expect: CelEvalError whose message contains ``match``
COMPILE_ERROR = "compile-error"  # expect: CelCompileError starting ``match`` (line:column)
UNSUPPORTED = "unsupported"  # expect: CelUnsupportedError, "not supported by this tool"


@dataclass(frozen=True)
class Case:
    expr: str
    kind: str
    cite: str
    want: bool = True
    match: str = ""
    oracle: bool = False

    @property
    def id(self) -> str:
        return self.expr if len(self.expr) <= 70 else self.expr[:67] + "..."


def t(expr: str, cite: str, oracle: bool = False) -> Case:
    return Case(expr, VALUE, cite, True, oracle=oracle)


def f(expr: str, cite: str, oracle: bool = False) -> Case:
    return Case(expr, VALUE, cite, False, oracle=oracle)


def err(expr: str, match: str, cite: str, oracle: bool = False) -> Case:
    return Case(expr, EVAL_ERROR, cite, match=match, oracle=oracle)


def bad(expr: str, match: str, cite: str, oracle: bool = False) -> Case:
    return Case(expr, COMPILE_ERROR, cite, match=match, oracle=oracle)


def unsupported(expr: str, cite: str) -> Case:
    return Case(expr, UNSUPPORTED, cite)


A = 'device.attributes["gpu.nvidia.com"]'
C = 'device.capacity["gpu.nvidia.com"]'

CASES: list[Case] = [
    # --- the device variable and Kubernetes' lookup rules ----------------------------------
    t('device.driver == "gpu.nvidia.com"', "DRA"),
    t(f'{A}.productName == "NVIDIA H100 80GB HBM3"', "DRA"),
    t(f'{A}["productName"] == "NVIDIA H100 80GB HBM3"', "DRA"),
    t(f'{A}.architecture != "Ampere"', "DRA"),
    t(f"{A}.index == 0", "DRA: int attributes are int"),
    t(f"{A}.migCapable", "DRA: bool attributes are bool"),
    t(f'{A}.cudaComputeCapability == semver("9.0.0")', "DRA: version attributes are Semver"),
    t(f'{A}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))', "DRA + K8S-SEM"),
    t(f"{A}.driverVersion.major() == 580", "DRA + K8S-SEM"),
    err(
        f'{A}.driverVersion == "580.95.5"',
        "no such overload",
        "DRA + k8s apiserver pkg/cel/types.go: Semver.Equal of a non-Semver is an error",
    ),
    f(f'"580.95.5" == {A}.driverVersion', "SPEC: string equality with another type is false"),
    bad(f'{C}.memory == "80Gi"', "1:42", "DRA: capacities are typed Quantity, not string"),
    f(f"{A}.driverVersion == null", "SPEC: comparison with null is false for any value"),
    t(f"{A}.memory > 1.5", "K8S-ENV CrossTypeNumericComparisons on a dyn attribute"),
    t(f"{A}.memory == 81559.0", "SPEC heterogeneous equality on a dyn attribute"),
    t(f'{A}.nvlinkDomain == "node-a.nvlink-0"', "DRA: a name qualified with the driver's domain"),
    t(
        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:50"',
        "DRA: qualified names are grouped by their domain",
    ),
    err(f"{A}.pcieRoot", "no such key", "DRA: pcieRoot lives in resource.kubernetes.io, not here"),
    err(f'{A}.noSuchAttribute == "x"', "no such key", "DRA: a missing key is an error, not false"),
    err(f'{A}["noSuch"] == "x"', "no such key", "DRA: missing key, index form"),
    t('device.attributes["other.example.com"].size() == 0', "DRA: a missing domain is empty"),
    t('!has(device.attributes["other.example.com"].model)', "DRA: has() on a missing domain"),
    err(
        'device.attributes["other.example.com"].model == "x"',
        "no such key",
        "DRA: missing domain is an empty map, so the key is missing",
    ),
    t(f"has({A}.productName)", "DRA + SPEC has() macro"),
    f(f"has({A}.noSuchAttribute)", "DRA + SPEC has() macro"),
    t(f'"productName" in {A}', "DRA + SPEC in operator on maps"),
    f(f'"noSuch" in {A}', "DRA + SPEC in operator on maps"),
    t(f'{C}.memory == quantity("80Gi")', "DRA: capacities are quantities"),
    t(f'{C}.memory.compareTo(quantity("40Gi")) > 0', "DRA + K8S-QTY"),
    t(f'{C}.memory.isGreaterThan(quantity("79Gi"))', "DRA + K8S-QTY"),
    t('device.capacity["example.com"].slots.asInteger() == 4', "DRA + K8S-QTY"),
    err(f"sign({C}.noSuch) == 1", "no such key", "DRA: a missing capacity is an error"),
    t('device.capacity["none.example.com"].size() == 0', "DRA: missing capacity domain"),
    f("device.allowMultipleAllocations", "DRA: allowMultipleAllocations (DRAConsumableCapacity)"),
    t(
        f'{A}.productName.startsWith("NVIDIA") && {A}.memory > 40000',
        "DRA + SPEC startsWith, int comparison",
    ),
    t(f"{A}.exists(k, k == 'uuid')", "DRA + SPEC exists over map keys"),
    t(f"{A}.size() == 12", "DRA: 12 attributes in the driver's domain"),
    bad("device.model", "1:7", "DRA: device has driver/attributes/capacity/... only"),
    bad("devices.driver == 'x'", "1:1", "DRA: the only variable is device"),
    t(f'{A}.productName.matches("^NVIDIA H1[0-9]0")', "DRA + SPEC matches"),
    # --- standard CEL: literals, arithmetic, comparisons -------------------------------------
    t("1 + 2 == 3", "SPEC arithmetic", oracle=True),
    t("7 / 2 == 3", "SPEC: int division truncates", oracle=True),
    t("-7 / 2 == -3", "SPEC: toward zero", oracle=True),
    t("-7 % 2 == -1", "SPEC: remainder takes the dividend's sign", oracle=True),
    t("7 % -2 == 1", "SPEC: remainder", oracle=True),
    t("2 * 3 - 1 == 5", "SPEC precedence", oracle=True),
    t("(1 + 2) * 3 == 9", "SPEC parentheses", oracle=True),
    t("0x10 == 16", "SPEC hex literals", oracle=True),
    t("3u + 4u == 7u", "SPEC uint arithmetic", oracle=True),
    t("1.5 * 2.0 == 3.0", "SPEC double arithmetic", oracle=True),
    t("1.0 / 0.0 > 1e308", "SPEC: double division by zero is +Inf (IEEE 754)", oracle=True),
    t("-9223372036854775808 < 0", "SPEC: int64 min literal", oracle=True),
    err("9223372036854775807 + 1 > 0", "overflow", "SPEC: int overflow is an error", oracle=True),
    err("-9223372036854775808 - 1 < 0", "overflow", "SPEC: int overflow", oracle=True),
    err("1u - 2u > 0u", "overflow", "SPEC: uint underflow is an error", oracle=True),
    err("1 / 0 == 0", "divide by zero", "SPEC: division by zero is an error", oracle=True),
    err("1 % 0 == 0", "modulus by zero", "SPEC: modulus by zero is an error", oracle=True),
    err("-9223372036854775808 % -1 == 0", "overflow", "SPEC: int64 overflow", oracle=True),
    t('"abc" < "abd"', "SPEC string ordering", oracle=True),
    t('b"abc" < b"abd"', "SPEC bytes ordering", oracle=True),
    t("false < true", "SPEC bool ordering", oracle=True),
    t("2 >= 2 && 2 <= 2 && 3 > 2", "SPEC ordering operators", oracle=True),
    t('"a" + "b" == "ab"', "SPEC string concatenation", oracle=True),
    t("[1, 2] + [3] == [1, 2, 3]", "SPEC list concatenation", oracle=True),
    t('{"a": 1} == {"a": 1}', "SPEC map equality", oracle=True),
    f("[1, 2] == [2, 1]", "SPEC list equality is ordered", oracle=True),
    t("null == null", "SPEC null", oracle=True),
    t("dyn(1) == 1.0", "SPEC heterogeneous equality: numbers compare by value", oracle=True),
    t("dyn(1u) == 1", "SPEC heterogeneous equality", oracle=True),
    f('dyn(1) == "1"', "SPEC heterogeneous equality: different types are unequal", oracle=True),
    t('"\\x41\\u00e9\\101" == "Aé" + "A"', "SPEC escape sequences", oracle=True),
    t("r'\\d' == '\\\\d'", "SPEC raw strings", oracle=True),
    t('"""a\nb""" == "a\\nb"', "SPEC triple-quoted strings", oracle=True),
    t("size(b'\\xff\\x00') == 2", "SPEC bytes literals", oracle=True),
    t('size("héllo") == 5', "SPEC: size of a string counts code points", oracle=True),
    t('"héllo".size() == 5', "SPEC: receiver form of size", oracle=True),
    t("size([1, 2, 3]) == 3 && size({'a': 1}) == 1", "SPEC size of list and map", oracle=True),
    t("true ? 1 == 1 : 1 / 0 == 0", "SPEC: conditional evaluates one branch", oracle=True),
    t("!false", "SPEC logical not", oracle=True),
    t("2 in [1, 2, 3]", "SPEC in on lists", oracle=True),
    t("'a' in {'a': 1}", "SPEC in on map keys", oracle=True),
    t("[1, 2][1] == 2", "SPEC list index", oracle=True),
    err("[1, 2][2] == 0", "out of bounds", "SPEC: list index out of range", oracle=True),
    t("{'a': {'b': 2}}.a.b == 2", "SPEC map field selection", oracle=True),
    err("{'a': 1}.b == 1", "no such key", "SPEC: a missing map key is an error", oracle=True),
    # --- error semantics of && || (commutative over errors) -----------------------------------
    f("false && 1 / 0 == 0", "SPEC: false && error is false", oracle=True),
    f("1 / 0 == 0 && false", "SPEC: error && false is false (commutative)", oracle=True),
    t("true || 1 / 0 == 0", "SPEC: true || error is true", oracle=True),
    t("1 / 0 == 0 || true", "SPEC: error || true is true (commutative)", oracle=True),
    err("1 / 0 == 0 || false", "divide by zero", "SPEC: error || false is the error", oracle=True),
    err("true && 1 / 0 == 0", "divide by zero", "SPEC: true && error is the error", oracle=True),
    f(f'{A}.noSuch == "x" && false', "SPEC + DRA: a missing key absorbed by && false"),
    t(f'{A}.noSuch == "x" || {A}.type == "gpu"', "SPEC + DRA: absorbed by || true"),
    # --- conversions -------------------------------------------------------------------------
    t('int("42") == 42', "SPEC int(string)", oracle=True),
    t('int("+5") == 5', "SPEC int(string) takes a sign", oracle=True),
    t("int(-1.5) == -1", "SPEC: int(double) truncates", oracle=True),
    err("int(1e19) == 0", "range", "SPEC: double out of int64 range", oracle=True),
    err('int("x") == 0', "convert", "SPEC: int of a non-number string", oracle=True),
    t("uint(3) == 3u", "SPEC uint(int)", oracle=True),
    err("uint(-1) == 0u", "overflow", "SPEC: negative int to uint", oracle=True),
    t("double(3) == 3.0", "SPEC double(int)", oracle=True),
    t('double("1e3") == 1000.0', "SPEC double(string)", oracle=True),
    t('string(12) == "12"', "SPEC string(int)", oracle=True),
    t('string(1.5) == "1.5"', "SPEC string(double)", oracle=True),
    t('string(1e20) == "1e+20"', "SPEC string(double), Go %g form", oracle=True),
    t('string(100.0) == "100"', "SPEC string(double)", oracle=True),
    t('string(true) == "true"', "SPEC string(bool)", oracle=True),
    t('string(b"ab") == "ab"', "SPEC string(bytes)", oracle=True),
    t('bytes("ab") == b"ab"', "SPEC bytes(string)", oracle=True),
    t('bool("true")', "SPEC bool(string)", oracle=True),
    t("type(1) == int && type('a') == string", "SPEC type()", oracle=True),
    # --- macros ------------------------------------------------------------------------------
    t("[1, 2, 3].all(x, x > 0)", "SPEC all", oracle=True),
    f("[1, 2, 3].all(x, x > 1)", "SPEC all", oracle=True),
    t("[1, 2, 3].exists(x, x == 2)", "SPEC exists", oracle=True),
    t("[1, 2, 3].exists_one(x, x > 2)", "SPEC exists_one", oracle=True),
    f("[1, 2].exists_one(x, x > 0)", "SPEC exists_one: two matches", oracle=True),
    t("[1, 2, 3].map(x, x * 2) == [2, 4, 6]", "SPEC map", oracle=True),
    t("[1, 2, 3].map(x, x > 1, x * 2) == [4, 6]", "SPEC map with a filter", oracle=True),
    t("[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]", "SPEC filter", oracle=True),
    t("{'a': 1, 'b': 2}.all(k, k.size() == 1)", "SPEC all over map keys", oracle=True),
    t("[0, 1].exists(x, 1 / x == 1)", "SPEC: exists absorbs an error when true", oracle=True),
    f("[0, 1].all(x, 1 / x == 2)", "SPEC: all absorbs an error when false", oracle=True),
    err(
        "[0, 1].all(x, 1 / x == 1)", "divide by zero", "SPEC: all with error, no false", oracle=True
    ),
    t("[[1, 2], [3]].all(l, l.all(x, x > 0))", "SPEC nested comprehensions", oracle=True),
    t("has({'a': 1}.a)", "SPEC has() on a map", oracle=True),
    bad("has(device)", "1:4", "SPEC: has() needs a field selection"),
    bad("[1].all(1, true)", "1:9", "SPEC: the macro variable must be an identifier"),
    # --- cel.bind ----------------------------------------------------------------------------
    t("cel.bind(x, 2, x * x == 4)", "GO-BIND", oracle=True),
    t(
        f'cel.bind(a, {A}, a.type == "gpu" && a.architecture == "Hopper")',
        "GO-BIND + DRA",
    ),
    t("cel.bind(x, [1, 2], cel.bind(y, x.size(), y == 2))", "GO-BIND nested", oracle=True),
    t("cel.bind(x, 1 / 0, true)", "GO-BIND: an unused binding is never evaluated", oracle=True),
    t("[1, 2].all(i, cel.bind(j, i * 2, j > i))", "GO-BIND inside a comprehension", oracle=True),
    # --- string extensions (cel-go ext/strings.go) --------------------------------------------
    t('"hello".charAt(1) == "e"', "GO-STR charAt", oracle=True),
    t('"hello".charAt(5) == ""', "GO-STR: charAt(size) is empty", oracle=True),
    err('"hello".charAt(6) == ""', "out of range", "GO-STR: charAt past the end", oracle=True),
    t('"hello".indexOf("l") == 2', "GO-STR indexOf", oracle=True),
    t('"hello".indexOf("l", 3) == 3', "GO-STR indexOf with offset", oracle=True),
    t('"hello".indexOf("") == 0', "GO-STR: indexOf empty string", oracle=True),
    t('"hello".indexOf("z") == -1', "GO-STR: not found", oracle=True),
    t('"hello mellow".indexOf("ello", 2) == 7', "GO-STR indexOf doc example"),
    t('"hello mellow".indexOf("", 2) == 2', "GO-STR indexOf doc example"),
    t('"hello mellow".indexOf("ello", 20) == -1', "GO-STR doc: past the end is -1 (cel-go)"),
    err('"hello mellow".indexOf("ello", -1) == 0', "out of range", "GO-STR doc example"),
    t('"hello".lastIndexOf("l") == 3', "GO-STR lastIndexOf", oracle=True),
    t('"hello".lastIndexOf("l", 2) == 2', "GO-STR lastIndexOf with offset", oracle=True),
    t('"hello".lastIndexOf("") == 5', "GO-STR: lastIndexOf empty string", oracle=True),
    t('"hello mellow".lastIndexOf("ello", 6) == 1', "GO-STR lastIndexOf doc example"),
    t('"hello mellow".lastIndexOf("ello", 20) == -1', "GO-STR lastIndexOf doc example"),
    err('"hello mellow".lastIndexOf("ello", -1) == 0', "out of range", "GO-STR doc example"),
    t('"hello hello".replace("", "_") == "_h_e_l_l_o_ _h_e_l_l_o_"', "GO-STR replace doc"),
    t('"tacocat".substring(0, 4) == "taco"', "GO-STR substring doc example"),
    err('"tacocat".substring(-1) == ""', "out of range", "GO-STR substring doc example"),
    t('"TacoCat".lowerAscii() == "tacocat"', "GO-STR lowerAscii", oracle=True),
    t('"ÀB".lowerAscii() == "Àb"', "GO-STR: lowerAscii leaves non-ASCII", oracle=True),
    t('"TacoCat".upperAscii() == "TACOCAT"', "GO-STR upperAscii", oracle=True),
    t('"aaa".replace("a", "b") == "bbb"', "GO-STR replace", oracle=True),
    t('"aaa".replace("a", "b", 2) == "bba"', "GO-STR replace with a limit", oracle=True),
    t('"a,b,c".split(",") == ["a", "b", "c"]', "GO-STR split", oracle=True),
    t('"a,b,c".split(",", 2) == ["a", "b,c"]', "GO-STR split with a limit", oracle=True),
    t('"a,b".split(",", 0) == []', "GO-STR: split limit 0 is empty", oracle=True),
    t('"abc".split("") == ["a", "b", "c"]', "GO-STR: split on empty separator", oracle=True),
    t('"".split("") == []', "GO-STR: Go strings.Split of empty on empty is empty (oracle)"),
    t('"hello".substring(1) == "ello"', "GO-STR substring", oracle=True),
    t('"hello".substring(1, 3) == "el"', "GO-STR substring range", oracle=True),
    err('"abc".substring(2, 1) == ""', "less than", "GO-STR: end before start", oracle=True),
    err('"hello".substring(6) == ""', "out of range", "GO-STR: past the end", oracle=True),
    t('"  \\t a b \\n".trim() == "a b"', "GO-STR trim", oracle=True),
    t('["a", "b", "c"].join() == "abc"', "GO-STR join", oracle=True),
    t('["a", "b"].join("-") == "a-b"', "GO-STR join with a separator", oracle=True),
    t('[].join(",") == ""', "GO-STR join of an empty list", oracle=True),
    bad("[1].join()", "1:9", "GO-STR: join needs list(string)", oracle=True),
    t('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""', "GO-STR strings.quote"),
    # --- format (cel-go ext/formatting.go) ---------------------------------------------------
    t('"%s-%d".format(["a", 1]) == "a-1"', "GO-FMT %s %d", oracle=True),
    t('"%.2f".format([1.005]) == "1.00"', "GO-FMT %f with precision", oracle=True),
    t('"%e".format([1234.5]) == "1.234500e+03"', "GO-FMT %e", oracle=True),
    t('"%x|%X".format([255, "hi"]) == "ff|6869"', "GO-FMT %x %X", oracle=True),
    t('"%o|%b".format([8, 5]) == "10|101"', "GO-FMT %o %b", oracle=True),
    t('"%s".format([[1, "a", 2.0]]) == "[1, a, 2]"', "GO-FMT %s of a list", oracle=True),
    t('"100%%".format([]) == "100%"', "GO-FMT %% escape", oracle=True),
    err('"%s %s".format([1]) == ""', "out of range", "GO-FMT: too few arguments", oracle=True),
    err('"%d".format([1.5]) == ""', "integer", "GO-FMT: %d takes integers only (cel-go)"),
    # --- lists (kubernetes library/lists.go) -------------------------------------------------
    t("[1, 2, 3].isSorted()", "K8S-LIST isSorted"),
    t("['a', 'b', 'b', 'c'].isSorted()", "K8S-LIST isSorted"),
    f("[2.0, 1.0].isSorted()", "K8S-LIST isSorted"),
    t("[].isSorted()", "K8S-LIST isSorted of []"),
    t("[1, 3].sum() == 4", "K8S-LIST sum"),
    t("[1.0, 3.0].sum() == 4.0", "K8S-LIST sum of doubles"),
    t("[].sum() == 0", "K8S-LIST: [].sum() returns 0"),
    t("[1, 3].min() == 1 && [1, 3].max() == 3", "K8S-LIST min max"),
    err("[].min() == 0", "empty list", "K8S-LIST: min of [] is an error"),
    t("[1, 2, 2, 3].indexOf(2) == 1", "K8S-LIST indexOf"),
    t("['a', 'b', 'b', 'c'].lastIndexOf('b') == 2", "K8S-LIST lastIndexOf"),
    t("[1.0].indexOf(1.1) == -1", "K8S-LIST indexOf not found"),
    err("[1, 9223372036854775807].sum() == 0", "overflow", "K8S-LIST sum overflows like _+_"),
    # --- regex (kubernetes library/regex.go, SPEC matches) -----------------------------------
    t('"abc 123".matches("[0-9]+")', "SPEC matches is a partial match (RE2)", oracle=True),
    f('"abc".matches("^b")', "SPEC matches", oracle=True),
    t('matches("abc", "b")', "SPEC matches, global form", oracle=True),
    t('"abc 123".find("[0-9]+") == "123"', "K8S-RE find"),
    t('"abc".find("[0-9]+") == ""', "K8S-RE find without a match"),
    t('"123 abc 456".findAll("[0-9]+") == ["123", "456"]', "K8S-RE findAll"),
    t('"123 abc 456".findAll("[0-9]+", 1) == ["123"]', "K8S-RE findAll with a limit"),
    t('"123 abc 456".findAll("xyz") == []', "K8S-RE findAll without a match"),
    t('"12a".findAll("[0-9]*") == ["12", ""]', "K8S-RE: Go FindAllString skips abutting empties"),
    t('"abc 123".find("[0-9]*") == ""', "K8S-RE: Go FindString takes the empty match at 0"),
    bad('"a".matches("(")', "1:13", "K8S-RE: constant patterns are compiled with the program"),
    bad('"a".matches("(?=a)")', "1:13", "K8S-RE: RE2 has no lookaround"),
    # --- quantity (kubernetes library/quantity.go) -------------------------------------------
    t('quantity("200M").compareTo(quantity("0.2G")) == 0', "K8S-QTY compareTo example"),
    t('quantity("50M").compareTo(quantity("50Mi")) == -1', "K8S-QTY compareTo example"),
    t('quantity("50Mi").compareTo(quantity("50M")) == 1', "K8S-QTY compareTo example"),
    t('quantity("150Mi").isGreaterThan(quantity("100Mi"))', "K8S-QTY isGreaterThan example"),
    t('quantity("50M").isLessThan(quantity("100M"))', "K8S-QTY isLessThan example"),
    t('isQuantity("1.3Gi") && !isQuantity("200K") && !isQuantity("1,3G")', "K8S-QTY isQuantity"),
    err('quantity("Three") == quantity("3")', "quantity", "K8S-QTY: quantity('Three') errors"),
    t('quantity("50k").isInteger()', "K8S-QTY isInteger example"),
    f('quantity("9999999999999999999999999999999999999G").isInteger()', "K8S-QTY isInteger"),
    err(
        'quantity("9999999999999999999999999999999999999G").asInteger() == 0',
        "cannot convert value to integer",
        "K8S-QTY asInteger overflow",
    ),
    t('quantity("50k").asInteger() == 50000', "K8S-QTY asInteger example"),
    t('quantity("50k").sub(20000).asApproximateFloat() == 30000.0', "K8S-QTY example"),
    t('quantity("50k").add(quantity("20k")) == quantity("70k")', "K8S-QTY add"),
    t('quantity("50k").add(20) == quantity("50020")', "K8S-QTY add int example"),
    t('quantity("50k").sub(quantity("20k")) == quantity("30k")', "K8S-QTY sub"),
    t(
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        "K8S-QTY chained example",
    ),
    t('sign(quantity("-1")) == -1 && sign(quantity("0")) == 0', "K8S-QTY sign"),
    bad(
        'quantity("1").sign() == 1',
        "1:19",
        "K8S-QTY: sign is declared as a global overload only (reference oracle, tests/oracles)",
    ),
    t('quantity("1Gi") == quantity("1024Mi")', "K8S-QTY: equality by value"),
    bad('quantity("1") < quantity("2")', "1:15", "K8S-QTY: no ordering operators on Quantity"),
    bad('quantity("1").add(1.5)', "1:18", "K8S-QTY: add takes Quantity or int"),
    # --- semver (kubernetes library/semverlib.go, blang/semver) ------------------------------
    t('semver("1.2.3").compareTo(semver("1.2.3")) == 0', "K8S-SEM compareTo example"),
    t('semver("1.2.3").compareTo(semver("2.0.0")) == -1', "K8S-SEM compareTo example"),
    t('semver("1.2.3").compareTo(semver("0.1.2")) == 1', "K8S-SEM compareTo example"),
    t('semver("1.2.3").major() == 1', "K8S-SEM major example"),
    t('semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3', "K8S-SEM minor patch"),
    t('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', "BLANG: a prerelease sorts first"),
    t('semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))', "BLANG prerelease"),
    t('semver("1.0.0-2").isLessThan(semver("1.0.0-10"))', "BLANG: numeric identifiers"),
    t('semver("1.0.0+build1") == semver("1.0.0+build2")', "BLANG: build metadata ignored"),
    t('semver("2.0.0").isGreaterThan(semver("1.99.99"))', "K8S-SEM isGreaterThan"),
    t('isSemver("1.0.0") && !isSemver("hello")', "K8S-SEM isSemver examples"),
    f('isSemver("v1.0")', "K8S-SEM: a leading v needs normalize"),
    t('isSemver("v1.0", true)', "K8S-SEM: normalize strips v and pads"),
    t('semver("v1.0", true) == semver("1.0.0")', "K8S-SEM normalize example"),
    t('semver("01.01.01", true) == semver("1.1.1")', "K8S-SEM normalize leading zeros"),
    f('isSemver("01.1.1")', "BLANG: leading zeros are invalid"),
    f('isSemver("1.0-alpha", true)', "K8S-SEM: short versions cannot have prerelease"),
    err('semver("Three") == semver("3.0.0")', "semver", "K8S-SEM: semver('Three') errors"),
    bad('semver("1.0.0") < semver("2.0.0")', "1:17", "K8S-SEM: no ordering operators"),
    bad("semver(1)", "1:7", "K8S-SEM: semver takes a string"),
    # --- compile-time checks: unknown names, arity, types, result type ----------------------
    bad("foo(1)", "1:4", "SPEC: undeclared reference", oracle=True),
    bad("x == 1", "1:1", "SPEC: undeclared variable", oracle=True),
    bad('"a".size(1)', "1:9", "SPEC: size takes no argument in receiver form", oracle=True),
    bad('"a".charAt()', "1:11", "GO-STR: charAt needs an index"),
    bad('"x" + 1 == "x1"', "1:5", "SPEC: no _+_ for (string, int)", oracle=True),
    bad('"a" == null', "1:5", "SPEC: no _==_ for (string, null_type)", oracle=True),
    bad("[1] == [1.0]", "1:5", "SPEC: list(int) vs list(double)", oracle=True),
    bad("[1, 2][1u] == 2", "1:7", "SPEC: list index takes int", oracle=True),
    bad("1 + 1", "1:1", "DRA: a selector must evaluate to bool"),
    err(f"{A}.productName", "not bool", "DRA: dyn compiles; any non-bool result is an error"),
    bad("!1", "1:1", "SPEC: no !_ for int", oracle=True),
    bad("1 &&", "1:5", "SPEC grammar", oracle=True),
    bad("(1 == 1", "1:8", "SPEC grammar: unbalanced parenthesis", oracle=True),
    bad("a.b.c(", "1:7", "SPEC grammar", oracle=True),
    bad("1 == 1 @", "1:8", "SPEC grammar: unknown token", oracle=True),
    bad("1 ==\n  2 +", "2:6", "SPEC grammar: position on the second line"),
    bad("if == 1", "1:1", "SPEC: reserved identifier", oracle=True),
    bad("9223372036854775808 > 0", "1:1", "SPEC: int literal out of range", oracle=True),
    bad("device.attributes == 1", "1:19", "DRA: map compared with int"),
    # --- valid Kubernetes CEL this tool does not support -------------------------------------
    unsupported(f"{A}.?productName.orValue('') == 'x'", "K8S-ENV OptionalTypes"),
    unsupported("optional.of(1).hasValue()", "K8S-ENV OptionalTypes"),
    unsupported("[?optional.none()] == []", "K8S-ENV OptionalTypes"),
    t("1 < 1.5 && 2u >= 1.5 && 1 < 2u", "K8S-ENV CrossTypeNumericComparisons (oracle)"),
    bad("1 == 1.0", "1:3", "K8S-ENV: cross-type numeric equality does not type-check (oracle)"),
    bad("1 == 1u", "1:3", "K8S-ENV: cross-type numeric equality does not type-check (oracle)"),
    # K8S-ENV HomogeneousAggregateLiterals, each checked against the reference oracle.
    bad('[1, "a"].size() == 2', "1:5", "K8S-ENV: a list literal has one element type"),
    bad('{"a": 1, "b": "x"}.size() == 2', "1:15", "K8S-ENV: map literal values share a type"),
    bad("[[1], [2u]].size() == 2", "1:7", "K8S-ENV: nested element types must agree"),
    bad(
        f"[device.driver, {A}.productName].size() == 2",
        "1:52",
        "K8S-ENV: an attribute is of the unknown type, not a string, in a literal",
    ),
    t(f"[{A}.productName, {A}.architecture].size() == 2", "K8S-ENV: attributes share a type"),
    t("[[], [1]].size() == 2", "K8S-ENV: the empty list joins any list type"),
    t('"%s/%d".format([["a", 1][0], 2]) == "a/2"', "GO-FMT: literals in format() are exempt"),
    unsupported("sets.contains([1, 2], [1])", "K8S-ENV ext.Sets"),
    unsupported('ip("10.0.0.1").family() == 4', "K8S-ENV IP library"),
    unsupported('cidr("10.0.0.0/8").containsIP(ip("10.0.0.1"))', "K8S-ENV CIDR library"),
    unsupported('isURL("https://example.com")', "K8S-ENV URLs library"),
    unsupported('url("https://example.com").getHost() == "example.com"', "K8S-ENV URLs"),
    unsupported("[1, 2].all(i, v, v > 0)", "K8S-ENV two-variable comprehensions"),
    unsupported(f'{A}.model.includes("H100")', "K8S-LIST includes (DRAListTypeAttributes gate)"),
]
