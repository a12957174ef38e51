"""Structured logging: every record renders as ``key=value`` pairs.

Call sites pass their fields through ``extra`` (or use :func:`kv`), so a line
about a claim always carries ``claim_uid``, ``claim_namespace`` and ``claim_name``.
``--log-format json`` gives the same fields as one JSON object a line. Times are
RFC 3339 in UTC with milliseconds (``2026-01-02T03:04:05.678Z``): unambiguous across
nodes whatever their time zone, and what log pipelines parse without a hint.
"""

import functools
import json
import logging
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


_NEEDS_QUOTES = re.compile(r'[ ="\n\t]')


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or _NEEDS_QUOTES.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


@functools.lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def timestamp(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    # Rounded to the microsecond first, as datetime does; the date part changes once a
    # second, and a busy node logs many lines within one.
    seconds = int(created)
    seconds, micros = divmod(seconds * 1_000_000 + round((created - seconds) * 1e6), 1_000_000)
    return f"{_second(seconds)}.{micros // 1000:03d}Z"


def _fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "time": timestamp(record.created),
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
        fields["exc"] = formatter.formatException(record.exc_info)
    return fields


class KeyValueFormatter(logging.Formatter):
    """``time=… level=… logger=… msg=… key=value …`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_quote(v)}" for k, v in _fields(self, record).items())


class JsonFormatter(logging.Formatter):
    """The same fields as one JSON object per line, for log pipelines that parse JSON."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(self, record), default=str)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = {"kv": KeyValueFormatter, "json": JsonFormatter}


def kv(**fields: Any) -> Mapping[str, Any]:
    """Fields for ``extra=``: ``log.info("prepared", extra=kv(claim_uid=uid))``."""
    return fields


def setup(level: str = "INFO", fmt: str = "kv") -> None:
    """Route the root logger to stderr, one record a line, key=value or JSON (idempotent)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler.formatter, (KeyValueFormatter, JsonFormatter)):
            return
    # No line shows where a call was made, or its thread or process: do not compute them
    # for every record (the "Optimization" section of Python's logging HOWTO).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATS[fmt]())
    root.addHandler(handler)
    root.setLevel(level.upper())
