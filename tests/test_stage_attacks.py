"""Root's paths through the cache tier, attacked by a second unprivileged user (issue #10, staging tier).

Each attack is made the way a user on the node would make it: as stune-alice or stune-bob, in a forked child
that dropped root (os.setresuid), or through `runuser`. Root then does what it does for real: `stune-stage
gc`, `init`, `status` and the epilog's `release --epilog`, in-process or as the command. Every command that
could hang on a planted FIFO runs under a timeout."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stage_tier import ensure_users, make_tree, new_tier, open_up, tree_digest

from slurm_tune.stage import admin
from slurm_tune.stage.errors import TierUnavailable
from slurm_tune.stage.gc import gc
from slurm_tune.stage.layout import ROW_MAX_DIGITS, parse_row, source_key
from slurm_tune.stage.spec import StageRequest
from slurm_tune.stage.stager import stage
from slurm_tune.stage.tier import Tier, TierConfig

QUARANTINE = ".quarantine"

STAGE = str(Path(sys.executable).parent / "stune-stage")
ALICE, BOB = "stune-alice", "stune-bob"


@pytest.fixture
def users():
    ensure_users()
    return {u: pwd.getpwnam(u) for u in (ALICE, BOB)}


def as_user(user: str, fn, *args):
    """Run fn(*args) in a forked child that has dropped root for `user` (real, effective and saved ids);
    returns fn's result (repr-able values: the child prints it) or raises AssertionError with its traceback."""
    pw = pwd.getpwnam(user)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker
        os.close(rfd)
        code = 0
        try:
            os.setgroups([])
            os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
            os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
            os.environ["HOME"] = pw.pw_dir
            out = repr(fn(*args))
        except BaseException:
            out, code = "!" + traceback.format_exc(), 1
        os.write(wfd, out.encode())
        os._exit(code)
    os.close(wfd)
    chunks = []
    while True:
        data = os.read(rfd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    if os.waitstatus_to_exitcode(status) != 0 or text.startswith("!"):
        raise AssertionError(f"as {user}: {text}")
    import ast

    return ast.literal_eval(text) if text else None


def _stage_as(config: TierConfig, source: Path, job: str | None = None, name: str = "DS", **kw):
    """Stage as the calling (already dropped) user; returns (status, path, entry)."""
    r = stage(StageRequest(str(source), name), config, job_id=job, **kw)
    return r.status, r.path, r.entry


def stage_as(user: str, config: TierConfig, source: Path, job: str | None = None, **kw):
    return as_user(user, _stage_as, config, source, job, "DS", **kw)


def cli(*args, timeout=60, user=None, check=True, env=None):
    argv = [STAGE, *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {}))
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


class _NoSlurm:
    def jobs(self):
        return []


@pytest.fixture
def tier(shared_tmp):
    return new_tier(open_up(shared_tmp) / "tier")


@pytest.fixture
def dataset(shared_tmp):
    return make_tree(open_up(shared_tmp) / "ds", dirs=2, files=10, size=2000)


@pytest.fixture
def root_file(shared_tmp):
    """A root-owned file a user may hard-link (protected_hardlinks lets a user link a file it can read and
    write: a world-writable root file, as some sites have). Root must never chown, truncate or write it."""
    path = shared_tmp / "root-owned.conf"
    path.write_text("root's own\n")
    os.chown(path, 0, 0)
    path.chmod(0o666)
    return path


def _unchanged(path: Path, want_text="root's own\n"):
    st = path.lstat()
    assert (st.st_uid, st.st_gid) == (0, 0), f"{path} was chowned to uid {st.st_uid}"
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert path.read_text() == want_text, f"{path} was written"


# ---- hard links planted where root creates lock, hold and ledger files ------------------------------------


