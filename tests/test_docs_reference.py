"""docs/reference.md's tables are generated from their sources; this fails when the file
and the sources disagree, with the diff and the command that fixes it."""

import difflib
from dataclasses import replace

import pytest

from tests import docs_reference


def test_the_reference_is_what_its_sources_say() -> None:
    current = docs_reference.REFERENCE.read_text()
    wanted = docs_reference.regenerate(current)
    diff = "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            "docs/reference.md",
            "generated",
        )
    )
    assert not diff, f"docs/reference.md is stale; run: {docs_reference.FIX}\n{diff}"


def test_a_new_flag_changes_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli import flagtable, plugin

    extra = replace(flagtable.BY_NAME["--cdi-root"], name="--new-root")
    monkeypatch.setattr(flagtable, "FLAGS", (*flagtable.FLAGS, extra))
    monkeypatch.setattr(plugin, "FLAG_NAMES", (*plugin.FLAG_NAMES, "--new-root"))
    assert "| `--new-root` | kubelet-plugin | `GPU_DRA_NEW_ROOT` |" in docs_reference.flags()


def test_every_section_is_in_the_file_and_generated() -> None:
    text = docs_reference.REFERENCE.read_text()
    for name, build in docs_reference.SECTIONS.items():
        begin, end = docs_reference._markers(name)
        body = text[text.index(begin) + len(begin) : text.index(end)]
        assert body.strip() == build().strip(), name
        assert body.count("\n|") >= 3, name  # a table, not an empty section


def test_a_missing_section_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(ValueError, match="no generated section 'flags'"):
        docs_reference.regenerate("# Reference\n")


def test_the_tables_cover_their_sources() -> None:
    from cli.flagtable import FLAGS
    from driver.gpu.resourceslice import DRIVER_ATTRIBUTES

    text = docs_reference.REFERENCE.read_text()
    assert all(f"`{flag.name}`" in text for flag in FLAGS)
    assert all(f"`gpu.nvidia.com/{name}`" in text for name in DRIVER_ATTRIBUTES)
    assert "`metrics.port` | integer | `9401`" in text
    assert "`gpu_dra_prepare_requests_total` | counter | `outcome`" in text
