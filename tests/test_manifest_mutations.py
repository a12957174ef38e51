"""The generator behind the API-server oracle for ``validate`` (tests/manifest_mutations.py):
seeded, so a case found in one run is the same case in the next; its bases valid, so every
refusal comes from a mutation; and every operator reached."""

import json
from collections import Counter

import pytest

from tests import manifest_mutations as mm
from tests.chart_render import render
from tools.validation import Severity, parse_version, validate_sources

CLASSES = [o for o in render(()) if o["kind"] == "DeviceClass"]


def test_same_seed_same_cases_other_seed_other_cases() -> None:
    first = [json.dumps(c.doc, sort_keys=True) for c in mm.generate(7, 300)]
    assert first == [json.dumps(c.doc, sort_keys=True) for c in mm.generate(7, 300)]
    assert first != [json.dumps(c.doc, sort_keys=True) for c in mm.generate(8, 300)]


@pytest.mark.parametrize("version", ["1.34", "1.36"])
@pytest.mark.parametrize("name", mm.BASE_NAMES)
def test_every_base_is_clean(name: str, version: str) -> None:
    # The workloads name the claim and template bases, which are known as a cluster's are.
    known = [*CLASSES, *(mm.base(b) for b in mm.BASE_NAMES if b != name)]
    problems = validate_sources(
        [("base.yaml", json.dumps(mm.base(name)))], version=parse_version(version), known=known
    )
    assert [str(p) for p in problems if p.severity is Severity.ERROR] == []


def test_every_operator_and_rule_is_drawn_and_changes_the_manifest() -> None:
    cases = mm.generate(11, 2000)
    operators = Counter(m.split()[0] for c in cases for m in c.mutations)
    assert set(operators) == set(mm.OPERATORS), operators
    rules = Counter(m.split()[1] for c in cases for m in c.mutations if m.startswith("cross"))
    assert {r.rstrip(":") for r in rules} == {name for name, _, _ in mm.CROSS}
    assert {c.base for c in cases} == set(mm.BASE_NAMES)
    for case in cases:
        # Two mutations may undo each other (a duplicate added, then removed); one never.
        if len(case.mutations) < 2:
            assert (case.doc == mm.base(case.base)) == (not case.mutations), case


def test_workloads_are_mutated_only_where_they_touch_dra() -> None:
    for case in mm.generate(3, 600):
        if case.kind not in ("Pod", "Deployment", "Job"):
            continue
        for mutation in case.mutations:
            path = mutation.split(" ", 2)[1]
            if mutation.startswith(("cross", "label", "unknown")) or path.startswith("metadata"):
                continue
            assert "resourceClaims" in path or ".resources" in path, mutation


def test_limits_are_hit_just_under_at_and_over() -> None:
    grown = [m for c in mm.generate(5, 3000) for m in c.mutations if m.startswith("grow")]
    sizes = Counter(
        int(m.split(": ")[1].split()[0]) - int(m.rsplit("limit ", 1)[1].rstrip(")")) for m in grown
    )
    assert set(sizes) == {-1, 0, 1}