def test_gc_and_the_epilog_never_chown_or_write_a_hard_link_planted_as_a_lock(
    tier, dataset, users, root_file
):
    status, _path, entry = stage_as(ALICE, tier, dataset, job="7")
    assert status == "copied"
    ns = Path(tier.root, ALICE)
    key = source_key(str(dataset))
    orphan = "f" * 32  # a lock of a source with no entry: gc's lock cleanup takes it before unlinking

    def plant():
        os.unlink(ns / "locks" / key)
        os.link(root_file, ns / "locks" / key)
        os.link(root_file, ns / "locks" / orphan)
        uid = os.getuid()
        # the names root's ledger and fallback writes used to create without O_EXCL
        for pid in range(os.getppid() - 2, os.getppid() + 3):
            os.link(root_file, Path(tier.root, ".ledger", f".{uid}.{entry}.{pid}.tmp"))

    as_user(ALICE, plant)
    Path(tier.root, ".ledger", f"{users[ALICE].pw_uid}.{entry}").unlink()  # gc will write this row for alice
    with Tier(tier) as t:
        report = gc(t, slurm=_NoSlurm())
        assert f"{ALICE}/{entry}: missing row" in report.ledger_fixed
        assert sorted(r.split(" ")[0] for r in report.locks_removed) == sorted(
            [f"{ALICE}/locks/{key}", f"{ALICE}/locks/{orphan}"]
        )
    cli(
        "release",
        "--epilog",
        "--path",
        tier.root,
        "--job",
        "7",
        env={"SLURM_JOB_UID": str(users[ALICE].pw_uid), "SLURM_JOB_USER": ALICE},
    )
    _unchanged(root_file)
    row = Path(tier.root, ".ledger", f"{users[ALICE].pw_uid}.{entry}")
    assert row.stat().st_uid == users[ALICE].pw_uid and row.stat().st_nlink == 1
    assert root_file.stat().st_nlink > 1, "root unlinked its own names only; alice's temporaries stay"
    # alice can stage again: her lock file is made afresh, hers, with O_EXCL
    assert stage_as(ALICE, tier, dataset, job="8")[0] == "hit"
    lock = ns / "locks" / key
    assert lock.stat().st_uid == users[ALICE].pw_uid and lock.stat().st_nlink == 1


def test_a_lock_file_linked_to_a_root_file_makes_the_stager_fall_back_not_write(
    tier, dataset, users, root_file
):
    assert stage_as(ALICE, tier, dataset)[0] == "copied"
    key = source_key(str(dataset))

    def relink_and_stage():
        lock = Path(tier.root, ALICE, "locks", key)
        lock.unlink()
        os.link(root_file, lock)
        try:
            stage(StageRequest(str(dataset), "DS"), tier)
        except TierUnavailable as exc:
            return exc.kind, str(exc)
        return None

    kind, message = as_user(ALICE, relink_and_stage)
    assert kind == "unsafe" and "hard links" in message and key in message
    _unchanged(root_file)


def test_root_creating_a_namespace_or_lock_for_a_user_never_chowns_what_is_already_there(
    tier, dataset, users, root_file
):
    """Root (gc's pending-row check, the epilog) creates lock files for users through O_EXCL only."""
    assert stage_as(ALICE, tier, dataset)[0] == "copied"
    key = "a" * 32
    as_user(ALICE, lambda: os.link(root_file, Path(tier.root, ALICE, "locks", key)))
    with Tier(tier) as t, t.namespace(users[ALICE].pw_uid, ALICE, create=False) as ns:
        with pytest.raises(TierUnavailable, match="hard links"):
            ns.lock(key, blocking=False)
        fd = ns.lock("b" * 32, blocking=False)  # a fresh one: root made it, then gave its own file away
        os.close(fd)
    _unchanged(root_file)
    assert Path(tier.root, ALICE, "locks", "b" * 32).stat().st_uid == users[ALICE].pw_uid


# ---- FIFOs -------------------------------------------------------------------------------------------------


