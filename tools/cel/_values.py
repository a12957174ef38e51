"""Runtime value representations that Python does not have natively."""


class UInt(int):
    """CEL ``uint``: a distinct type, so ``1u == 1`` needs no Python-level ambiguity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class CelType:
    """A CEL type value, the result of ``type(x)`` and of the type identifiers (``int`` ...)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name
