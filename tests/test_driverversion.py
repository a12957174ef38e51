"""The NVIDIA driver floor of ComputeDomains (570.158.01), compared as Kubernetes'
version.ParseGeneric reads versions, as NVIDIA's kubelet plugin compares them."""

import pytest

from driver.common.driverversion import IMEX_DNS_NAMES_FLOOR, DriverTooOld, parse, require_floor
from driver.common.errors import PermanentError


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("570.158.01", (570, 158, 1)),
        ("580.95.05", (580, 95, 5)),
        ("570.172", (570, 172, 0)),
        (" 575.51.03\n", (575, 51, 3)),
        ("v590.1.2-beta", (590, 1, 2)),
    ],
)
def test_versions_parse_as_generic_versions(text: str, parsed: tuple[int, int, int]) -> None:
    assert parse(text) == parsed


@pytest.mark.parametrize("found", ["570.158.01", "570.158.1", "570.172.08", "580.95.05"])
def test_the_floor_and_above_pass(found: str) -> None:
    require_floor(found)


@pytest.mark.parametrize("found", ["570.153.02", "565.57.01", "550.163.01", "570.86.15"])
def test_below_the_floor_is_one_permanent_line(found: str) -> None:
    with pytest.raises(DriverTooOld) as raised:
        require_floor(found)
    assert isinstance(raised.value, PermanentError)
    message = str(raised.value)
    assert "\n" not in message
    assert found in message and IMEX_DNS_NAMES_FLOOR in message and "upgrade" in message


@pytest.mark.parametrize("text", ["", "R570", "five.hundred"])
def test_a_version_that_is_no_version_is_a_permanent_error(text: str) -> None:
    with pytest.raises(PermanentError, match="not a dotted version"):
        parse(text)
