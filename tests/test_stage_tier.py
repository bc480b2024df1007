"""The cache tier on one node, driven directly: hits, freshness, atomic publish, concurrency, eviction,
fallbacks, and the multi-user security rules. Real processes, real users, real filesystems (a tmpfs for the
full-disk case); the Slurm side (jobs, the epilog, liveness) is in test_stage_cluster.py."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers import wait_until

from slurm_tune.stage import admin
from slurm_tune.stage.errors import SourceError, StageRequiredError, TierUnavailable
from slurm_tune.stage.gc import gc
from slurm_tune.stage.layout import source_key
from slurm_tune.stage.spec import StageRequest, encode_requests
from slurm_tune.stage.stager import stage
from slurm_tune.stage.tier import Tier, TierConfig

PY = sys.executable
USERS = ("stune-alice", "stune-bob")


# ---- helpers (test_stage_cluster imports these) -----------------------------------------------------------


def make_tree(root: Path, dirs: int = 4, files: int = 25, size: int = 3000, seed: int = 0) -> Path:
    """A dataset: `dirs` class directories of `files` files each, deterministic content."""
    root.mkdir(parents=True, exist_ok=True)
    for d in range(dirs):
        sub = root / f"class{d:02d}"
        sub.mkdir(exist_ok=True)
        for f in range(files):
            blob = hashlib.sha256(f"{seed}-{d}-{f}".encode()).digest() * (size // 32 + 1)
            (sub / f"img{f:04d}.bin").write_bytes(blob[: size + f])
    (root / "labels.txt").write_text("".join(f"class{d:02d}\n" for d in range(dirs)))
    return root


def tree_digest(root: Path | str) -> str:
    """sha256 over every relative path, file content and symlink target (never following links)."""
    h = hashlib.sha256()
    root = str(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            h.update(rel.encode() + b"\0")
            if os.path.islink(path):
                h.update(b"L" + os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def open_up(path: Path) -> Path:
    """Make path and its parents traversable by the test users (pytest's tmp dirs are 0700)."""
    path.chmod(path.stat().st_mode | 0o755)
    for parent in path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return path


def ensure_users():
    from stune_dev.devcluster import ensure_unix_users

    ensure_unix_users()


def new_tier(
    path: Path, quota: int | None = 1 << 30, high: float = 0.9, low: float = 0.75, freshness: str = "fast"
) -> TierConfig:
    config = TierConfig(str(path), quota, high, low, freshness)
    admin.init(config)
    return config


def entries_of(config: TierConfig, user: str = "root") -> list[str]:
    path = Path(config.root, user, "entries")
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.fixture
def tier(shared_tmp) -> TierConfig:
    return new_tier(open_up(shared_tmp) / "tier")


@pytest.fixture
def dataset(shared_tmp) -> Path:
    return make_tree(shared_tmp / "datasets" / "imagenet")


def req(path, name="DS") -> StageRequest:
    return StageRequest(str(path), name)


# ---- hits, holds, freshness ------------------------------------------------------------------------------


def test_first_stage_copies_second_hits_with_identical_bytes(tier, dataset):
    first = stage(req(dataset), tier, job_id="101")
    second = stage(req(dataset), tier, job_id="102")
    assert (first.status, second.status) == ("copied", "hit")
    assert first.path == second.path
    assert tree_digest(first.path) == tree_digest(dataset)
    assert first.files == 4 * 25 + 1  # files, not directories (#15 §6: "4,002 files" for 4000 was wrong)
    assert len(entries_of(tier)) == 1


def test_a_jobs_later_tasks_find_its_hold_without_checking_the_source(tier, dataset):
    stage(req(dataset), tier, job_id="7")
    (dataset / "labels.txt").write_text("changed\n")  # the job keeps the copy it started with
    again = stage(req(dataset), tier, job_id="7")
    assert again.status == "held"
    assert "changed" not in Path(again.path, "labels.txt").read_text()


def test_fast_freshness_sees_top_level_and_second_level_changes(tier, dataset):
    base = stage(req(dataset), tier)
    (dataset / "labels.txt").write_text("relabelled\n")
    assert stage(req(dataset), tier).status == "copied"
    (dataset / "class01" / "new.bin").write_bytes(b"x")  # an added file changes class01's mtime and ctime
    third = stage(req(dataset), tier)
    assert third.status == "copied"
    assert Path(third.path, "class01", "new.bin").exists()
    assert Path(third.path, "labels.txt").read_text() == "relabelled\n"
    assert base.path != third.path
    assert len(entries_of(tier)) == 1, "unheld old copies are deleted when a new one is published"


def test_strict_freshness_sees_a_deep_in_place_change_that_fast_does_not(tier, dataset, shared_tmp):
    deep = dataset / "class02" / "img0003.bin"
    stage(req(dataset), tier)
    with open(deep, "r+b") as fh:  # same size, new content, deep in the tree: no directory changes
        fh.write(b"CHANGED")
    assert stage(req(dataset), tier).status == "hit", "fast mode documents that it misses this"
    strict = stage(req(dataset), tier._replace(freshness="strict"))
    assert strict.status == "copied"
    assert Path(strict.path, "class02", "img0003.bin").read_bytes().startswith(b"CHANGED")
    assert stage(req(dataset), tier._replace(freshness="strict")).status == "hit"


def test_touching_mtime_back_does_not_hide_a_change(tier, dataset):
    f = dataset / "labels.txt"
    stage(req(dataset), tier)
    st = f.stat()
    f.write_text("same size!\n"[: st.st_size].ljust(st.st_size, "x"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored; ctime cannot be
    assert stage(req(dataset), tier).status == "copied"


def test_a_held_old_copy_survives_a_refresh_until_released(tier, dataset):
    old = stage(req(dataset), tier, job_id="1")
    (dataset / "labels.txt").write_text("v2\n")
    new = stage(req(dataset), tier, job_id="2")
    assert new.status == "copied" and new.path != old.path
    assert Path(old.path, "labels.txt").exists(), "job 1 still reads its copy"
    with Tier(tier) as t:
        admin.release_job(t, "1")
    assert stage(req(dataset), tier, job_id="3").status == "hit"  # a hit also sweeps unheld old copies
    assert not Path(old.path).exists()
    assert Path(new.path, "labels.txt").read_text() == "v2\n"


def _no_slurm():
    """gc asks Slurm only about jobs that hold something; these tests release holds first."""

    class Unreachable:
        def jobs(self):
            raise AssertionError("gc asked Slurm about job liveness with no holds left")

    return Unreachable()


def test_the_source_is_stamped_before_the_copy(tier, dataset, monkeypatch):
    """A source changed while it is being copied is seen as changed by the next stager."""
    from slurm_tune.stage import copy as copymod

    real = copymod.copy_tree

    def change_midway(*args, **kwargs):
        (dataset / "late.txt").write_text("arrived during the copy")
        return real(*args, **kwargs)

    monkeypatch.setattr(copymod, "copy_tree", change_midway)
    stage(req(dataset), tier)
    monkeypatch.setattr(copymod, "copy_tree", real)
    again = stage(req(dataset), tier)
    assert again.status == "copied"
    assert Path(again.path, "late.txt").exists()


def _set_boot(entry: Path, boot: str) -> None:
    stamp = entry / "stamp"
    stamp.write_text(
        "".join(
            f"boot={boot}\n" if line.startswith("boot=") else line + "\n"
            for line in stamp.read_text().splitlines()
        )
    )


def test_after_a_reboot_an_intact_entry_is_verified_and_kept(tier, dataset):
    from slurm_tune.stage.fresh import boot_id

    first = stage(req(dataset), tier)
    entry = Path(first.path).parent
    _set_boot(entry, "an-earlier-boot")
    again = stage(req(dataset), tier)
    assert again.status == "hit" and again.path == first.path
    assert f"boot={boot_id()}" in (entry / "stamp").read_text(), "re-stamped with this boot"


def test_after_a_crash_an_entry_whose_data_never_reached_the_disk_is_restaged(tier, dataset):
    first = stage(req(dataset), tier)
    entry = Path(first.path).parent
    (entry / "data" / "class03" / "img0007.bin").write_bytes(b"")  # what an unflushed file looks like
    _set_boot(entry, "the-boot-that-crashed")
    again = stage(req(dataset), tier)
    assert again.status == "copied"
    assert tree_digest(again.path) == tree_digest(dataset)
    assert not entry.exists()


# ---- kinds of source --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tar.xz", "w:xz")])
def test_archives_are_extracted_locally(tier, dataset, shared_tmp, suffix, mode):
    archive = shared_tmp / f"imagenet{suffix}"
    with tarfile.open(archive, mode) as tar:
        tar.add(dataset, arcname="imagenet")
    first = stage(req(archive, "TAR"), tier)
    assert first.status == "copied"
    assert tree_digest(Path(first.path, "imagenet")) == tree_digest(dataset)
    assert stage(req(archive, "TAR"), tier).status == "hit"
    archive.write_bytes(archive.read_bytes())  # rewritten: new mtime and ctime
    assert stage(req(archive, "TAR"), tier).status == "copied"


def test_a_zstd_archive_is_extracted(tier, dataset, shared_tmp):
    archive = shared_tmp / "ds.tar.zst"
    subprocess.run(
        ["tar", "--zstd", "-cf", str(archive), "-C", str(dataset.parent), dataset.name], check=True
    )
    result = stage(req(archive, "Z"), tier)
    assert tree_digest(Path(result.path, dataset.name)) == tree_digest(dataset)


def test_a_hostile_archive_cannot_write_outside_the_entry(tier, shared_tmp):
    archive = shared_tmp / "evil.tar"
    payload = shared_tmp / "payload"
    payload.write_text("pwned")
    with tarfile.open(archive, "w") as tar:
        tar.add(payload, arcname="../../../escaped.txt")
        tar.add(payload, arcname="ok.txt")
    with pytest.raises(TierUnavailable) as info:
        stage(req(archive, "EVIL"), tier)
    assert info.value.kind == "copy-failed" and "contains '..'" in str(info.value)
    assert not list(shared_tmp.rglob("escaped.txt"))
    assert not any((parent / "escaped.txt").exists() for parent in Path(tier.root).parents)
    assert entries_of(tier) == [] and list(Path(tier.root, "root", "tmp").iterdir()) == []


def test_a_single_file_is_copied_and_the_variable_names_the_file(tier, shared_tmp):
    blob = shared_tmp / "weights.safetensors"
    blob.write_bytes(os.urandom(3 << 20))
    result = stage(req(blob, "W"), tier)
    assert result.path.endswith("/data/weights.safetensors")
    assert Path(result.path).read_bytes() == blob.read_bytes()


def test_source_symlinks_are_copied_as_links_never_followed(tier, dataset, shared_tmp):
    secret = shared_tmp / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not part of the dataset")
    (dataset / "escape").symlink_to(secret)
    (dataset / "escape_dir").symlink_to(secret.parent)
    (dataset / "alias").symlink_to("labels.txt")
    result = stage(req(dataset), tier)
    copy = Path(result.path)
    assert os.readlink(copy / "escape") == str(secret)
    assert os.readlink(copy / "escape_dir") == str(secret.parent)
    assert os.readlink(copy / "alias") == "labels.txt"
    assert not any(p.name == "secret.txt" for p in Path(tier.root).rglob("*"))


def test_special_files_are_skipped_with_a_note(tier, dataset):
    import io

    os.mkfifo(dataset / "pipe")
    out = io.StringIO()
    result = stage(req(dataset), tier, progress_stream=out)
    assert not Path(result.path, "pipe").exists()
    assert "skipped 1 special file" in out.getvalue()


def test_a_read_only_source_tree_makes_an_evictable_copy(tier, dataset):
    for d in dataset.iterdir():
        if d.is_dir():
            d.chmod(0o555)
    try:
        result = stage(req(dataset), tier)
        assert stat.S_IMODE(Path(result.path, "class00").stat().st_mode) == 0o555  # published: read-only
        with Tier(tier) as t, t.namespace() as ns:
            assert ns.remove_entry(Path(result.path).parent.name)
    finally:
        for d in dataset.iterdir():
            if d.is_dir():
                d.chmod(0o755)


def test_missing_and_unreadable_sources_are_source_errors(tier, shared_tmp):
    with pytest.raises(SourceError, match="does not exist"):
        stage(req(shared_tmp / "nope"), tier)
    os.mkfifo(shared_tmp / "fifo")
    with pytest.raises(SourceError, match="neither a directory nor a regular file"):
        stage(req(shared_tmp / "fifo"), tier)


# ---- concurrency and crash safety -------------------------------------------------------------------------

STAGER = """
import sys, json
from slurm_tune.stage.stager import stage
from slurm_tune.stage.tier import TierConfig
from slurm_tune.stage.spec import StageRequest
config = TierConfig(*json.loads(sys.argv[1]))
r = stage(StageRequest(sys.argv[2], "DS"), config, job_id=sys.argv[3], progress_stream=sys.stderr)
print(r.status, r.path)
"""


def _stager(config: TierConfig, source, job: str, user: str | None = None, env=None) -> subprocess.Popen:
    import json

    argv = [PY, "-c", STAGER, json.dumps(list(config)), str(source), job]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {}))
    )


