"""The copy itself (slurm_tune/stage/copy.py): big files cut into ranges that threads copy with
copy_file_range, the sendfile and read/write fallbacks, small files in `cp` batches, and a source changed
under the copy. The tier around it (admission,
publish, eviction) is in test_stage_tier.py."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until
from test_stage_tier import make_tree, new_tier, open_up, tree_digest

from slurm_tune.stage import copy as copymod
from slurm_tune.stage import fresh
from slurm_tune.stage.errors import SourceError
from slurm_tune.stage.spec import StageRequest
from slurm_tune.stage.stager import stage


def _big(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        for i in range(size // 65536 + 1):
            fh.write(i.to_bytes(8, "little") * 8192)
        fh.truncate(size)
    return path


@pytest.fixture
def small_split(monkeypatch):
    """Big-file ranges at test sizes: files of 4 MiB or more are cut, into MiB ranges."""
    monkeypatch.setattr(copymod, "SPLIT", 4 << 20)


def test_a_big_file_is_copied_in_ranges_by_several_workers_and_published_read_only(shared_tmp, small_split):
    src = _big(shared_tmp / "weights.bin", (13 << 20) + 12345)
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    source = fresh.inspect(str(src))
    work = copymod._Copier(str(shared_tmp), str(shared_tmp / "out"), 4, "t")
    (shared_tmp / "out").mkdir()
    work.plan([("", src.name, source.st.st_size, source.st.st_mode)])
    ranges = list(work.work)
    assert len(ranges) == 4 and ranges[0][3] == 0 and ranges[-1][4] == source.st.st_size
    assert all(r[4] - r[3] == 4 << 20 for r in ranges[:-1])  # whole MiBs, the last takes the rest

    dst = shared_tmp / "copy"
    dst.mkdir()
    path = Path(copymod.copy_file(source, str(dst), jobs=4))
    assert path.read_bytes() == src.read_bytes()
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o440, "the source's mode less the write bits"
    assert st.st_mtime_ns == 1_600_000_000_123_456_789


def test_a_tree_with_big_and_small_files_and_links_is_copied_exactly(shared_tmp, small_split):
    tree = make_tree(shared_tmp / "ds", dirs=3, files=40, size=2000)
    _big(tree / "class01" / "shard.bin", 9 << 20)
    os.symlink("../labels.txt", tree / "class02" / "labels")
    os.symlink("/nonexistent/target", tree / "dangling")
    plan = fresh.walk(str(tree))
    dst = shared_tmp / "copy"
    dst.mkdir()
    copymod.copy_tree(str(tree), plan, str(dst), jobs=3)
    assert tree_digest(dst) == tree_digest(tree)
    assert os.readlink(dst / "dangling") == "/nonexistent/target"
    for path in dst.rglob("*"):
        if not path.is_symlink():
            assert not path.stat().st_mode & 0o222, f"{path} is writable"


def test_a_users_umask_does_not_change_the_copys_modes(shared_tmp):
    tree = make_tree(shared_tmp / "ds", dirs=1, files=3)
    for path in tree.rglob("*.bin"):
        path.chmod(0o644)
    dst = shared_tmp / "copy"
    dst.mkdir()
    old = os.umask(0o077)
    try:
        copymod.copy_tree(str(tree), fresh.walk(str(tree)), str(dst), jobs=2)
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in dst.rglob("*.bin")}
    assert modes == {0o444}


@pytest.mark.parametrize(
    "broken, expect",
    [
        ({"copy_file_range": errno.EXDEV}, "sendfile"),  # a source on another filesystem (Linux >= 5.19)
        (
            {"copy_file_range": errno.ENOSYS, "sendfile": errno.EINVAL},
            "pread",
        ),  # an old kernel, odd filesystem
    ],
)
def test_without_copy_file_range_the_copy_falls_back_once_for_all_files(
    shared_tmp, monkeypatch, small_split, broken, expect
):
    tree = make_tree(shared_tmp / "ds", dirs=2, files=30, size=5000)
    _big(tree / "big.bin", 6 << 20)
    calls = {"copy_file_range": 0, "sendfile": 0, "pread": 0}

    def counted(name, real):
        def call(*args):
            calls[name] += 1
            if name in broken:
                raise OSError(broken[name], os.strerror(broken[name]))
            return real(*args)

        return call

    for name in calls:
        monkeypatch.setattr(copymod.os, name, counted(name, getattr(os, name)))
    dst = shared_tmp / "copy"
    dst.mkdir()
    copymod.copy_tree(str(tree), fresh.walk(str(tree)), str(dst), jobs=1)
    monkeypatch.undo()
    assert tree_digest(dst) == tree_digest(tree)
    assert calls[expect] > 0
    assert calls["copy_file_range"] == 1, "one refusal, then every later file goes the fallback's way"
    if expect == "pread":
        assert calls["sendfile"] == 1


def test_a_filesystem_whose_copy_file_range_copies_nothing_is_read_and_written(
    shared_tmp, monkeypatch, small_split
):
    """Some filesystems answer copy_file_range with 0 bytes for a file that has data (procfs-like ones)."""
    tree = make_tree(shared_tmp / "ds", dirs=1, files=5, size=3000)
    _big(tree / "big.bin", 5 << 20)
    monkeypatch.setattr(copymod.os, "copy_file_range", lambda *args: 0)
    dst = shared_tmp / "copy"
    dst.mkdir()
    copymod.copy_tree(str(tree), fresh.walk(str(tree)), str(dst), jobs=2)
    monkeypatch.undo()
    assert tree_digest(dst) == tree_digest(tree)


SWAP = """
import os, sys
from slurm_tune.stage import copy, fresh
from slurm_tune.stage.errors import SourceError
src, dst, kind = sys.argv[1:4]
copy.SPLIT = 1 << 20  # big.bin goes through the ranges; the small files through cp
plan = fresh.walk(src)
victim = os.path.join(src, "class00", sys.argv[4])
os.unlink(victim)
if kind == "fifo":
    os.mkfifo(victim)
