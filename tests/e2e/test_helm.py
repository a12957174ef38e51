"""The chart against the real helm, built from its Go module at the pinned version: `make
test` runs these where a helm binary exists; here the e2e tier builds it first."""

import pytest

from tests.e2e import build
from tests.test_chart import (
    test_helm_binary_lint_strict_is_clean,
    test_helm_template_renders_what_the_tests_render,
)

__all__ = [
    "test_helm_binary_lint_strict_is_clean",
    "test_helm_template_renders_what_the_tests_render",
]

pytestmark = pytest.mark.timeout(1200)  # a cold helm build takes minutes


@pytest.fixture
def helm() -> str:
    return str(build.build_helm())