def test_sixteen_concurrent_stagers_make_one_copy(tier, dataset):
    make_tree(dataset, dirs=8, files=120, size=6000, seed=1)
    want = tree_digest(dataset)
    procs = [_stager(tier, dataset, str(1000 + i)) for i in range(16)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    statuses = [out.split()[0] for out, _err in results]
    paths = {out.split()[1] for out, _err in results}
    assert statuses.count("copied") == 1 and statuses.count("hit") == 15
    assert len(paths) == 1 and len(entries_of(tier)) == 1
    assert tree_digest(paths.pop()) == want


def test_kill_9_mid_copy_leaves_nothing_complete_and_the_next_stager_restages(tier, dataset):
    make_tree(dataset, dirs=20, files=400, size=2000, seed=2)
    proc = _stager(tier, dataset, "55", env={"STUNE_STAGE_JOBS": "1"})
    tmp = Path(tier.root, "root", "tmp")

    def copying():
        return [p for p in tmp.iterdir() if p.name.endswith(".staging")] if tmp.exists() else []

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        staging = copying()
        if staging and any(Path(staging[0], "data").rglob("img*.bin")):
            break
        time.sleep(0.01)
    else:
        pytest.fail("the stager never started copying")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert entries_of(tier) == [], "a killed stager must publish nothing"

    def orphans():
        return subprocess.run(
            ["pgrep", "-f", f"cp -R -P --parents -t {tmp}"], capture_output=True, text=True
        ).stdout.split()

    # the workers get their parent-death signal as the stager dies; give the kernel a moment to deliver it
    wait_until("the copy workers to die with their stager", lambda: not orphans(), timeout=10, interval=0.05)
    with Tier(tier) as t:
        assert any(r.state != "ready" for r in t.ledger()), "the dead stager's reservation is still there"
    result = stage(req(dataset), tier, job_id="56")
    assert result.status == "copied"
    assert tree_digest(result.path) == tree_digest(dataset)
    assert [p.name for p in tmp.iterdir()] == [], "the dead stager's partial copy was cleared"
    with Tier(tier) as t:
        assert [r.state for r in t.ledger()] == ["ready"]


def test_an_entry_without_a_complete_stamp_is_not_trusted(tier, dataset):
    first = stage(req(dataset), tier)
    entry = Path(first.path).parent
    stamp_file = entry / "stamp"
    stamp_file.write_text(stamp_file.read_text().replace("complete=1\n", ""))
    assert stage(req(dataset), tier).status == "copied"


# ---- quota, eviction, fallback ----------------------------------------------------------------------------


def test_lru_eviction_between_watermarks_never_touches_held_entries(shared_tmp):
    root = open_up(shared_tmp) / "small-tier"
    sets = [make_tree(shared_tmp / f"set{i}", dirs=2, files=10, size=40_000, seed=i) for i in range(4)]
    one = stage(req(sets[0]), new_tier(root, quota=10 << 30)).bytes
    config = TierConfig(
        str(root), int(one * 3.2), 0.9, 0.4, "fast"
    )  # room for 3, evicts above 2.88 down to 1.28
    stage(req(sets[0]), config, job_id="1")  # held by a running job
    stage(req(sets[1]), config)  # unheld, used earlier
    _wait_for_the_clock_past(config, sets[1])  # (LRU times are the ledger rows' mtimes)
    stage(req(sets[2]), config)  # unheld, used later
    result = stage(req(sets[3]), config)  # 4th: must evict, down to the low watermark
    assert result.status == "copied"
    remaining = {s.name for s in sets if _cached(config, s)}
    assert remaining == {"set0", "set3"}, "LRU set1 and then set2 go; held set0 stays"
    with Tier(config) as t:
        assert t.usage() <= 0.4 * config.quota + one + 4096


def _wait_for_the_clock_past(config, source) -> None:
    """Until the tier's filesystem stamps a new file later than `source`'s last use, so the next use is
    strictly later (file times are as coarse as the filesystem's clock tick)."""
    with Tier(config) as t:
        last_use = max(r.last_use for r in t.ledger() if r.entry.startswith(source_key(str(source))))
    probe = Path(config.root) / ".clock-probe"

    def later() -> bool:
        probe.touch()
        return probe.stat().st_mtime > last_use

    try:
        wait_until("the filesystem clock to tick", later, timeout=5, interval=0.001)
    finally:
        probe.unlink(missing_ok=True)


def _cached(config, source) -> bool:
    key = source_key(str(source))
    return any(name.startswith(key) for name in entries_of(config))


def test_a_dataset_bigger_than_the_quota_falls_back_to_the_source(tier, dataset):
    tiny = tier._replace(quota=10_000)
    with pytest.raises(TierUnavailable) as info:
        stage(req(dataset), tiny, job_id="9")
    assert info.value.kind == "over-quota" and "quota" in str(info.value)
    assert entries_of(tier) == []


def test_held_entries_can_leave_no_room(shared_tmp):
    root = open_up(shared_tmp) / "t"
    a, b = (make_tree(shared_tmp / n, dirs=1, files=10, size=50_000, seed=i) for i, n in enumerate("ab"))
    size = stage(req(a), new_tier(root)).bytes
    config = TierConfig(str(root), int(size * 1.5), 0.9, 0.5, "fast")
    stage(req(a), config, job_id="1")
    with pytest.raises(TierUnavailable, match="in use"):
        stage(req(b), config, job_id="2")


def _profiles(shared_tmp: Path, cache: dict) -> Path:
    import yaml

    directory = shared_tmp.parent / f"{shared_tmp.name}-profiles"  # root loads profiles only where root alone
    directory.mkdir(exist_ok=True)  # can write: not in the job-writable tmp
    profile = {"partition": "gpu", "fabric": {"type": "tcp", "socket_ifname": "eth0"}, "cache": cache}
    (directory / "gpu.yaml").write_text(yaml.safe_dump(profile))
    return directory


def _context(environ):
    """The job context stune-task-prolog builds: the partition's profile loaded once, at the entry point."""
    from slurm_tune.profiles import load_profile
    from slurm_tune.thisnode import job_context

    return job_context(environ).with_profile(load_profile)


def _job_env(requests, required=False, job="42", node="n1"):
    return _context(
        {
            "STUNE_STAGE": encode_requests(requests, required),
            "SLURM_JOB_PARTITION": "gpu",
            "SLURMD_NODENAME": node,
            "SLURM_JOB_ID": job,
        }
    )


def test_prepare_for_task_stages_and_expands_the_node_name(shared_tmp, dataset, monkeypatch):
    from slurm_tune.stage.jobenv import prepare_for_task

    open_up(shared_tmp)
    admin.init(TierConfig(str(shared_tmp / "n1-cache"), None, 0.9, 0.75, "fast"))
    monkeypatch.setenv(
        "STUNE_PARTITIONS",
        str(
            _profiles(
                shared_tmp,
                {"path": str(shared_tmp / "%n-cache"), "quota": "1G", "stage": [f"{dataset}:DEFAULT_SET"]},
            )
        ),
    )
    exports, messages = prepare_for_task(_job_env([req(dataset, "IMAGENET")]))
    assert set(exports) == {"STUNE_STAGE_IMAGENET", "STUNE_STAGE_DEFAULT_SET"}
    assert exports["STUNE_STAGE_IMAGENET"].startswith(str(shared_tmp / "n1-cache" / "root" / "entries"))
    assert tree_digest(exports["STUNE_STAGE_IMAGENET"]) == tree_digest(dataset)
    assert any("staged" in m for m in messages)
    again, quiet = prepare_for_task(_job_env([req(dataset, "IMAGENET")]))
    assert again == exports and quiet == [], "later tasks of the job are silent"


def test_over_quota_warns_and_points_at_the_source_unless_required(shared_tmp, dataset, monkeypatch):
    from slurm_tune.stage.jobenv import prepare_for_task

    open_up(shared_tmp)
    admin.init(TierConfig(str(shared_tmp / "n1-cache"), None, 0.9, 0.75, "fast"))
    monkeypatch.setenv(
        "STUNE_PARTITIONS", str(_profiles(shared_tmp, {"path": str(shared_tmp / "%n-cache"), "quota": "8K"}))
    )
    exports, messages = prepare_for_task(_job_env([req(dataset)]))
    assert exports == {"STUNE_STAGE_DS": str(dataset)}
    assert len(messages) == 1 and "warning" in messages[0] and "quota" in messages[0]
    again, later = prepare_for_task(_job_env([req(dataset)]))
    assert again == exports and later == [], "the job's other tasks do not retry or repeat the warning"
    with pytest.raises(StageRequiredError, match=r"--stage-required: DS: .*quota"):
        prepare_for_task(_job_env([req(dataset)], required=True, job="43"))


def test_a_missing_tier_falls_back(shared_tmp, dataset, monkeypatch):
    from slurm_tune.stage.jobenv import prepare_for_task

    monkeypatch.setenv("STUNE_PARTITIONS", str(_profiles(shared_tmp, {"path": str(shared_tmp / "no-nvme")})))
    exports, messages = prepare_for_task(_job_env([req(dataset)]))
    assert exports == {"STUNE_STAGE_DS": str(dataset)}
    assert "does not exist" in messages[0]
    assert not (shared_tmp / "no-nvme").exists(), "a missing tier is not created on the root disk"
    with pytest.raises(StageRequiredError):
        prepare_for_task(_job_env([req(dataset)], required=True))


def test_no_requests_means_nothing_to_do(monkeypatch, shared_tmp):
    from slurm_tune.stage.jobenv import prepare_for_task

    monkeypatch.setenv("STUNE_PARTITIONS", str(_profiles(shared_tmp, {"path": "/nonexistent"})))
    assert prepare_for_task(_context({"SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ID": "1"})) == ({}, [])


@pytest.fixture
def small_disk(shared_tmp):
    mount = open_up(shared_tmp) / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_full_disk_stops_the_copy_and_leaves_no_entry(small_disk, shared_tmp):
    config = new_tier(small_disk / "tier", quota=None)  # quota: the whole 4 MiB filesystem
    big = make_tree(shared_tmp / "big", dirs=2, files=20, size=100_000)  # ~4 MiB: cannot fit with the margin
    with pytest.raises(TierUnavailable) as info:
        stage(req(big), config)
    assert info.value.kind in ("disk-full", "over-quota")
    assert entries_of(config) == []
    assert list(Path(config.root, "root", "tmp").iterdir()) == []


# ---- security ---------------------------------------------------------------------------------------------


@pytest.fixture
def users():
    ensure_users()
    return {u: pwd.getpwnam(u) for u in USERS}


def test_user_namespaces_are_private(tier, dataset, users):
    alice = _stager(tier, dataset, "1", user="stune-alice")
    _out, err = alice.communicate(timeout=120)
    assert alice.returncode == 0, err
    ns = Path(tier.root, "stune-alice")
    st = ns.stat()
    assert st.st_uid == users["stune-alice"].pw_uid and stat.S_IMODE(st.st_mode) == 0o700
    peek = subprocess.run(
        ["runuser", "-u", "stune-bob", "--", "ls", str(ns / "entries")], capture_output=True, text=True
    )
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    bob = _stager(tier, dataset, "2", user="stune-bob")
    out_b, err_b = bob.communicate(timeout=120)
    assert bob.returncode == 0, err_b
    assert out_b.split()[0] == "copied", "users never share copies"
    assert out_b.split()[1].startswith(str(Path(tier.root, "stune-bob")))


def test_a_namespace_squatted_by_another_user_is_refused(tier, dataset, users, shared_tmp):
    bait = shared_tmp / "bob-controls"
    bait.mkdir()
    os.chown(bait, users["stune-bob"].pw_uid, -1)
    os.symlink(bait, Path(tier.root, "stune-alice"))  # as if bob planted it in the sticky tier root
    proc = _stager(tier, dataset, "1", user="stune-alice")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "TierUnavailable" in err and "stune-alice" in err
    assert list(bait.iterdir()) == [], "nothing was written through the planted symlink"
    os.unlink(Path(tier.root, "stune-alice"))
    squat = Path(tier.root, "stune-alice")
    squat.mkdir(mode=0o700)
    os.chown(squat, users["stune-bob"].pw_uid, -1)
    proc = _stager(tier, dataset, "1", user="stune-alice")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "owned by stune-alice with mode 0700; it is owned by uid" in err


def test_root_never_follows_symlinks_planted_in_a_namespace(tier, dataset, users, shared_tmp):
    """The epilog and gc run as root inside user-writable namespaces: planted links must not lead them out."""
    proc = _stager(tier, dataset, "77", user="stune-alice")
    assert proc.communicate(timeout=120) and proc.returncode == 0
    ns = Path(tier.root, "stune-alice")
    victim = shared_tmp / "victim"
    (victim / "77").mkdir(parents=True)
    (victim / "77" / "precious").write_text("keep me")
    (victim / "precious").write_text("keep me")
    # alice swaps her holds directory for a link to the victim, and plants links in tmp/ and entries/
    os.rename(ns / "holds", ns / "holds.real")
    os.symlink(victim, ns / "holds")
    os.symlink(victim, ns / "tmp" / "0123456789abcdef0123456789abcdef.1.999.staging")
    os.symlink(victim, ns / "entries" / "0123456789abcdef0123456789abcdef.2")
    with Tier(tier) as t:
        with pytest.raises(TierUnavailable, match="holds is not a directory"):
            admin.release_job(t, "77", users["stune-alice"].pw_uid, "stune-alice")
        report = gc(t, slurm=_no_slurm(), to_low=True)
        assert any("stune-alice" in p and "holds" in p for p in report.problems), "skipped, and said so"
    assert (victim / "77" / "precious").read_text() == "keep me"
    os.unlink(ns / "holds")
    os.rename(ns / "holds.real", ns / "holds")
    shutil.rmtree(ns / "holds" / "77")  # job 77 has ended and released its hold
    with Tier(tier) as t:
        report = gc(t, slurm=_no_slurm(), to_low=True)
        assert report.problems == []
        listed = admin.list_entries(t)
    assert (victim / "77" / "precious").read_text() == "keep me"
    assert (victim / "precious").read_text() == "keep me"
    assert all(not r.entry.endswith(".2") for r in listed), "a symlink in entries/ is never an entry"
    assert not (ns / "tmp" / "0123456789abcdef0123456789abcdef.1.999.staging").exists(), (
        "the planted link itself was removed, not followed"
    )


def test_a_symlinked_stamp_or_data_is_not_a_complete_entry(tier, dataset, shared_tmp):
    first = stage(req(dataset), tier)
    entry = Path(first.path).parent
    fake = shared_tmp / "fake-stamp"
    fake.write_text((entry / "stamp").read_text())
    (entry / "stamp").unlink()
    (entry / "stamp").symlink_to(fake)
    assert stage(req(dataset), tier).status == "copied"


def test_an_unsafe_tier_root_is_refused(shared_tmp, dataset):
    root = shared_tmp / "world-writable"
    root.mkdir()
    root.chmod(0o777)  # no sticky bit: anyone could rename anyone's namespace
    with pytest.raises(TierUnavailable, match="sticky"):
        stage(req(dataset), TierConfig(str(root), None, 0.9, 0.75, "fast"))


def test_an_uninitialised_tier_is_reported(shared_tmp, dataset):
    root = shared_tmp / "bare"
    root.mkdir()
    with pytest.raises(TierUnavailable, match="stune-stage init"):
        stage(req(dataset), TierConfig(str(root), None, 0.9, 0.75, "fast"))


def test_forged_ledger_rows_are_ignored(tier, dataset, users):
    stage(req(dataset), tier)
    ledger = Path(tier.root, ".ledger")
    forged = ledger / f"{users['stune-alice'].pw_uid}.{'a' * 32}.1"
    forged.write_text(f"{1 << 40} ready\n")  # root-owned, claiming to be alice's: not alice's
    with Tier(tier) as t:
        assert t.usage() < 1 << 30


def test_gc_restores_a_missing_ledger_row_as_the_entrys_user(tier, dataset, users):
    """Root writes the row on alice's behalf; a root-owned row would be ignored as a forgery."""
    proc = _stager(tier, dataset, "31", user="stune-alice")
    assert proc.communicate(timeout=120) and proc.returncode == 0
    shutil.rmtree(Path(tier.root, "stune-alice", "holds", "31"))  # job 31 has ended
    alice = users["stune-alice"].pw_uid
    (row,) = Path(tier.root, ".ledger").glob(f"{alice}.*")
    nbytes = int(row.read_text().split()[0])
    row.unlink()
    with Tier(tier) as t:
        report = gc(t, slurm=_no_slurm())
        assert report.ledger_fixed == [f"stune-alice/{row.name.split('.', 1)[1]}: missing row"]
        assert [(r.uid, r.bytes) for r in t.ledger()] == [(alice, nbytes)]
    assert row.stat().st_uid == alice


# ---- the hot path -----------------------------------------------------------------------------------------


def test_a_hit_does_not_load_the_copy_machinery(tier, dataset, shared_tmp):
    stage(req(dataset), tier, job_id="5")
    code = f"""
import sys
from slurm_tune.stage.stager import stage
from slurm_tune.stage.tier import TierConfig
from slurm_tune.stage.spec import StageRequest
r = stage(StageRequest({str(dataset)!r}, "DS"), TierConfig(*{list(tier)!r}), job_id="6")
assert r.status == "hit", r
"""
    from importcheck import loaded_by  # hermetic: the same under any kind of install

    assert not loaded_by(code) & {"subprocess", "tempfile", "shutil", "json", "re"}


def test_after_a_reboot_a_copy_made_in_preallocated_ranges_is_copied_again(tier, shared_tmp):
    """A single file (like a tree's files of copy.SPLIT bytes and up) is copied in preallocated ranges: after a
    crash its size is whole while unwritten blocks read as zeros, which the manifest cannot see. Trusted in
    the boot that made it, copied again after a reboot."""
    src = shared_tmp / "weights.bin"
    src.write_bytes(os.urandom(1 << 20))
    first = stage(req(src, "W"), tier)
    entry = Path(first.path).parent.parent  # entries/<entry>/data/weights.bin
    assert "ranges=1" in (entry / "stamp").read_text()
    assert stage(req(src, "W"), tier).status == "hit"
    _set_boot(entry, "the-boot-that-crashed")
    again = stage(req(src, "W"), tier)
    assert again.status == "copied" and Path(again.path).read_bytes() == src.read_bytes()


def test_an_empty_file_is_staged(tier, shared_tmp):
    src = shared_tmp / "empty.idx"
    src.write_bytes(b"")
    result = stage(req(src, "E"), tier)
    assert result.status == "copied" and Path(result.path).read_bytes() == b""
