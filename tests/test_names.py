"""Claim references from the DRA socket: what is accepted before a name becomes a path."""

import uuid
from pathlib import Path

import pytest

from drivers.gpu.flavor import GPU
from kubeletplugin import cdi, names

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def test_a_canonical_uuid_is_a_claim_uid() -> None:
    assert names.is_claim_uid(UID)
    assert names.is_claim_uid(str(uuid.uuid4()))
    assert names.claim_error(UID, "default", "train.job-1") is None


@pytest.mark.parametrize(
    "uid",
    [
        "",
        "x/../../victim/x",
        "../" * 10,
        UID.upper(),  # the same UUID, another file name
        "{" + UID + "}",
        "urn:uuid:" + UID,
        UID.replace("-", ""),
        UID + "\n",
        UID + "/",
        UID[:-1] + "g",
        "a" * 300,  # over NAME_MAX: ENAMETOOLONG if it ever reached the file system
        "\u0660" * 8 + UID[8:],  # Arabic-Indic digits: \d would take them
    ],
)
def test_anything_else_is_not(uid: str) -> None:
    assert not names.is_claim_uid(uid)
    error = names.claim_error(uid, "default", "c")
    assert error is not None and error.startswith("invalid claim uid")
    assert len(error) < 160  # an attacker's string is cut short in errors and logs


@pytest.mark.parametrize(
    ("namespace", "name", "problem"),
    [
        ("", "c", "namespace"),
        ("Default", "c", "namespace"),
        ("../kube-system", "c", "namespace"),
        ("a" * 64, "c", "namespace"),
        ("a.b", "c", "namespace"),  # a label, not a subdomain
        ("default", "", "name"),
        ("default", "../../api/v1/secrets", "name"),
        ("default", "c/x", "name"),
        ("default", "c%2Fx", "name"),
        ("default", "c?watch=true", "name"),
        ("default", "a" * 254, "name"),
        ("default", "-c", "name"),
    ],
)
def test_namespace_and_name_follow_the_dns_rules(namespace: str, name: str, problem: str) -> None:
    error = names.claim_error(UID, namespace, name)
    assert error is not None and error.startswith(f"invalid claim {problem}")


def test_within_accepts_paths_in_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    root.mkdir()
    assert names.within(root, root / "spec.json") == root / "spec.json"
    (root / "sub").mkdir()
    assert names.within(root, root / "sub" / "x") == root / "sub" / "x"
    # A root reached through a symlink is still the root.
    (tmp_path / "link").symlink_to(root)
    assert names.within(tmp_path / "link", tmp_path / "link" / "spec.json")


def test_within_refuses_paths_that_leave_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    (root / "claim_x").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "escape").symlink_to(tmp_path / "elsewhere")
    for path in (
        root / "claim_x/../../victim/x.json",
        root / "..",
        root / "escape" / "spec.json",  # a symlinked directory out of the root
        tmp_path / "other" / "spec.json",
        Path("/etc/passwd"),
    ):
        with pytest.raises(names.PathOutsideRootError):
            names.within(root, path)


def test_a_spec_path_never_leaves_the_cdi_root(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    (root / "k8s.gpu.nvidia.com-claim_x").mkdir(parents=True)
    victim = tmp_path / "victim" / "x.json"
    victim.parent.mkdir()
    victim.write_text("{}")
    with pytest.raises(names.PathOutsideRootError):
        cdi.spec_path(root, "x/../../victim/x", GPU)
    assert victim.exists()
    assert cdi.spec_path(root, UID, GPU).parent == root
