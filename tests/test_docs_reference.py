"""docs/reference.md's tables are generated from their sources; this fails when the file
and the sources disagree, with the diff and the command that fixes it."""

import difflib
import importlib
import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests import docs_reference

ROOT = docs_reference.ROOT


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
    from drivers.gpu.model.published import DRIVER_ATTRIBUTES

    text = docs_reference.REFERENCE.read_text()
    assert all(f"`{flag.name}`" in text for flag in FLAGS)
    assert all(f"`gpu.nvidia.com/{name}`" in text for name in DRIVER_ATTRIBUTES)
    assert "`metrics.port` | integer | `9401`" in text
    assert "`gpu_dra_prepare_requests_total` | counter | `outcome`" in text


# The documents a user or the chart reads, and the project's own packages they may name.
_DOCUMENTS: tuple[str, ...] = ("README.md", "ARCHITECTURE.md", "docs/*.md", "Dockerfile")
_DOCUMENTS += ("charts/**/*.yaml", "charts/**/*.tpl", "charts/**/*.txt", "Makefile")
_PACKAGES = (
    "api",
    "cli",
    "cluster",
    "driver",
    "drivers",
    "kubeletplugin",
    "sandbox",
    "tests",
    "tools",
)
_DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(_PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
_RUN_MODULE = re.compile(r"python3? -m ([\w.]+)")
_PATH = re.compile(rf"`((?:{'|'.join(_PACKAGES)}|charts|docs)/[^`<>*\s]*)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _documents() -> list[Path]:
    return sorted({p for pattern in _DOCUMENTS for p in ROOT.glob(pattern) if p.is_file()})


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of one (``driver.nvml.backend``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            continue
        value: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_every_module_path_the_docs_and_chart_name_resolves() -> None:
    named: dict[str, str] = {}
    for path in _documents():
        text = path.read_text()
        for match in [*_DOTTED.finditer(text), *_RUN_MODULE.finditer(text)]:
            if match[1].split(".")[0] in _PACKAGES:
                named.setdefault(match[1], str(path.relative_to(ROOT)))
    assert "tests.docs_reference" in named  # the reference names its generator
    broken = {name: where for name, where in named.items() if not _resolves(name)}
    assert not broken, f"module paths that no longer resolve: {broken}"


def test_every_file_path_and_link_the_docs_name_exists() -> None:
    missing = []
    for path in _documents():
        text = path.read_text()
        missing += [
            f"{path.relative_to(ROOT)}: `{m[1]}`"
            for m in _PATH.finditer(text)
            if not (ROOT / m[1]).exists()
        ]
        if path.suffix == ".md":
            for match in _LINK.finditer(text):
                target = match[1]
                if "://" not in target and not (path.parent / target).exists():
                    missing.append(f"{path.relative_to(ROOT)}: link {target}")
    assert not missing, "\n".join(missing)


def test_the_path_check_sees_a_broken_name() -> None:
    assert _resolves("driver.nvml.backend") and _resolves("tests.docs_reference")
    assert not _resolves("driver.nvml.no_such_thing")
    assert not _resolves("kubeletplugin.node")  # moved to drivers.gpu.node
