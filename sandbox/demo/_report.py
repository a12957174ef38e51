"""Plain-text tables and headings for the demo's report (pure)."""

from collections.abc import Iterable, Sequence


def heading(number: int, title: str) -> str:
    return f"\n== {number}. {title}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is never padded."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def short_list(items: Sequence[str], limit: int = 6) -> str:
    """``a, b, c`` or ``a, b, c, … (+5 more)``."""
    if len(items) <= limit:
        return ", ".join(items) or "-"
    return ", ".join(items[:limit]) + f", … (+{len(items) - limit} more)"
