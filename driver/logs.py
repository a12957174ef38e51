"""Structured logging: every record renders as ``key=value`` pairs.

Call sites pass their fields through ``extra`` (or use :func:`kv`), so a line
about a claim always carries ``claim_uid``, ``claim_namespace`` and ``claim_name``.
"""

import logging
import sys
from collections.abc import Mapping
from typing import Any

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    """``time=… level=… logger=… msg=… key=value …`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(
            (key, value)
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        )
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def kv(**fields: Any) -> Mapping[str, Any]:
    """Fields for ``extra=``: ``log.info("prepared", extra=kv(claim_uid=uid))``."""
    return fields


def setup(level: str = "INFO") -> None:
    """Route the root logger to stderr in key=value form (idempotent)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler.formatter, KeyValueFormatter):
            return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