def test_fifos_planted_as_lock_hold_ledger_and_stamp_files_never_hang_root(tier, dataset, users):
    status, _path, entry = stage_as(ALICE, tier, dataset, job="11")
    assert status == "copied"
    ns = Path(tier.root, ALICE)
    key = source_key(str(dataset))
    uid = users[ALICE].pw_uid

    def plant():
        os.unlink(ns / "locks" / key)
        os.mkfifo(ns / "locks" / key)
        os.mkfifo(ns / "locks" / ("c" * 32))
        os.mkdir(ns / "holds" / "12")
        os.mkfifo(ns / "holds" / "12" / entry)
        os.unlink(Path(tier.root, ".ledger", f"{uid}.{entry}"))
        os.mkfifo(Path(tier.root, ".ledger", f"{uid}.{entry}"))
        os.mkfifo(Path(tier.root, ".ledger", f".{uid}.{entry}.1.tmp"))

    as_user(ALICE, plant)
    # the epilog (root) and gc (root): each must finish, whatever alice planted
    cli(
        "release",
        "--epilog",
        "--path",
        tier.root,
        "--job",
        "11",
        timeout=30,
        env={"SLURM_JOB_UID": str(uid), "SLURM_JOB_USER": ALICE},
    )
    cli("status", "--path", tier.root, timeout=30, check=False)
    cli("ls", "--path", tier.root, timeout=30)
    gc = cli("gc", "--path", tier.root, "--to-low", timeout=30, env={"STUNE_CLUSTER_DIR": "/nonexistent"})
    assert f"{ALICE}/locks/{key}" in gc.stdout
    # after gc, alice stages normally
    assert not (ns / "locks" / key).exists() or stat.S_ISREG((ns / "locks" / key).lstat().st_mode)
    assert stage_as(ALICE, tier, dataset, job="13")[0] in ("hit", "copied")


def test_a_fifo_planted_as_a_jobs_hold_does_not_hang_the_stager(tier, dataset, users):
    status, _path, entry = stage_as(ALICE, tier, dataset)
    assert status == "copied"

    def plant_and_stage():
        job = Path(tier.root, ALICE, "holds", "21")
        os.makedirs(job)
        os.mkfifo(job / (entry + ".x"))  # not a hold's name: ignored
        os.mkfifo(job / ("d" * 32 + ".fallback"))  # another source's note: never read for this one
        first = _stage_as(tier, dataset, "21")[0]
        os.unlink(job / entry)
        os.mkfifo(job / entry)  # exactly where the next hold goes
        try:
            _stage_as(tier, dataset, "21")
        except TierUnavailable as exc:
            return first, exc.kind
        return first, None

    # a hold file that is not a regular file is no hold: the stager checks, refuses to use it, falls back
    assert as_user(ALICE, plant_and_stage) == ("hit", "unsafe")


# ---- forged ledger rows ------------------------------------------------------------------------------------


def test_a_forged_huge_ledger_row_neither_fills_the_tier_nor_makes_root_evict(
    tier, dataset, shared_tmp, users
):
    other = make_tree(open_up(shared_tmp) / "bobs", dirs=2, files=10, size=3000, seed=3)
    assert stage_as(BOB, tier, other)[0] == "copied"
    uid = users[ALICE].pw_uid
    forged = Path(tier.root, ".ledger", f"{uid}.{'e' * 32}.1")
    as_user(ALICE, lambda: forged.write_text("999999999999999 ready\n"))
    with Tier(tier) as t:
        assert t.usage() < 1 << 20, "the claim is more than the filesystem holds: garbage"
    assert stage_as(ALICE, tier, dataset)[0] == "copied", "the tier does not look full to anyone"
    cli(
        "release",
        "--epilog",
        "--path",
        tier.root,
        "--job",
        "5",
        env={"SLURM_JOB_UID": str(uid), "SLURM_JOB_USER": ALICE},
    )
    assert len(list(Path(tier.root, BOB, "entries").iterdir())) == 1, "bob's entry was not evicted"
    status = cli("status", "--path", tier.root).stdout
    assert "909" not in status and "TiB" not in status


