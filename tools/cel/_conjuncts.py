"""A selector cut into the clauses its top-level ``&&`` joins.

CEL's ``&&`` is commutative even with errors (``false && error`` is false either way round),
so a device is selected exactly when every clause is true on it: each clause can be judged,
and named in a message, on its own. A clause is cut from the source text, so a message
quotes what the user wrote.
"""

from collections.abc import Iterator

_OPEN = "([{"
_CLOSE = ")]}"


def _string_end(text: str, i: int) -> int:
    """The index after the string literal that starts at ``text[i]`` (a quote)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        return len(text) if end < 0 else end + 3
    raw = i > 0 and text[i - 1] in "rR"
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" and not raw else 1
    return j + 1


def _scan(text: str) -> Iterator[tuple[int, int]]:
    """``(index, bracket depth after it)`` of each character outside string literals."""
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        depth += (c in _OPEN) - (c in _CLOSE)
        yield i, depth
        i += 1


def _top_level(text: str) -> tuple[list[int], bool]:
    """The offsets of the ``&&`` outside brackets and strings, and whether ``||`` or ``?``
    also appears there (which bind looser: then ``&&`` does not join the whole)."""
    cuts: list[int] = []
    looser = False
    after = 0  # the second "&" of a cut is not the start of another
    for i, depth in _scan(text):
        if depth or i < after:
            continue
        if text.startswith("&&", i):
            cuts.append(i)
            after = i + 2
        elif text.startswith("||", i) or text[i] == "?":
            looser = True
    return cuts, looser


def _unwrapped(text: str) -> str | None:
    """``text`` without the parentheses around all of it, or None when it has none."""
    if not (text.startswith("(") and text.endswith(")")):
        return None
    for i, depth in _scan(text):
        if depth == 0 and i < len(text) - 1:
            return None  # "(a) && (b)": the first parenthesis closes early
    return text[1:-1].strip()


def split_conjuncts(expression: str) -> list[str]:
    """The clauses of ``expression`` joined by a top-level ``&&``, in order, each as written
    (outer parentheses removed); the whole expression when it is no such conjunction."""
    text = expression.strip()
    inner = _unwrapped(text)
    if inner is not None:
        return split_conjuncts(inner)
    cuts, looser = _top_level(text)
    if not cuts or looser:
        return [text]
    bounds = [0, *(c + 2 for c in cuts)]
    ends = [*cuts, len(text)]
    parts: list[str] = []
    for start, end in zip(bounds, ends, strict=True):
        parts += split_conjuncts(text[start:end])
    return parts
