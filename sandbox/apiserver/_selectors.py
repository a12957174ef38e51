"""Label and field selectors, parsed once per request and matched per object."""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.apiserver._resources import ResourceType
from sandbox.apiserver._status import ApiError

_KEY = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class _LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _bad(message: str) -> ApiError:
    return ApiError(400, message)


def _check_key(key: str, selector: str) -> str:
    if not _KEY.fullmatch(key):
        raise _bad(f"unable to parse requirement: invalid label key {key!r} in {selector!r}")
    return key


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over an object's labels; ApiError 400 for a malformed selector."""
    if not selector.strip():
        return lambda _labels: True
    requirements: list[_LabelRequirement] = []
    for part in _split_top_level(selector):
        set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", part)
        if set_match:
            key, op, raw = set_match.groups()
            values = tuple(v.strip() for v in raw.split(","))
            requirements.append(_LabelRequirement(_check_key(key, selector), op, values))
            continue
        op_match = re.fullmatch(r"([^!=<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)", part)
        if op_match:
            key, op, value = op_match.groups()
            if op in (">", "<"):
                if not re.fullmatch(r"-?[0-9]+", value):
                    raise _bad(f"unable to parse requirement: {part!r}: value must be an integer")
                requirements.append(
                    _LabelRequirement(
                        _check_key(key, selector), "gt" if op == ">" else "lt", (value,)
                    )
                )
            else:
                normalized = "=" if op in ("=", "==") else "!="
                requirements.append(
                    _LabelRequirement(_check_key(key, selector), normalized, (value,))
                )
            continue
        if part.startswith("!"):
            requirements.append(_LabelRequirement(_check_key(part[1:].strip(), selector), "!"))
            continue
        if part:
            requirements.append(_LabelRequirement(_check_key(part, selector), "exists"))
            continue
        raise _bad(f"unable to parse label selector {selector!r}")

    def matches(labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in requirements)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares against: "" when absent, like the real server."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _split_unescaped(text: str, sep: str) -> list[str]:
    return [p for p in re.split(r"(?<!\\)" + re.escape(sep), text)]


@dataclass(frozen=True)
class FieldSelector:
    """Parsed ``fieldSelector``: equality and inequality terms on supported fields."""

    terms: tuple[tuple[str, bool, str], ...]  # (field, equal?, value)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, f) == v) == eq for f, eq, v in self.terms)

    def exact(self, field: str) -> str | None:
        """The value an equality term pins ``field`` to, if any (for index lookups)."""
        for f, eq, v in self.terms:
            if f == field and eq:
                return v
        return None


def parse_field_selector(selector: str, rt: ResourceType) -> FieldSelector:
    terms: list[tuple[str, bool, str]] = []
    if not selector.strip():
        return FieldSelector(())
    allowed = {"metadata.name", "metadata.namespace", *rt.selectable}
    for part in _split_unescaped(selector, ","):
        match = re.fullmatch(r"([^!=]+?)\s*(==|=|!=)\s*(.*)", part.strip())
        if match is None:
            raise _bad(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, value = match.groups()
        if field not in allowed:
            raise _bad(f"field label not supported: {field}")
        terms.append((field, op != "!=", _unescape(value)))
    return FieldSelector(tuple(terms))