def test_a_plausible_forged_claim_is_checked_against_the_entry_before_root_evicts(
    tier, dataset, shared_tmp, users
):
    other = make_tree(open_up(shared_tmp) / "bobs", dirs=2, files=10, size=3000, seed=3)
    assert stage_as(BOB, tier, other)[0] == "copied"
    _status, _path, entry = stage_as(ALICE, tier, dataset)
    uid = users[ALICE].pw_uid
    row = Path(tier.root, ".ledger", f"{uid}.{entry}")
    claim = tier.quota - 1  # within every bound a user could see: only the entry itself can refute it
    as_user(ALICE, lambda: row.write_text(f"{claim} ready\n"))
    # a ready row for an entry that does not exist, also alice's
    ghost = Path(tier.root, ".ledger", f"{uid}.{'9' * 32}.1")
    as_user(ALICE, lambda: ghost.write_text(f"{tier.quota // 2} ready\n"))
    # the epilog (its eviction step, with this tier's 1 GiB quota) is past the high watermark on the
    # claims: root measures, evicts nobody, corrects the rows
    with Tier(tier) as t:
        assert t.usage() > tier.high * tier.quota
        assert admin.evict_above_high(t) == []
    assert len(list(Path(tier.root, BOB, "entries").iterdir())) == 1, "bob's entry was not evicted"
    assert len(list(Path(tier.root, ALICE, "entries").iterdir())) == 1
    nbytes = int(row.read_text().split()[0])
    assert 0 < nbytes < 1 << 20 and row.stat().st_uid == uid
    assert not ghost.exists()
    with Tier(tier) as t:
        assert t.usage() < 1 << 20
    # gc reports a new forgery of the same kind and corrects it
    as_user(ALICE, lambda: row.write_text(f"{claim} ready\n"))
    with Tier(tier) as t:
        report = gc(t, slurm=_NoSlurm())
    assert any(f"{ALICE}/{entry}: claimed {claim} bytes" in line for line in report.ledger_fixed)
    assert report.evicted == []
    assert int(row.read_text().split()[0]) == nbytes


@pytest.mark.parametrize(
    "text",
    [
        "1" * 400 + " ready",
        "-5 ready",
        "12 ready\x00",
        "\xff\xfe",
        "0x10 ready",
        "12 deleted",
        "",
        "1e9 ready",
        "１２ ready",
    ],
)
def test_garbage_ledger_rows_count_nothing(tier, users, text):
    uid = users[ALICE].pw_uid
    row = Path(tier.root, ".ledger", f"{uid}.{'e' * 32}.1")
    as_user(ALICE, lambda: row.write_bytes(text.encode("utf-8", "surrogateescape")))
    with Tier(tier) as t:
        assert t.ledger() == [] and t.usage() == 0


# ---- squatted namespaces ----------------------------------------------------------------------------------


def test_a_squatted_namespace_is_reported_and_repaired_by_init(tier, dataset, users):
    squat = Path(tier.root, ALICE)
    as_user(BOB, lambda: (os.mkdir(squat), os.chmod(squat, 0o777)))
    as_user(BOB, lambda: Path(squat, "bait").write_text("bob's"))
    with pytest.raises(AssertionError, match="must be owned by stune-alice with mode 0700"):
        stage_as(ALICE, tier, dataset)
    status = cli("status", "--path", tier.root, check=False)
    assert (
        status.returncode == 1
        and f"{tier.root}/{ALICE}: namespace of {ALICE}" in status.stdout
        and f"owned by uid {users[BOB].pw_uid}" in status.stdout
    )
    gc = cli("gc", "--path", tier.root).stdout
    assert "bad namespace" in gc and ALICE in gc and "nothing to do" not in gc
    assert f"{tier.root}/{ALICE}: namespace of {ALICE}" in cli("ls", "--path", tier.root).stderr
    init = cli("init", "--path", tier.root).stdout
    assert "already set up" not in init and "moved aside" in init
    st = squat.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == users[ALICE].pw_uid and stat.S_IMODE(st.st_mode) == 0o700
    assert list(squat.iterdir()) == []
    (aside,) = Path(tier.root, QUARANTINE).iterdir()
    assert (aside / "bait").read_text() == "bob's"
    assert stat.S_IMODE(Path(tier.root, QUARANTINE).stat().st_mode) == 0o700
    assert stage_as(ALICE, tier, dataset)[0] == "copied"
    assert "already set up" in cli("init", "--path", tier.root).stdout
    assert cli("status", "--path", tier.root).returncode == 0


