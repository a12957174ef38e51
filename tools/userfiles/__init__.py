"""Files a user hands the offline tools, read and checked within bounds.

`gpu-dra validate` and `explain` promise one line for any input, never a traceback: a symlink
to ``/dev/zero`` was read until memory ran out, a 1 KB YAML alias bomb expanded to a billion
values under the schema check, 200,000 nested JSON lists overflowed the decoder. So: a
regular file (or stdin) of at most ``--max-file-size`` bytes; a document whose YAML aliases
add at most :data:`MAX_ALIAS_VALUES` values to it and whose nesting stays within
:data:`MAX_DEPTH` levels. A manifest comes nowhere near either bound.
"""

import os
import re
import stat
import sys
from typing import TYPE_CHECKING, Any

import yaml

from driver.common.errors import PermanentError

DEFAULT_MAX_BYTES = 64 << 20  # a big cluster's `discover` output is a few MiB
MAX_DEPTH = 100  # a ResourceClaim is under 15 levels deep; libyaml stops at 1000
MAX_ALIAS_VALUES = 1_000_000  # values YAML aliases may add by repeating others
_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6, "G": 10**9}
_SIZE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|k|M|G)?$")


class UserFileError(PermanentError):
    """A file that is no regular file, too large, not UTF-8, or a document past the bounds:
    the same input fails again."""


def parse_size(text: str) -> int:
    """A byte count as ``--max-file-size`` takes it: ``1048576``, ``64Mi``, ``10M``."""
    match = _SIZE.match(text.strip())
    if match is None or int(match[1]) == 0:
        raise ValueError(f"{text!r} is not a size such as 64Mi or 1000000")
    return int(match[1]) * _UNITS[match[2] or ""]


def size_text(limit: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if limit % _UNITS[unit] == 0:
            return f"{limit // _UNITS[unit]}{unit}"
    return f"{limit} bytes"


def read_text(name: str, *, limit: int = DEFAULT_MAX_BYTES) -> str:
    """The UTF-8 text of file ``name`` ("-": stdin), at most ``limit`` bytes of it."""
    if name == "-":
        stream = getattr(sys.stdin, "buffer", None)  # none where a test replaced stdin
        data = stream.read(limit + 1) if stream else sys.stdin.read(limit + 1).encode()
    else:
        try:
            # Non-blocking: a FIFO must not hang the open; fstat of the opened file, so a
            # symlink swapped after a check cannot lead elsewhere.
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise UserFileError(f"{name}: cannot read: {exc.strerror or exc}") from exc
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UserFileError(f"{name}: cannot read: not a regular file")
            if info.st_size > limit:
                raise _too_large(name, limit)
            try:
                data = handle.read(limit + 1)
            except OSError as exc:
                raise UserFileError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise _too_large(name, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{name}: cannot read: not UTF-8 text ({exc.reason})") from exc


def _too_large(name: str, limit: int) -> UserFileError:
    return UserFileError(
        f"{name}: cannot read: larger than {size_text(limit)} (raise --max-file-size)"
    )


def document_error(doc: Any) -> str | None:
    """Why a parsed document is refused, or None: nested past :data:`MAX_DEPTH`, a YAML alias
    inside itself, or aliases that expand it by more than :data:`MAX_ALIAS_VALUES` values.

    One iterative walk over the distinct containers (a value an alias repeats is the same
    object): each one's expanded size and height are kept, so a billion repeated values
    cost as many steps as the file has lines."""
    if not isinstance(doc, (dict, list)):
        return None
    sizes: dict[int, tuple[int, int]] = {}  # id -> (expanded values, height)
    parents: set[int] = set()
    distinct = 0
    stack: list[tuple[Any, int, bool]] = [(doc, 1, False)]
    while stack:
        value, depth, done = stack.pop()
        key = id(value)
        children = list(value.values()) if isinstance(value, dict) else value
        if done:
            parents.discard(key)
            held = [sizes.get(id(c), (1, 0)) for c in children]
            size = 1 + sum(s for s, _ in held)
            sizes[key] = (size, 1 + max((h for _, h in held), default=0))
            distinct += 1 + sum(1 for c in children if not isinstance(c, (dict, list)))
            if size - distinct > MAX_ALIAS_VALUES:
                return (
                    f"its YAML aliases expand it past {MAX_ALIAS_VALUES} more values "
                    f"(at most {MAX_ALIAS_VALUES})"
                )
            continue
        if key in sizes:
            if depth - 1 + sizes[key][1] > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels (at most {MAX_DEPTH})"
            continue
        if key in parents:
            return "a YAML alias refers to a value that holds it"
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels (at most {MAX_DEPTH})"
        parents.add(key)
        stack.append((value, depth, True))
        stack.extend((c, depth + 1, False) for c in children if isinstance(c, (dict, list)))
    return None


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key written twice in one mapping."""


# libyaml's parser when present: the pure-Python one is ten times slower. Both share
# SafeConstructor, whose methods are all StrictLoader uses, so the type checker sees the
# pure-Python one as the base.
if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeLoader):
    """The safe loader, refusing a key written twice in one mapping, as YAML 1.2 and the
    API server's decoder do (PyYAML keeps the last silently). Two documents run together
    without ``---`` make such a mapping: read as one object, the first would vanish."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], yaml.Node] = {}
        for key_node, _ in node.value:
            # Keys as written (a merge key "<<" may repeat): no alias is expanded here.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            first = seen.setdefault((key_node.tag, key_node.value), key_node)
            if first is not key_node:
                raise DuplicateKeyError(
                    None,
                    None,
                    f"duplicate key {key_node.value!r} (first at line "
                    f"{first.start_mark.line + 1}): a key must be unique in its mapping; two "
                    "documents run together need '---' between them",
                    key_node.start_mark,
                )
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping
