"""Manifest parsing for explain: every shape users paste in, and clear errors for the rest."""

import pytest

from tools.allocation.inputs import InputError, parse_text

SLICE_A = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: a\n"
SLICE_B = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: b\n"


def names(text: str) -> list[str]:
    return [o["metadata"]["name"] for o in parse_text(text, "f.yaml")]


def test_multi_document_yaml_with_empty_documents() -> None:
    assert names(f"---\n{SLICE_A}---\n---\n{SLICE_B}") == ["a", "b"]


def test_documents_pasted_together_without_separator_are_all_kept() -> None:
    # Plain YAML would keep only the last value of the repeated keys: object "a" lost.
    assert names(SLICE_A + SLICE_B) == ["a", "b"]


def test_lists_are_flattened_in_yaml_and_json() -> None:
    listed = (
        '{"apiVersion": "v1", "kind": "List", "items": [{"kind": "X", "metadata": {"name": "a"}}]}'
    )
    assert names(listed) == ["a"]
    as_yaml = "kind: ResourceSliceList\nitems:\n- kind: ResourceSlice\n  metadata: {name: b}\n"
    assert names(as_yaml) == ["b"]


def test_json_objects_in_a_row_and_json_arrays() -> None:
    one = '{"kind": "X", "metadata": {"name": "a"}}'
    two = '{"kind": "X", "metadata": {"name": "b"}}'
    assert names(f"{one}\n{two}\n") == ["a", "b"]
    assert names(f"[{one}, {two}]") == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: X\nmetadata:\n  name: a\n  name: b\n",
            "f.yaml: line 4, column 3: invalid YAML: duplicate key 'name'",
        ),
        ('{"kind": "X",', "f.yaml: line 1, column 14: invalid JSON"),
        ("- 1\n- 2\n", "f.yaml: document #1 is not an object"),
        ("metadata: {name: a}\n", "f.yaml: document #1 has no kind"),
    ],
)
def test_errors_name_the_file_and_position(text: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_text(text, "f.yaml")
    assert message in str(caught.value)