@pytest.mark.parametrize("kind", ["symlink", "fifo", "file"])
def test_a_symlink_fifo_or_file_squatting_a_namespace_is_moved_aside(tier, dataset, users, shared_tmp, kind):
    bait = shared_tmp / "bob-dir"
    squat = Path(tier.root, ALICE)

    def plant():
        os.mkdir(bait)
        if kind == "symlink":
            os.symlink(bait, squat)
        elif kind == "fifo":
            os.mkfifo(squat)
        else:
            squat.write_text("bob's")

    as_user(BOB, plant)
    with Tier(tier) as t:
        (bad,) = t.namespace_problems()
        assert bad.name == ALICE and bad.uid == users[ALICE].pw_uid
    assert ALICE in cli("status", "--path", tier.root, check=False, timeout=30).stdout
    init = cli("init", "--path", tier.root, timeout=30).stdout
    assert "moved aside" in init and "already set up" not in init
    assert squat.is_dir() and not squat.is_symlink() and squat.stat().st_uid == users[ALICE].pw_uid
    assert list(bait.iterdir()) == [], "nothing was done through the link"
    assert stage_as(ALICE, tier, dataset)[0] == "copied"


def test_a_namespace_its_owner_opened_up_gets_mode_0700_back_and_keeps_its_entries(tier, dataset, users):
    assert stage_as(ALICE, tier, dataset)[0] == "copied"
    as_user(ALICE, lambda: os.chmod(Path(tier.root, ALICE), 0o755))
    with pytest.raises(AssertionError, match="mode 0755"):
        stage_as(ALICE, tier, dataset)
    init = cli("init", "--path", tier.root).stdout
    assert "mode set back to 0700" in init
    assert stage_as(ALICE, tier, dataset)[0] == "hit"


def test_a_ledger_a_user_made_before_init_is_moved_aside_not_adopted(shared_tmp, users):
    root = open_up(shared_tmp) / "half-set-up"
    root.mkdir()
    root.chmod(0o1777)  # an admin made the tier root by hand, before running init
    uid = users[BOB].pw_uid

    def squat_ledger():
        os.mkdir(root / ".ledger")
        os.chmod(root / ".ledger", 0o777)
        (root / ".ledger" / f"{uid}.{'e' * 32}.1").write_text("1000 ready\n")

    as_user(BOB, squat_ledger)
    init = cli("init", "--path", str(root)).stdout
    assert "moved aside" in init and "created" in init
    st = (root / ".ledger").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o1777) and list((root / ".ledger").iterdir()) == []
    assert cli("status", "--path", str(root)).returncode == 0


def test_a_directory_named_after_no_user_is_reported(tier):
    Path(tier.root, "no-such-user-xyz").mkdir()
    with Tier(tier) as t:
        (bad,) = t.namespace_problems()
    assert "no user" in bad.problem


# ---- published entries ------------------------------------------------------------------------------------


def test_a_job_cannot_change_a_published_entry_that_later_jobs_read(tier, dataset, users):
    _status, path, _entry = stage_as(ALICE, tier, dataset)
    want = tree_digest(dataset)

    def job_writes():
        errors = []
        for attempt in (
            lambda: Path(path, "labels.txt").write_text("poisoned"),
            lambda: Path(path, "class00", "new.bin").write_bytes(b"x"),
            lambda: Path(path, "class00", "img0000.bin").unlink(),
            lambda: os.rename(Path(path, "class01"), Path(path, "moved")),
        ):
            try:
                attempt()
                errors.append("allowed")
            except PermissionError:
                errors.append("denied")
        return errors

    assert as_user(ALICE, job_writes) == ["denied"] * 4
    assert stage_as(ALICE, tier, dataset)[:2] == ("hit", path)
    assert tree_digest(path) == want


