"""Kubernetes objects in wire form (the JSON the API server speaks), one copy of each rule.

Every module that handles objects as dicts names them :data:`Obj`; times in them are
RFC 3339 in UTC: ``Time`` in whole seconds, ``MicroTime`` with microseconds.
"""

from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]


def format_time(moment: datetime) -> str:
    """Kubernetes Time: RFC 3339 in whole seconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime | None:
    """A Time or MicroTime as an aware datetime; None when it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
