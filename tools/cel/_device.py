"""The ``device`` variable: a ResourceSlice device as CEL sees it, converted lazily.

Lookup rules (kubernetes dynamic-resource-allocation cel/compile.go): attributes and
capacities are grouped by domain; an unqualified name belongs to the driver's domain; an
unknown domain is an empty map; an unknown name inside a domain is an evaluation error.
``version`` attributes are semver values, capacities are quantities.
"""

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from driver.common.quantity import Quantity
from driver.common.semver import Semver, SemverError
from tools.cel._errors import CelEvalError
from tools.cel._runtime import LazyMap

_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")

# Both types are immutable and a cluster repeats the same few strings on every device, so
# parsing is shared process-wide (a cache keyed per device would parse 40,000 times).
_parse_quantity = lru_cache(maxsize=8192)(Quantity.parse)
_parse_semver = lru_cache(maxsize=8192)(Semver.parse)


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, slash, ident = name.rpartition("/")
    return (domain, ident) if slash else (driver, name)


class CelDevice:
    """One device, built once with :meth:`from_api` and evaluated by any number of selectors."""

    __slots__ = ("_attrs", "_caps", "allow_multiple_allocations", "driver", "name")

    cel_type_name = "device"

    def __init__(
        self,
        driver: str,
        attributes: Mapping[str, Any],
        capacity: Mapping[str, Any],
        allow_multiple_allocations: bool = False,
        name: str = "",
    ) -> None:
        self.driver = driver
        self.name = name
        self._attrs = attributes
        self._caps = capacity
        self.allow_multiple_allocations = allow_multiple_allocations

    @classmethod
    def from_api(cls, driver: str, device: Mapping[str, Any]) -> "CelDevice":
        """From a ``resource.k8s.io/v1`` ResourceSlice device (JSON form); nothing converted yet."""
        return cls(
            driver,
            device.get("attributes") or {},
            device.get("capacity") or {},
            bool(device.get("allowMultipleAllocations", False)),
            str(device.get("name", "")),
        )

    def _raw(self, table: Mapping[str, Any], domain: str, ident: str) -> Any:
        if domain == self.driver:
            raw = table.get(ident)
            if raw is not None:
                return raw
        return table.get(f"{domain}/{ident}")

    def attribute(self, domain: str, ident: str) -> Any:
        """The CEL value of attribute ``domain``/``ident``; KeyError if absent."""
        raw = self._raw(self._attrs, domain, ident)
        if raw is None:
            raise KeyError(ident)
        value = raw.get("string")
        if value is not None:
            return value
        value = raw.get("int")
        if value is not None:
            return int(value)
        value = raw.get("bool")
        if value is not None:
            return bool(value)
        value = raw.get("version")
        if value is not None:
            return self._semver(domain, ident, value)
        raise CelEvalError(f"attribute {domain}/{ident} has no value of a known type: {raw!r}")

    def _semver(self, domain: str, ident: str, text: str) -> Semver:
        try:
            return _parse_semver(text)
        except SemverError as err:
            raise CelEvalError(f"attribute {domain}/{ident}: {err}") from None

    def capacity_value(self, domain: str, ident: str) -> Quantity:
        """The quantity of capacity ``domain``/``ident``; KeyError if absent."""
        raw = self._raw(self._caps, domain, ident)
        if raw is None:
            raise KeyError(ident)
        text = raw.get("value") if isinstance(raw, Mapping) else raw
        try:
            return _parse_quantity(str(text))
        except ValueError as err:
            raise CelEvalError(f"capacity {domain}/{ident}: {err}") from None

    def has(self, domain: str, ident: str, capacity: bool) -> bool:
        """``has(device.attributes[domain].ident)`` without converting the value."""
        return self._raw(self._caps if capacity else self._attrs, domain, ident) is not None

    def _names(self, table: Mapping[str, Any], domain: str) -> list[object]:
        names: list[object] = []
        for qualified in table:
            d, ident = _split(qualified, self.driver)
            if d == domain and ident not in names:
                names.append(ident)
        return names

    def _domains(self, table: Mapping[str, Any]) -> list[object]:
        domains: list[object] = []
        for qualified in table:
            d = _split(qualified, self.driver)[0]
            if d not in domains:
                domains.append(d)
        return domains

    def cel_field(self, field: str) -> Any:
        if field == "driver":
            return self.driver
        if field == "attributes":
            return _Domains(self, capacity=False)
        if field == "capacity":
            return _Domains(self, capacity=True)
        if field == "allowMultipleAllocations":
            return self.allow_multiple_allocations
        raise CelEvalError(f"no such field: device.{field}")

    def cel_has(self, field: str) -> bool:
        return field in _FIELDS

    def __repr__(self) -> str:
        return f"CelDevice(driver={self.driver!r}, name={self.name!r})"


class _Domains(LazyMap):
    """``device.attributes`` / ``device.capacity``: every domain answers, unknown ones empty."""

    __slots__ = ("_capacity", "_device")

    def __init__(self, device: CelDevice, capacity: bool) -> None:
        self._device = device
        self._capacity = capacity

    def lookup(self, key: object) -> Any:
        if type(key) is not str:
            raise KeyError(key)
        return DomainMap(self._device, key, self._capacity)

    def contains(self, key: object) -> bool:
        return key in self.keys()

    def keys(self) -> list[object]:
        device = self._device
        return device._domains(device._caps if self._capacity else device._attrs)


class DomainMap(LazyMap):
    """The attributes (or capacities) of one domain."""

    __slots__ = ("_capacity", "_device", "_domain")

    def __init__(self, device: CelDevice, domain: str, capacity: bool) -> None:
        self._device = device
        self._domain = domain
        self._capacity = capacity

    def lookup(self, key: object) -> Any:
        if type(key) is not str:
            raise KeyError(key)
        if self._capacity:
            return self._device.capacity_value(self._domain, key)
        return self._device.attribute(self._domain, key)

    def keys(self) -> list[object]:
        device = self._device
        return device._names(device._caps if self._capacity else device._attrs, self._domain)
