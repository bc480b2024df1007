"""safeio: what root does inside user-writable directories, and what it agrees to load."""

from __future__ import annotations

import os
import pwd

import pytest

from slurm_tune import safeio, trust
from slurm_tune.safeio import UnsafePathError

ALICE = "stune-alice"


def _alice() -> int:
    try:
        return pwd.getpwnam(ALICE).pw_uid
    except KeyError:
        pytest.skip(f"needs the test user {ALICE} (scripts/setup.sh / the cluster fixture make it)")


def test_open_file_refuses_symlink_fifo_hardlink_and_wrong_owner(tmp_path):
    target = tmp_path / "secret"
    target.write_text("root's")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    os.link(target, tmp_path / "hard")
    for name, words in (("link", "symbolic link"), ("fifo", "not a regular file"), ("hard", "hard links")):
        with pytest.raises(UnsafePathError, match=words):
            safeio.open_file(str(tmp_path / name))  # the FIFO must not block
    os.unlink(tmp_path / "hard")
    fd = safeio.open_file(str(target), owner=os.geteuid())
    assert os.read(fd, 100) == b"root's"
    os.close(fd)
    with pytest.raises(UnsafePathError, match="owned by uid"):
        safeio.open_file(str(target), owner=os.geteuid() + 1)
    with pytest.raises(FileNotFoundError):
        safeio.open_file(str(tmp_path / "absent"))


def test_open_dir_refuses_symlink_and_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "d")
    (tmp_path / "f").write_text("")
    dfd = safeio.open_dir(str(tmp_path))
    try:
        os.close(safeio.open_dir("d", dfd))
        for name in ("l", "f"):
            with pytest.raises(UnsafePathError, match="not a directory"):
                safeio.open_dir(name, dfd)
    finally:
        os.close(dfd)


def test_create_exclusive_never_reuses_a_planted_name(tmp_path):
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "planted").symlink_to(tmp_path / "victim")
    with pytest.raises(FileExistsError):
        safeio.create_exclusive(str(tmp_path / "planted"))
    assert (tmp_path / "victim").read_text() == "keep"
    fd = safeio.create_exclusive(str(tmp_path / "new"), mode=0o640)
    os.close(fd)
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_read_bounded():
    r, w = os.pipe()
    os.write(w, b"x" * 10)
    os.close(w)
    assert safeio.read_bounded(r, 10) == b"x" * 10
    r2, w2 = os.pipe()
    os.write(w2, b"x" * 11)
    os.close(w2)
    assert safeio.read_bounded(r2, 10) is None
    os.close(r)
    os.close(r2)


def test_write_atomic_replaces_and_ignores_planted_temporaries(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    # every predictable temporary name a user could plant points at the victim
    for pid in (os.getpid(),):
        (tmp_path / f".state.json.{pid}.tmp").symlink_to(victim)
    safeio.write_atomic(str(path), "new", mode=0o600)
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o777 == 0o600
    assert victim.read_text() == "keep"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_untrusted_reason_as_root(tmp_path):
    alice = _alice()
    good = tmp_path / "conf"
    good.mkdir(mode=0o755)
    f = good / "stune"
    f.write_text("X=1\n")
    f.chmod(0o644)
    assert trust.untrusted_reason(str(f), uid=0) is None
    f.chmod(0o646)
    assert "writable by others" in trust.untrusted_reason(str(f), uid=0)
    f.chmod(0o644)
    os.chown(f, alice, -1)
    assert "owned by uid" in trust.untrusted_reason(str(f), uid=0)
    os.chown(f, 0, -1)
    good.chmod(0o775)
    assert "writable by group" in trust.untrusted_reason(str(f), uid=0)
    good.chmod(0o1777)  # sticky and world-writable: fine as an ancestor (like /tmp)...
    assert trust.untrusted_reason(str(f), uid=0) is None
    assert "writable" in trust.untrusted_reason(str(good), uid=0)  # ...not as the thing loaded
    good.chmod(0o755)
    os.chown(good, alice, -1)
    assert "owned by uid" in trust.untrusted_reason(str(f), uid=0)
    os.chown(good, 0, -1)
    # a symlink is judged by where it leads
    evil = tmp_path / "evil"
    evil.mkdir()
    os.chown(evil, alice, -1)
    (evil / "stune").write_text("X=2\n")
    (good / "link").symlink_to(evil / "stune")
    assert "uid" in trust.untrusted_reason(str(good / "link"), uid=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="root's rule")
def test_require_trusted_names_the_path(tmp_path):
    f = tmp_path / "cache.marshal"
    f.write_bytes(b"")
    f.chmod(0o646)
    with pytest.raises(UnsafePathError) as err:
        safeio.require_trusted(str(f))
    assert str(f) in str(err.value) and "\n" not in str(err.value)
    f.chmod(0o644)
    safeio.require_trusted(str(f))


def test_lock_file_is_exclusive_across_processes_and_released_on_exit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "store" / "gpu.lock"
    probe = (
        "import sys\nfrom slurm_tune import safeio\n"
        "try:\n    safeio.LockFile(sys.argv[1], blocking=False, holder='sweep').__enter__()\n"
        "except safeio.LockBusy as exc:\n    print(exc); sys.exit(3)\n"
    )
    with safeio.LockFile(str(path), blocking=False, holder="sweep") as held:
        assert held.fd >= 0 and path.is_file()
        busy = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True)
        assert busy.returncode == 3
        assert busy.stdout.strip() == f"another sweep is running (lock {path})"
        other = os.open(path, os.O_RDONLY)  # another open file description is refused too
        try:
            assert not safeio.lock_fd(other, blocking=False)
        finally:
            os.close(other)
    assert held.fd == -1
    free = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True)
    assert free.returncode == 0


def test_lock_file_never_follows_a_symlink(tmp_path):
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "x.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        safeio.LockFile(str(tmp_path / "x.lock")).__enter__()


def test_open_append_refuses_what_a_user_could_plant(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    (tmp_path / "link.log").symlink_to(victim)
    os.link(victim, tmp_path / "hard.log")
    os.mkfifo(tmp_path / "fifo.log")
    os.mkfifo(tmp_path / "read.log")
    reader = os.open(tmp_path / "read.log", os.O_RDONLY | os.O_NONBLOCK)
    try:
        for name, problem in (
            ("link.log", "symbolic link"),
            ("hard.log", "hard links"),
            ("read.log", "not a regular file"),
        ):
            with pytest.raises(UnsafePathError, match=problem):
                safeio.open_append(str(tmp_path / name))
    finally:
        os.close(reader)
    with pytest.raises(OSError):  # a FIFO nobody reads: ENXIO at once, never a hang
        safeio.open_append(str(tmp_path / "fifo.log"))
    with pytest.raises(FileNotFoundError):
        safeio.open_append(str(tmp_path / "missing.log"), create_mode=None)
    assert victim.read_text() == "root's\n"
    fd = safeio.open_append(str(tmp_path / "new.log"), create_mode=0o640)
    try:
        os.write(fd, b"one\n")
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
    fd = safeio.open_append(str(tmp_path / "new.log"), create_mode=None)
    try:
        os.write(fd, b"two\n")
    finally:
        os.close(fd)
    assert (tmp_path / "new.log").read_text() == "one\ntwo\n"
    assert (tmp_path / "new.log").stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
