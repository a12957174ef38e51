"""The oracle binary, built (cached) by tests/e2e/build.py, and one process per session."""

import shutil
from collections.abc import Iterator

import pytest

from tests.oracles.client import Oracle


@pytest.fixture(scope="session")
def oracle() -> Iterator[Oracle]:
    if shutil.which("go") is None:
        pytest.skip("go not found on PATH: the reference oracle is built from Go modules")
    from tests.e2e.build import build_oracles

    with Oracle(build_oracles()) as process:
        yield process
