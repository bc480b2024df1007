"""A tree copied while it is walked (issue 23): the `cp` batches start before the walk ends, no batch starts
before its bytes are claimed in the ledger, a tree that needs an eviction or does not fit is admitted or
refused whole at the walk's end (never evicting for a copy that is then refused), a walk that fails half
way stops the workers and leaves nothing, and the walk's stamps are the ones earlier versions recorded."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_stage_tier import entries_of, make_tree, new_tier, open_up, req, tree_digest

from slurm_tune.stage import batches, fresh
from slurm_tune.stage.errors import SourceError, TierUnavailable
from slurm_tune.stage.stager import stage
from slurm_tune.stage.tier import Tier, TierConfig


@pytest.fixture
def watched(monkeypatch):
    """Every batch start, with what the walk had listed and the ledger claimed at that moment."""
    starts: list[dict] = []
    walkers: list[fresh.Walker] = []
    real_init, real_spawn = fresh.Walker.__init__, batches.spawn

    def init(self, root):
        real_init(self, root)
        walkers.append(self)

    def spawn(argv, cwd, *args, **kwargs):
        walker = walkers[-1]
        tier_root = Path(argv[argv.index("-t") + 1]).parents[3]  # ROOT/<user>/tmp/<staging>/data
        with Tier(TierConfig(str(tier_root), None, 0.9, 0.75, "fast")) as tier:
            claimed = sum(r.bytes for r in tier.ledger() if r.state != "ready")
        names = argv[argv.index("--") + 1 :]
        starts.append(
            {
                "walk_done": walker._done,
                "walked": len(walker.files) + len(walker.links),
                "claimed": claimed,
                "bytes": sum(os.lstat(os.path.join(cwd, n)).st_size for n in names),
            }
        )
        return real_spawn(argv, cwd, *args, **kwargs)

    monkeypatch.setattr(fresh.Walker, "__init__", init)
    monkeypatch.setattr(batches, "spawn", spawn)
    return starts


def test_the_copy_starts_before_the_walk_ends_and_never_ahead_of_its_claim(shared_tmp, watched):
    tier = new_tier(open_up(shared_tmp) / "tier")
    tree = make_tree(shared_tmp / "ds", dirs=12, files=300, size=1500)
    result = stage(req(tree), tier, jobs=4)
    assert result.status == "copied" and tree_digest(result.path) == tree_digest(tree)
    assert result.files == 12 * 300 + 1
    first = watched[0]
    assert not first["walk_done"] and first["walked"] < result.files, "the first batch waited for the walk"
    started = 0
    for start in watched:
        started += start["bytes"]
        assert start["claimed"] >= started, "a batch started with bytes the ledger did not claim"
    with Tier(tier) as t:
        rows = t.ledger()
    assert [r.state for r in rows] == ["ready"] and rows[0].bytes == result.bytes


def _fill(shared_tmp: Path, root: Path, size: int) -> TierConfig:
    """A tier whose quota one unheld entry of this user already fills past the high watermark."""
    old = make_tree(shared_tmp / "old", dirs=2, files=10, size=size, seed=3)
    used = stage(req(old, "OLD"), new_tier(root, quota=10 << 30)).bytes
    return TierConfig(str(root), int(used * 1.5), 0.6, 0.3, "fast")


def test_a_tree_that_needs_an_eviction_waits_for_its_walk_then_evicts_and_is_copied(shared_tmp, watched):
    config = _fill(shared_tmp, open_up(shared_tmp) / "tier", 400_000)
    tree = make_tree(shared_tmp / "ds", dirs=6, files=100, size=1_000)  # batches want to start mid-walk
    watched.clear()
    result = stage(req(tree), config, jobs=2)
    assert result.status == "copied" and tree_digest(result.path) == tree_digest(tree)
    assert watched and all(s["walk_done"] for s in watched), "admitted whole, at the walk's end"
    keys = {name.split(".")[0] for name in entries_of(config)}
    assert len(keys) == 1, "the old entry was evicted to make room"


def test_a_tree_too_big_for_the_quota_evicts_nothing_and_copies_nothing(shared_tmp, watched):
    config = _fill(shared_tmp, open_up(shared_tmp) / "tier", 400_000)
    before = entries_of(config)
    # Over the quota (1.5x the old entry) by 1.6x, but its first directory, which the walk lists before it
    # would start a batch, is a third of the quota: only the whole is too big.
    tree = make_tree(shared_tmp / "ds", dirs=4, files=400, size=10_000)
    watched.clear()
    with pytest.raises(TierUnavailable) as info:
        stage(req(tree), config, jobs=2)
    assert info.value.kind == "over-quota" and "more than the tier's whole quota" in str(info.value)
    assert entries_of(config) == before, "nothing evicted for a copy that could never fit"
    assert watched == [], "nothing copied"
    assert list(Path(config.root, "root", "tmp").iterdir()) == []
    with Tier(config) as t:
        assert [r.state for r in t.ledger()] == ["ready"], "the refused copy's claim is gone"


def test_a_walk_that_fails_after_the_copy_started_stops_it_and_leaves_nothing(
    shared_tmp, monkeypatch, watched
):
    tier = new_tier(open_up(shared_tmp) / "tier")
    tree = make_tree(shared_tmp / "ds", dirs=12, files=300, size=1500)
    real = os.scandir

    def scandir(path):
        if str(path).endswith("class00") and watched:  # the walk's last directory, once batches run
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(fresh.os, "scandir", scandir)
    with pytest.raises(SourceError, match="class00"):
        stage(req(tree), tier, jobs=2)
    assert watched, "the copy had started"
    assert entries_of(tier) == []
    assert list(Path(tier.root, "root", "tmp").iterdir()) == []
    with Tier(tier) as t:
        assert t.ledger() == []


def test_a_tier_given_by_a_relative_path_is_copied_into(shared_tmp, monkeypatch):
    """The `cp` workers run in the source: a relative tier root must not be taken from there."""
    new_tier(open_up(shared_tmp) / "tier")
    tree = make_tree(shared_tmp / "ds", dirs=2, files=5)
    monkeypatch.chdir(shared_tmp)
    result = stage(req(tree), TierConfig("tier", 1 << 30, 0.9, 0.75, "fast"))
    assert result.status == "copied" and tree_digest(shared_tmp / result.path) == tree_digest(tree)


def _reference_digests(root: str) -> tuple[str, str]:
    """The strict stamp's and the manifest's digests as every version so far computed them: blake2b-160 over
    "<path>=<ino>:<mode octal>:<size>:<mtime_ns>:<ctime_ns>" and "<path>:<d|f|l>:<size>" per entry, each
    followed by a NUL, directories taken last-listed first, entries by name (stamps already in tiers must
    still match after an upgrade)."""
    parts, tree = fresh.blake2b(digest_size=20), fresh.blake2b(digest_size=20)
    pending = [""]
    while pending:
        rel = pending.pop()
        for name in sorted(os.listdir(os.path.join(root, rel))):
            child = f"{rel}/{name}" if rel else name
            st = os.lstat(os.path.join(root, child))
            status = f"{st.st_ino}:{st.st_mode:o}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
            parts.update(f"{child}={status}".encode() + b"\0")
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
            if kind == "d":
                pending.append(child)
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                tree.update(f"{child}:{kind}:{0 if kind == 'd' else st.st_size}".encode() + b"\0")
    return parts.hexdigest(), tree.hexdigest()


def test_the_walk_digests_are_the_ones_earlier_versions_recorded(shared_tmp):
    tree = make_tree(shared_tmp / "ds", dirs=3, files=4)
    (tree / "class01" / "deep" / "deeper").mkdir(parents=True)
    (tree / "class01" / "deep" / "deeper" / "x").write_text("x")
    os.symlink("../labels.txt", tree / "class02" / "labels")
    os.mkfifo(tree / "class00" / "pipe")  # skipped by the copy, but in the strict stamp
    plan = fresh.walk(str(tree))
    assert (plan.digest, plan.tree) == _reference_digests(str(tree))
    assert plan.skipped == ["class00/pipe"]
