"""Semantic versions with the rules of github.com/blang/semver/v4, which Kubernetes uses.

``Semver.parse`` is strict like ``semver.Parse``: ``MAJOR.MINOR.PATCH``, no leading zeros
in numbers, optional ``-prerelease`` and ``+build``. ``normalize=True`` first applies
Kubernetes' ``normalizeAndParse`` (CEL semver library): drop one leading ``v``, strip
leading zeros, pad ``1`` / ``1.2`` with ``.0``.
"""

from dataclasses import dataclass
from functools import total_ordering

from driver.common.errors import PermanentError

_ALNUM = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")


class SemverError(PermanentError, ValueError):
    """The text is not a semantic version."""


def _number(part: str, what: str, text: str) -> int:
    if not part or not part.isascii() or not part.isdigit():
        raise SemverError(f"invalid character(s) found in {what} number {part!r} of {text!r}")
    if len(part) > 1 and part[0] == "0":
        raise SemverError(f"{what} number must not contain leading zeroes {part!r} of {text!r}")
    value = int(part)
    if value >= 1 << 64:
        raise SemverError(f"{what} number {part!r} of {text!r} is out of range")
    return value


def _prerelease_part(part: str, text: str) -> int | str:
    if not part:
        raise SemverError(f"empty prerelease identifier in {text!r}")
    if not set(part) <= _ALNUM:
        raise SemverError(f"invalid character(s) found in prerelease {part!r} of {text!r}")
    if part.isdigit():
        if len(part) > 1 and part[0] == "0":
            raise SemverError(f"prerelease number {part!r} of {text!r} has leading zeroes")
        return int(part)
    return part


def _normalized(text: str) -> str:
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in "0123456789":
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise SemverError(f"short version {text!r} cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


@total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, normalize: bool = False) -> "Semver":
        """Parse ``text``; raises :class:`SemverError` with the reason."""
        if normalize:
            text = _normalized(text)
        if not text:
            raise SemverError("version string empty")
        rest, plus, build_text = text.partition("+")
        build: tuple[str, ...] = ()
        if plus:
            build = tuple(build_text.split("."))
            if any(not b or not set(b) <= _ALNUM for b in build):
                raise SemverError(f"invalid build metadata in {text!r}")
        core, dash, pre_text = rest.partition("-")
        numbers = core.split(".")
        if len(numbers) != 3:
            raise SemverError(f"no major, minor and patch version in {text!r}")
        major, minor, patch = (
            _number(p, w, text) for p, w in zip(numbers, ("major", "minor", "patch"), strict=True)
        )
        pre = tuple(_prerelease_part(p, text) for p in pre_text.split(".")) if dash else ()
        return cls(major, minor, patch, pre, build)

    def compare(self, other: "Semver") -> int:
        """-1, 0 or 1, by semver precedence (build metadata ignored)."""
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for x, y in zip(self.pre, other.pre, strict=False):
            if x == y:
                continue
            if isinstance(x, int) and isinstance(y, int):
                return -1 if x < y else 1
            if isinstance(x, int):
                return -1  # numeric identifiers sort before alphanumeric ones
            if isinstance(y, int):
                return 1
            return -1 if x < y else 1
        return -1 if len(self.pre) < len(other.pre) else 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __lt__(self, other: "Semver") -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text
