"""Our block of the hosts file: replaced in place, every other line kept, never growing on
rewrites (NVIDIA's daemon appends a separator on each), written atomically where it can be."""

import errno
import os
from pathlib import Path

import pytest

from cluster.imexdaemon import hostsfile
from cluster.imexdaemon.hostsfile import BEGIN, END, merge
from driver.common import fsutil
from driver.common.errors import RetryableError

# What the kubelet writes into a pod's /etc/hosts (the pod's own line last).
KUBELET = (
    "# Kubernetes-managed hosts file.\n"
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "10.1.2.3\tcomputedomain-daemon-5bdf4a2c-x7k2p\n"
)
TWO = {"10.0.0.1": "compute-domain-daemon-0000", "10.0.0.2": "compute-domain-daemon-0001"}
ONE = {"10.0.0.2": "compute-domain-daemon-0001"}


def test_the_block_is_appended_below_the_kubelets_lines() -> None:
    assert merge(KUBELET, TWO) == KUBELET + (
        f"{BEGIN}\n"
        "10.0.0.1\tcompute-domain-daemon-0000\n"
        "10.0.0.2\tcompute-domain-daemon-0001\n"
        f"{END}\n"
    )


def test_a_rewrite_replaces_the_block_where_it_stands() -> None:
    before = merge("127.0.0.1 localhost\n", TWO) + "10.9.9.9 added-later\n"
    after = merge(before, ONE)
    assert after.splitlines() == [
        "127.0.0.1 localhost",
        BEGIN,
        "10.0.0.2\tcompute-domain-daemon-0001",
        END,
        "10.9.9.9 added-later",
    ]


def test_rewrites_do_not_grow_the_file() -> None:
    text = KUBELET
    sizes = set()
    for round_ in range(200):
        text = merge(text, TWO if round_ % 2 else ONE)
        sizes.add(len(text))
    assert sizes == {len(merge(KUBELET, ONE)), len(merge(KUBELET, TWO))}
    assert merge(text, TWO) == merge(KUBELET, TWO)


def test_nvidias_separators_and_stale_lines_of_our_names_go() -> None:
    # What NVIDIA's daemon leaves after three rewrites: a separator each time, and the last map.
    nvidia = (
        KUBELET
        + "# Compute Domain Daemon mappings\n" * 3
        + "10.0.0.8\tcompute-domain-daemon-0000\n"
    )
    assert merge(nvidia, ONE) == merge(KUBELET, ONE)


def test_an_empty_mapping_removes_the_block() -> None:
    assert merge(merge(KUBELET, TWO), {}) == KUBELET


def test_an_unterminated_block_keeps_the_lines_that_are_not_ours() -> None:
    broken = f"{KUBELET}{BEGIN}\n10.0.0.1\tcompute-domain-daemon-0000\n10.5.5.5 someone-else\n"
    assert merge(broken, ONE).splitlines() == [
        *KUBELET.splitlines(),
        BEGIN,
        "10.0.0.2\tcompute-domain-daemon-0001",
        END,
        "10.5.5.5 someone-else",
    ]


def test_the_write_is_atomic_and_keeps_the_files_mode(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(KUBELET)
    hosts.chmod(0o640)
    inode = hosts.stat().st_ino
    assert hostsfile.write(hosts, TWO) is True
    assert hosts.read_text() == merge(KUBELET, TWO)
    assert hosts.stat().st_ino != inode  # renamed over, never half-written
    assert hosts.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


def test_an_unchanged_mapping_writes_nothing(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(merge(KUBELET, TWO))
    before = hosts.stat()
    assert hostsfile.write(hosts, dict(reversed(TWO.items()))) is False
    assert hosts.stat().st_ino == before.st_ino and hosts.stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EXDEV, errno.EROFS])
def test_a_mounted_hosts_file_is_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(merge(KUBELET, TWO) + "# a long trailing comment " * 10 + "\n")
    inode = hosts.stat().st_ino

    def cannot_rename(path: Path, content: bytes | str, **_: object) -> None:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(fsutil, "write_atomic", cannot_rename)
    hostsfile.write(hosts, ONE)
    assert hosts.stat().st_ino == inode  # the kubelet's mounted file itself
    assert hosts.read_text() == merge(hosts.read_text(), ONE)
    assert "compute-domain-daemon-0000" not in hosts.read_text()


def test_another_write_failure_is_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(KUBELET)

    def full(path: Path, content: bytes | str, **_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(fsutil, "write_atomic", full)
    with pytest.raises(RetryableError, match="No space left"):
        hostsfile.write(hosts, ONE)


def test_a_missing_hosts_file_is_created(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hostsfile.write(hosts, ONE)
    assert hosts.read_text() == merge("", ONE)
