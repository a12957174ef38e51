"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch.

Strategic merge patch is applied as a merge patch (directives like ``$patch`` are dropped):
for the types served here every list the project patches is atomic, where both agree.
"""

import copy
from typing import Any

from sandbox.apiserver._status import ApiError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
TYPES = (JSON_PATCH, MERGE, STRATEGIC)


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _invalid(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _invalid(message: str) -> ApiError:
    return ApiError(
        422, f"the server rejected our request due to an error in our request: {message}", "Invalid"
    )


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise _invalid(f"path /{'/'.join(parts)} does not exist") from exc
    return node, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    node, last = _parent(doc, parts)
    try:
        return node[int(last)] if isinstance(node, list) else node[last]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise _invalid(f"path /{'/'.join(parts)} does not exist") from exc


def _remove(doc: Any, parts: list[str]) -> Any:
    value = _get(doc, parts)
    node, last = _parent(doc, parts)
    if isinstance(node, list):
        node.pop(int(last))
    else:
        del node[last]
    return value


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    node, last = _parent(doc, parts)
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if not 0 <= index <= len(node):
            raise _invalid(f"index {index} out of range")
        node.insert(index, value)
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise _invalid(f"path /{'/'.join(parts)} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError(400, "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"invalid json patch operation: {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)
            if not parts:
                doc = copy.deepcopy(op.get("value"))
            else:
                node, last = _parent(doc, parts)
                node[int(last) if isinstance(node, list) else last] = copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise _invalid(f"testing value /{'/'.join(parts)} failed")
        else:
            raise ApiError(400, f"unsupported json patch operation {kind!r}")
    return doc