elif kind == "symlink":
    os.symlink("/etc/shadow", victim)
else:
    os.mkdir(victim)
os.mkdir(dst)
try:
    copy.copy_tree(src, plan, dst, jobs=2)
except SourceError as exc:
    print("SourceError:", exc)
"""


@pytest.mark.parametrize(
    "kind, words",
    [
        ("fifo", "no longer a regular file"),
        ("symlink", "replaced by a symlink"),
        ("directory", "no longer a regular file"),
    ],
)
def test_a_big_source_file_swapped_after_the_walk_is_refused_never_followed_or_waited_on(
    shared_tmp, kind, words
):
    """A symlink planted where the walk saw a file is not followed (to /etc/shadow, as root); a FIFO is not
    waited on for a writer."""
    tree = make_tree(shared_tmp / "ds", dirs=1, files=8)
    _big(tree / "class00" / "big.bin", 2 << 20)
    proc = subprocess.run(
        [sys.executable, "-c", SWAP, str(tree), str(shared_tmp / "copy"), kind, "big.bin"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SourceError:") and words in proc.stdout and "big.bin" in proc.stdout


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_small_source_file_swapped_after_the_walk_is_not_followed_or_waited_on(shared_tmp, kind):
    """The old `cp -P` batches opened a FIFO planted after the walk and waited for a writer forever."""
    tree = make_tree(shared_tmp / "ds", dirs=1, files=8)
    proc = subprocess.run(
        [sys.executable, "-c", SWAP, str(tree), str(shared_tmp / "copy"), kind, "img0003.bin"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    copied = shared_tmp / "copy" / "class00" / "img0003.bin"
    assert stat.S_ISFIFO(copied.lstat().st_mode) if kind == "fifo" else copied.is_symlink()


def test_a_staged_single_big_file_is_a_read_only_copy_of_the_source(shared_tmp, small_split):
    config = new_tier(open_up(shared_tmp) / "tier")
    src = _big(shared_tmp / "model.safetensors", (9 << 20) + 7)
    result = stage(StageRequest(str(src), "M"), config)
    assert result.status == "copied" and Path(result.path).read_bytes() == src.read_bytes()
    assert not Path(result.path).stat().st_mode & 0o222
    with pytest.raises(PermissionError):
        if os.geteuid() != 0:
            with open(result.path, "r+b"):
                pass
        else:
            raise PermissionError  # root ignores modes: the mode bits were checked above


def test_a_source_that_vanishes_mid_copy_is_a_source_error(shared_tmp):
    tree = make_tree(shared_tmp / "ds", dirs=2, files=5)
    plan = fresh.walk(str(tree))
    (tree / "class01" / "img0002.bin").unlink()
    dst = shared_tmp / "copy"
    dst.mkdir()
    with pytest.raises(SourceError, match=r"img0002\.bin"):
        copymod.copy_tree(str(tree), plan, str(dst), jobs=2)


def test_a_worker_has_its_own_process_group_in_the_stagers_session_and_dies_with_its_children(shared_tmp):
    """Killing a worker's group takes its children (tar's decompressor); a session of its own would also be a
    scheduling group of its own where the kernel groups by session (autogroup), taking a share per worker."""
    from slurm_tune.stage import workers

    child_file = shared_tmp / "child"
    with open(shared_tmp / "err", "wb") as errlog:
        proc = workers.spawn(["sh", "-c", f"sleep 60 & echo $! > {child_file}; wait"], None, errlog)
        try:
            wait_until("the worker's child to start", lambda: child_file.exists() and child_file.read_text())
            child = int(child_file.read_text())
            assert os.getpgid(proc.pid) == proc.pid and os.getpgid(child) == proc.pid
            if sys.version_info >= (3, 11):
                assert os.getsid(proc.pid) == os.getsid(0)
        finally:
            workers.kill([proc])
    wait_until("the worker's child to die with it", lambda: not _alive(child), timeout=10, interval=0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
