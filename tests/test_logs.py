"""The two log formats: key=value and JSON, with the same fields and zoned timestamps."""

import json
import logging
import random
import re
from datetime import UTC, datetime

from driver.common.logs import JsonFormatter, KeyValueFormatter, kv, timestamp


def _record(msg: str, **fields: object) -> logging.LogRecord:
    record = logging.getLogger("driver.test").makeRecord(
        "driver.test", logging.WARNING, __file__, 1, msg, (), None, extra=kv(**fields)
    )
    record.created = 1767323045.678  # 2026-01-02T03:04:05.678Z
    return record


def test_timestamps_are_rfc3339_in_utc_with_the_zone() -> None:
    assert timestamp(1767323045.678) == "2026-01-02T03:04:05.678Z"
    parsed = datetime.fromisoformat(timestamp(1767323045.678))
    assert parsed.utcoffset() is not None and parsed.timestamp() == 1767323045.678


def test_key_value_line() -> None:
    line = KeyValueFormatter().format(_record("claim prepared", claim_uid="u-1", note="a b"))
    assert line == (
        'time=2026-01-02T03:04:05.678Z level=warning logger=driver.test msg="claim prepared" '
        'claim_uid=u-1 note="a b"'
    )


def test_json_line_has_the_same_fields() -> None:
    record = _record("claim prepared", claim_uid="u-1", devices=2)
    parsed = json.loads(JsonFormatter().format(record))
    assert parsed == {
        "time": "2026-01-02T03:04:05.678Z",
        "level": "warning",
        "logger": "driver.test",
        "msg": "claim prepared",
        "claim_uid": "u-1",
        "devices": 2,
    }
    assert "\n" not in JsonFormatter().format(_record("two\nlines"))
    kv_line = KeyValueFormatter().format(record)
    assert re.findall(r"(\w+)=", kv_line) == list(parsed)


def test_timestamps_read_as_datetime_formats_them() -> None:
    # The date part is cached per second: every millisecond must still come out as
    # datetime rounds it.
    rng = random.Random(7)
    for _ in range(20_000):
        created = rng.uniform(0, 4e9)
        expected = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        assert timestamp(created) == expected.removesuffix("+00:00") + "Z", created