def test_a_copy_its_owner_opened_up_again_is_not_a_hit(tier, dataset, users):
    _status, path, entry = stage_as(ALICE, tier, dataset)

    def open_up_and_edit():
        subprocess.run(["chmod", "-R", "u+w", path], check=True)
        Path(path, "labels.txt").write_text("poisoned")
        return _stage_as(tier, dataset)

    status, new_path, new_entry = as_user(ALICE, open_up_and_edit)
    assert status == "copied" and new_entry != entry
    assert tree_digest(new_path) == tree_digest(dataset)


def test_a_forged_pending_reservation_counts_only_what_its_copy_holds(tier, shared_tmp, users):
    other = make_tree(open_up(shared_tmp) / "bobs", dirs=2, files=10, size=3000, seed=3)
    assert stage_as(BOB, tier, other)[0] == "copied"
    alice_ds = make_tree(open_up(shared_tmp) / "alices", dirs=1, files=2, size=100, seed=4)
    assert stage_as(ALICE, tier, alice_ds)[0] == "copied"
    row = Path(tier.root, ".ledger", f"{users[ALICE].pw_uid}.{'7' * 32}.1")

    as_user(ALICE, lambda: row.write_text(f"{tier.quota - 1} pending {os.getpid()}\n"))
    with Tier(tier) as t:
        assert t.usage() > tier.high * tier.quota  # what a stager believes until root's next pass
        rows, _problems = t.verified_ledger()
        assert t.usage(rows) < 1 << 20
        assert admin.evict_above_high(t) == []
    assert len(list(Path(tier.root, BOB, "entries").iterdir())) == 1


def test_a_user_can_still_evict_her_read_only_entries(tier, dataset, users, shared_tmp):
    assert stage_as(ALICE, tier, dataset)[0] == "copied"

    def evict():
        with Tier(tier) as t, t.namespace() as ns:
            (entry,) = ns.entries()
            return ns.remove_entry(entry.name), os.listdir(ns.sub_path("tmp"))

    assert as_user(ALICE, evict) == (True, [])


@pytest.mark.parametrize("kind", ["archive", "file"])
def test_archives_and_single_files_are_published_read_only(tier, dataset, shared_tmp, users, kind):
    import tarfile

    if kind == "archive":
        src = shared_tmp / "ds.tar"
        with tarfile.open(src, "w") as tar:
            tar.add(dataset, arcname="ds")
    else:
        src = dataset / "labels.txt"
    open_up(shared_tmp)
    _status, path, _entry = stage_as(ALICE, tier, src)
    modes = [p.lstat().st_mode for p in [Path(path), *Path(path).rglob("*")]]
    assert modes and all(m & 0o222 == 0 for m in modes)


# ---- the free-space reserve --------------------------------------------------------------------------------


@pytest.fixture
def tmpfs64(shared_tmp):
    mount = open_up(shared_tmp) / "tmpfs64"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    mount.chmod(0o755)
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_an_8_mib_dataset_fits_an_empty_64_mib_tier(tmpfs64, shared_tmp):
    config = new_tier(tmpfs64 / "tier", quota=None)
    ds = make_tree(shared_tmp / "eight", dirs=2, files=4, size=1 << 20)  # 8 MiB
    result = stage(StageRequest(str(ds), "DS"), config)
    assert result.status == "copied" and tree_digest(result.path) == tree_digest(ds)


def test_admission_and_the_copy_guard_apply_the_same_reserve(tmpfs64, shared_tmp):
    """The documented rule: the tier keeps min(64 MiB, 1/16 of its filesystem) free. A dataset that fits
    under it is copied to the end (the guard does not stop it half way); one that does not is refused
    before anything is written, with a message that names the reserve."""
    config = new_tier(tmpfs64 / "tier", quota=None)
    with Tier(config) as t:
        reserve, free = t.reserve(), t.free_bytes()
    assert reserve == (64 << 20) // 16
    fits = make_tree(shared_tmp / "fits", dirs=1, files=1, size=free - reserve - (2 << 20))
    result = stage(StageRequest(str(fits), "FITS"), config)
    assert result.status == "copied"
    with Tier(config) as t, t.namespace() as ns:
        ns.remove_entry(result.entry)
        t.ledger_remove(0, result.entry)
    too_big = make_tree(shared_tmp / "big", dirs=1, files=1, size=free - reserve + (1 << 20))
    with pytest.raises(TierUnavailable, match="kept in reserve") as info:
        stage(StageRequest(str(too_big), "BIG"), config)
    assert info.value.kind == "disk-full"
    assert list(Path(config.root, "root", "tmp").iterdir()) == []


