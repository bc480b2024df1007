"""safeio's additions for the cache tier (open_or_create, read_small, lstat_at, rmtree_at, write_atomic's
owner): each against what a second user plants, as that user (runuser) where the rule concerns root."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess

import pytest

from slurm_tune import safeio
from slurm_tune.safeio import UnsafePathError

ALICE = "stune-alice"


@pytest.fixture
def alice():
    from stune_dev.devcluster import ensure_unix_users

    ensure_unix_users()
    return pwd.getpwnam(ALICE).pw_uid


def as_alice(*argv):
    subprocess.run(["runuser", "-u", ALICE, "--", *argv], check=True, timeout=30)


@pytest.fixture
def alices_dir(shared_tmp, alice):
    d = shared_tmp / "alices"
    d.mkdir()
    os.chown(d, alice, -1)
    return d


def test_open_or_create_refuses_what_a_user_planted_and_never_changes_it(alices_dir, alice, shared_tmp):
    target = shared_tmp / "root-file"
    target.write_text("root's")
    target.chmod(0o666)  # linkable by alice under protected_hardlinks
    as_alice("ln", str(target), str(alices_dir / "hard"))
    as_alice("mkfifo", str(alices_dir / "fifo"))
    as_alice("ln", "-s", str(target), str(alices_dir / "sym"))
    as_alice("mkdir", str(alices_dir / "dir"))
    dfd = os.open(alices_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, words in (
            ("hard", "hard links"),
            ("fifo", "not a regular file"),
            ("sym", "symbolic link"),
            ("dir", "not a regular file"),
        ):
            with pytest.raises(UnsafePathError, match=words):
                os.close(safeio.open_or_create(name, dfd, owner=alice))  # the FIFO must not block
        fd = safeio.open_or_create("new", dfd, owner=alice)
        st = os.fstat(fd)
        os.close(fd)
        assert (st.st_uid, st.st_nlink, stat.S_ISREG(st.st_mode)) == (alice, 1, True)
        os.close(safeio.open_or_create("new", dfd, owner=alice))  # alice's own: accepted again
        as_alice("touch", str(alices_dir / "mine"))
        with pytest.raises(UnsafePathError, match="expected uid 0"):
            safeio.open_or_create("mine", dfd, owner=0)
    finally:
        os.close(dfd)
    st = target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), target.read_text()) == (0, 0o666, "root's")


def test_write_atomic_for_a_user_hands_over_only_its_own_temporary(alices_dir, alice, shared_tmp):
    target = shared_tmp / "root-file"
    target.write_text("root's")
    target.chmod(0o666)
    dfd = os.open(alices_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        as_alice("ln", str(target), str(alices_dir / "row"))  # the name root will replace
        safeio.write_atomic("row", "12 ready\n", dir_fd=dfd, owner=alice)
    finally:
        os.close(dfd)
    row = alices_dir / "row"
    assert row.read_text() == "12 ready\n" and row.stat().st_uid == alice and row.stat().st_nlink == 1
    assert target.read_text() == "root's" and target.stat().st_uid == 0
    assert [p.name for p in alices_dir.iterdir()] == ["row"]


def test_read_small_returns_none_for_anything_but_a_small_trusted_file(alices_dir, alice):
    as_alice("mkfifo", str(alices_dir / "fifo"))
    as_alice("sh", "-c", f"printf 'x%.0s' $(seq 100) > {alices_dir}/big; echo ok > {alices_dir}/small")
    dfd = os.open(alices_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert safeio.read_small("fifo", dfd) is None
        assert safeio.read_small("big", dfd, limit=50) is None
        assert safeio.read_small("missing", dfd) is None
        assert safeio.read_small("small", dfd) == b"ok\n"
        assert safeio.read_small("small", dfd, owner=0) is None
        assert safeio.lstat_at("missing", dfd) is None and safeio.lstat_at("fifo", dfd) is not None
    finally:
        os.close(dfd)


def test_rmtree_at_removes_a_read_only_tree_as_its_owner_without_following_links(alices_dir, shared_tmp):
    outside = shared_tmp / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    script = f"""
import os
from slurm_tune.safeio import rmtree_at
os.makedirs("{alices_dir}/t/a/b")
open("{alices_dir}/t/a/b/f", "w").close()
os.symlink("{outside}", "{alices_dir}/t/a/link")
for p in ("{alices_dir}/t/a/b", "{alices_dir}/t/a", "{alices_dir}/t"):
    os.chmod(p, 0o555)
fd = os.open("{alices_dir}", os.O_RDONLY | os.O_DIRECTORY)
rmtree_at("t", fd)
print(os.listdir("{alices_dir}"))
"""
    import sys

    out = subprocess.run(
        ["runuser", "-u", ALICE, "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert (outside / "keep").read_text() == "keep"