def test_an_archive_that_outgrows_its_estimate_is_stopped_by_the_allowance(shared_tmp):
    """A compressed archive is admitted on a guess (3x its size); the guard enforces the quota as it
    extracts, also when the extraction ends before the first tick."""
    import io
    import tarfile

    config = new_tier(open_up(shared_tmp) / "t", quota=8 << 20)
    bomb = shared_tmp / "zeros.tar.gz"
    with tarfile.open(bomb, "w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 40 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(TierUnavailable, match="outgrew its quota allowance") as caught:
        stage(StageRequest(str(bomb), "Z"), config)
    assert caught.value.kind == "over-quota"
    assert list(Path(config.root, "root", "tmp").iterdir()) == []
    assert list(Path(config.root, "root", "entries").iterdir()) == []


# ---- freshness modes, messages ----------------------------------------------------------------------------


def test_switching_the_freshness_mode_does_not_copy_an_unchanged_dataset_again(tier, dataset):
    first = stage(StageRequest(str(dataset), "DS"), tier, freshness="fast")
    strict = stage(StageRequest(str(dataset), "DS"), tier, freshness="strict")
    fast = stage(StageRequest(str(dataset), "DS"), tier, freshness="fast")
    assert (first.status, strict.status, fast.status) == ("copied", "hit", "hit")
    assert first.entry == strict.entry == fast.entry
    assert "strict freshness" in strict.message() and "fast freshness" in fast.message()
    # a deep in-place edit: fast does not see it (documented), strict does and copies
    deep = dataset / "class01" / "img0003.bin"
    deep.write_bytes(b"changed" + deep.read_bytes()[7:])
    assert stage(StageRequest(str(dataset), "DS"), tier, freshness="fast").status == "hit"
    again = stage(StageRequest(str(dataset), "DS"), tier, freshness="strict")
    assert again.status == "copied" and tree_digest(again.path) == tree_digest(dataset)
    assert stage(StageRequest(str(dataset), "DS"), tier, freshness="fast").status == "hit"


def test_the_summary_counts_files_not_directories(tier, shared_tmp):
    ds = make_tree(shared_tmp / "count", dirs=4, files=10, size=100)  # 40 files + labels.txt, 4 directories
    (ds / "class00" / "deeper").mkdir()
    result = stage(StageRequest(str(ds), "DS"), tier)
    assert result.files == 41 and "41 files" in result.message()


# ---- the command line -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["fetch", "--jobs", "-1"], "copy threads must be 1 to 256"),
        (["fetch", "--jobs", "0"], "copy threads must be 1 to 256"),
        (["fetch", "--jobs", "many"], "copy threads must be 1 to 256"),
        (["fetch", "--job", "12a"], "--job '12a': not a Slurm job id"),
        (["fetch", "--job", "12_3"], "not a Slurm job id"),
        (["release", "--job", "12a"], "not a Slurm job id"),
    ],
)
def test_bad_fetch_and_release_arguments_are_refused_at_once(tier, dataset, args, words):
    proc = cli(
        *args, "--path", tier.root, *([str(dataset)] if args[0] == "fetch" else []), timeout=20, check=False
    )
    assert proc.returncode == 1 and words in proc.stderr  # bad input: exit 1, one line (README)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not Path(tier.root, "root").exists(), "nothing was staged"


def test_a_malformed_slurm_job_id_is_an_error_not_a_missing_hold(tier, dataset):
    proc = cli("fetch", "--path", tier.root, str(dataset), env={"SLURM_JOB_ID": "12a"}, check=False)
    assert proc.returncode != 0 and "SLURM_JOB_ID='12a' is not a job id" in proc.stderr


def test_the_library_refuses_a_copy_parallelism_below_one(tier, dataset):
    with pytest.raises(ValueError, match=">= 1"):
        stage(StageRequest(str(dataset), "DS"), tier, jobs=-1)
    with pytest.raises(ValueError, match="job id"):
        stage(StageRequest(str(dataset), "DS"), tier, job_id="12a")


# ---- fuzz: the ledger and stamp parsers take any bytes a user can write -------------------------------------


_ROWISH = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda n, state, junk: f"{n} {state}".encode() + junk,
        st.integers(min_value=-(10**30), max_value=10**30),
        st.sampled_from(["ready", "pending 12", "pending", "READY", "ready ready", ""]),
        st.binary(max_size=8),
    ),
)


@settings(max_examples=3000, deadline=None)
@given(_ROWISH, st.integers(min_value=0, max_value=1 << 50))
def test_parse_row_accepts_only_bounded_digit_sizes(raw, limit):
    row = parse_row(raw.decode("utf-8", "replace"), limit)
    if row is not None:
        nbytes, state = row
        assert 0 <= nbytes <= limit and len(str(nbytes)) <= ROW_MAX_DIGITS
        assert state == "ready" or state.startswith("pending")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_any_ledger_or_stamp_bytes_are_survived(tier, raw):
    """Whatever a user writes as a row or a stamp: no exception, no claim beyond the filesystem."""
    row = Path(tier.root, ".ledger", f"0.{'e' * 32}.1")
    row.write_bytes(raw)
    with Tier(tier) as t, t.namespace() as ns:
        ns.sub("entries")
        entry = Path(tier.root, "root", "entries", "f" * 32 + ".1")
        (entry / "data").mkdir(parents=True, exist_ok=True)
        (entry / "stamp").write_bytes(raw)
        assert t.usage() <= t.used_bytes()
        assert ns.read_stamp(entry.name) is None or ns.read_stamp(entry.name).get("complete") == "1"
        t.verified_ledger()


def test_the_epilog_hook_finishes_with_fifos_planted_everywhere_root_looks(tier, dataset, users, shared_tmp):
    """The installed hook, as slurmd runs it (root, minimal environment): exits 0, in bounded time."""
    from test_stage_tier import _profiles

    status, _path, _entry = stage_as(ALICE, tier, dataset, job="61")
    assert status == "copied"
    uid = users[ALICE].pw_uid
    ns = Path(tier.root, ALICE)

    def plant():
        os.unlink(ns / "locks" / source_key(str(dataset)))
        os.mkfifo(ns / "locks" / source_key(str(dataset)))
        os.mkfifo(ns / "holds" / "61" / ("f" * 32 + ".1"))
        os.mkfifo(Path(tier.root, ".ledger", f"{uid}.{'f' * 32}.1"))

    as_user(ALICE, plant)
    other = make_tree(open_up(shared_tmp) / "bobs", dirs=1, files=3, size=1000, seed=5)
    assert stage_as(BOB, tier, other)[0] == "copied"
    # far past the high watermark: the eviction step runs, and has to lock alice's key
    profiles = _profiles(
        shared_tmp, {"path": tier.root, "quota": "1M", "high_watermark": 0.01, "low_watermark": 0.001}
    )
    hook = Path(__file__).resolve().parent.parent / "epilog" / "30-stune-stage"
    env = {
        "PATH": "/usr/bin:/bin",
        "STUNE_ENV_FILE": "/dev/null",
        "STUNE_BIN": str(Path(STAGE).parent),
        "STUNE_PARTITIONS": str(profiles),
        "SLURM_JOB_ID": "61",
        "SLURM_JOB_UID": str(uid),
        "SLURM_JOB_USER": ALICE,
        "SLURM_JOB_PARTITION": "gpu",
        "SLURMD_NODENAME": "n1",
    }
    proc = subprocess.run(["sh", str(hook)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not (ns / "holds" / "61").exists(), "the job's holds were released"
    assert list(Path(tier.root, BOB, "entries").iterdir()) == [], "the others were evicted"
    assert len(list((ns / "entries").iterdir())) == 1, "alice's entry, with a broken lock, was skipped"
