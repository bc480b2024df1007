"""Staging speed against the tools an admin would use by hand, interleaved in the same run.

    .venv/bin/python bench/bench_stage.py [--rounds N] [--workdir DIR] [--mkfs SIZE] [--only PART] [--before REV]

`--only cold|evict|large|warm` runs one part (cold: the quiet disk; evict: right after an eviction).
`--before REV` also times the stager of git revision REV (e.g. `main`) in the same rounds of the cold and
large copies: the before/after of a change, both run from the same launcher (`python -c`, the package
first on the path).

1. stage_cold_small: 20,000 small files (1-8 KiB, 100 directories), a cold `stune-stage fetch` into an empty
   tier vs four parallel `cp -r` (`xargs -P4`, 25 directories each), a serial `cp -r`, and `cp -r` followed
   by `sync -f`. Goal: stune at least 1.2x the speed of the 4-way parallel cp (issue 23). Twice: on a quiet
   disk (each run into a new directory), and right after deleting the previous copy
   (stage_cold_small_after_eviction), as happens in a tier that evicts.
2. stage_large_file: one 1 GiB file vs `cp` (which uses copy_file_range), the two alone. Goal: >= 1.0x cp
   (issue 23). stage_large_file_uncached_source: the same pair with the source's pages dropped from the page
   cache before each run (as a dataset on shared storage is read). stage_large_file_vs_dd: vs `dd bs=4M` to
   the same disk (and `dd conv=fsync`).
3. stage_warm_hit: `stune-stage fetch` of a 100,000-file dataset already in the tier (the whole command:
   interpreter start, profile, lock, freshness check, hold). Goal: <= 0.5 s. Baseline: `python3 -I -S -c pass`.

`--mkfs SIZE` runs everything on a new ext4 of SIZE (e.g. 12G), with its journal, made in a file under
--workdir and loop-mounted with direct I/O, as a real tier's filesystem is: an ext4 without a journal (this
VM's root) skips inodes freed in the last 30 s when it allocates (fs/ext4/ialloc.c, find_inode_bit checks
recently_deleted only when s_journal is NULL), and every create right after a large delete scans past them.

Run as root (the tier root is made with `stune-stage init`'s rules). Everything lives under --workdir, on
one filesystem, so every copy writes to the same disk. The package is byte-compiled first, as pip installs
it: an environment with PYTHONDONTWRITEBYTECODE would otherwise compile ~35 modules in every run (~60 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import BARE, bare_start, compare, cpu_once, time_once

from slurm_tune.stage import admin
from slurm_tune.stage.tier import TierConfig

STUNE_STAGE = str(Path(sys.executable).parent / "stune-stage")


def make_small_files(root: Path, count: int, dirs: int, min_size: int, max_size: int) -> Path:
    if root.exists() and sum(1 for _ in root.rglob("*")) == count + dirs:
        return root
    shutil.rmtree(root, ignore_errors=True)
    import random

    rng = random.Random(7)
    per_dir = count // dirs
    for d in range(dirs):
        sub = root / f"class{d:04d}"
        sub.mkdir(parents=True)
        for f in range(per_dir):
            (sub / f"sample{f:05d}.bin").write_bytes(os.urandom(rng.randint(min_size, max_size)))
    return root


def make_large_file(path: Path, size: int) -> Path:
    if path.exists() and path.stat().st_size == size:
        return path
    with open(path, "wb") as fh:
        chunk = os.urandom(4 << 20)
        for _ in range(size // len(chunk)):
            fh.write(chunk)
    return path


def fresh_tier(path: Path) -> TierConfig:
    shutil.rmtree(path, ignore_errors=True)
    config = TierConfig(str(path), None, 0.95, 0.80, "fast")
    admin.init(config)
    return config


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path.is_file():
        path.unlink()


def parallel_cp(src: Path, dst: Path) -> list[str]:
    """Four `cp -r` at once over the top-level entries, as an admin parallelises a copy by hand."""
    return [
        "sh",
        "-c",
        f"mkdir {dst} && find {src} -mindepth 1 -maxdepth 1 -print0 | xargs -0 -P4 -n25 cp -r -t {dst}",
    ]


def settled(cleanup):
    """cleanup, then a flush of the workdir's filesystem, both untimed: deleting the 1 GiB copy that `dd
    conv=fsync` wrote leaves ext4 a journal commit to make, and the next subject's first fsync (stune's
    stamp) paid for it, which doubled stune's time in whichever round order put it after dd."""

    def run():
        cleanup()
        os.sync()

    return run


def uncached(path: Path, subject):
    """subject, after dropping path's pages from the page cache (untimed; its own pages only)."""

    def run():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return subject()

    return run


# Runs `stune-stage` from a source tree given as the first argument, for the before/after of --before.
LAUNCH = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from slurm_tune.cli.stage import main; sys.exit(main())"
)


def stage_cmd(tier: Path, source: Path, root: Path | None = None) -> list[str]:
    """`stune-stage fetch` of source into tier: the venv's command, or (root) the package under root."""
    launcher = [STUNE_STAGE] if root is None else [sys.executable, "-c", LAUNCH, str(root)]
    return [*launcher, "fetch", "--path", str(tier), "--format", "paths", f"{source}:DS"]


def checkout(work: Path, rev: str) -> Path:
    """The package as of git revision `rev`, under work (made once, byte-compiled as pip would)."""
    root = work / ("before-" + "".join(c if c.isalnum() else "_" for c in rev))
    if not (root / "slurm_tune").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent.parent), "archive", rev, "slurm_tune"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "slurm_tune")], check=True)
    return root


def timed_then(argv: list[str], cleanup, env=None):
    """A compare() subject: time argv, then run cleanup outside the timed region."""

    def run():
        seconds = time_once(argv, env=env)
        cleanup()
        return seconds

    return run


def timed_then_after(prepare, argv: list[str], env=None):
    """A compare() subject: run prepare (untimed), then time argv."""

    def run():
        prepare()
        return time_once(argv, env=env)

    return run


@contextlib.contextmanager
def journaled_ext4(work: Path, size: str):
    """A new ext4 of `size` with its journal, in a file under work, loop-mounted (direct I/O, so its pages
    are not cached twice) at work/mnt for the duration; unmounted and deleted after."""
    image, mnt = work / "ext4.img", work / "mnt"
    image.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    device = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        mnt.mkdir(exist_ok=True)
        subprocess.run(["mount", device, str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=True)
        image.unlink()


class FreshDirs:
    """A new destination per run, all deleted at the end. Deleting a 20k-file tree between runs would bias
    the next run on an ext4 without a journal (this VM's root): it will not reuse inodes freed in the last
    30 s and scans past them, which made the copy right after a delete 5-10x slower, whichever tool it was
    (`perf`: 75 % of `cp`'s time in ext4's recently_deleted). A journaled ext4 (--mkfs) does not do this."""

    def __init__(self, base: Path, prefix: str):
        self.base, self.prefix, self.made = base, prefix, []

    def next(self, before=None) -> Path:
        """A new destination; `before(path)` (untimed) prepares it, e.g. as a fresh tier."""
        path = self.base / f"{self.prefix}-{len(self.made)}"
        drop(path)
        self.made.append(path)
        if before:
            before(path)
        return path

    def subject(self, make_argv, env=None, before=None):
        def run():
            return time_once(make_argv(self.next(before)), env=env)

        return run

    def cpu(self, make_argv, env=None, before=None, runs: int = 3) -> tuple[float, float]:
        """CPU seconds (user + system, the command and every process it waited for) and wall seconds of the
        run with the median CPU of `runs` runs, each into a new destination."""
        samples = []
        for _ in range(runs):
            argv = make_argv(self.next(before))
            start = time.perf_counter()
            seconds = cpu_once(argv, env=env)
            samples.append((seconds, time.perf_counter() - start))
        return sorted(samples)[len(samples) // 2]

    def cleanup(self):
        for path in self.made:
            drop(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default="/var/tmp/stune-bench-stage")
    parser.add_argument(
        "--mkfs",
        metavar="SIZE",
        help="run on a new journaled ext4 of SIZE (e.g. 12G), loop-mounted under --workdir, as a tier's disk",
    )
    parser.add_argument(
        "--only",
        choices=("cold", "evict", "large", "warm"),
        help="cold: the quiet disk; evict: after an eviction",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also time the stager of git revision REV (e.g. main) in the same rounds, for the cold and large "
        "copies; both it and this checkout then run from the same launcher",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_stage: run as root (the tier is set up as `stune-stage init` would)")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.mkfs:
            work = stack.enter_context(journaled_ext4(work, args.mkfs))
        return bench(args, work)


def bench(args, work: Path) -> int:
    env = dict(os.environ, STUNE_CACHE_DIR=str(work / ".profile-cache"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            str(Path(__file__).resolve().parent.parent / "slurm_tune"),
        ],
        check=True,
    )
    results = {}
    before = checkout(work, args.before) if args.before else None
    this = Path(__file__).resolve().parent.parent if before else None
    old = f"stune-stage fetch (cold, {args.before})"

    def stagers(make) -> dict:
        """The stune subjects: this checkout's, and with --before that revision's too. make(root) -> subject"""
        subjects = {"stune-stage fetch (cold)": make(this)}
        if before:
            subjects[old] = make(before)
        return subjects

    cpu: dict[str, tuple[float, float]] = {}
    if args.only in (None, "cold", "evict"):
        small = make_small_files(work / "small-20k", 20_000, 100, 1024, 8192)
    if args.only in (None, "cold"):
        dirs = FreshDirs(work, "cold")
        subprocess.run(["sync"], check=True)
        time.sleep(35)  # past ext4's recently-deleted-inode window of any earlier run (see FreshDirs)
        try:
            results["cold"] = compare(
                "stage_cold_small",
                {
                    "cp -r, 4 parallel": dirs.subject(lambda d: parallel_cp(small, d)),
                    "cp -r (serial)": dirs.subject(lambda d: ["cp", "-r", str(small), str(d)]),
                    "cp -r + sync -f": dirs.subject(
                        lambda d: ["sh", "-c", f"cp -r {small} {d} && sync -f {d}"]
                    ),
                    **stagers(
                        lambda root: dirs.subject(lambda d: stage_cmd(d, small, root), env, before=fresh_tier)
                    ),
                },
                rounds=args.rounds,
                warmup=1,
                baseline="cp -r, 4 parallel",
            )
            # On a few cores both are CPU-bound: whoever uses less CPU per file wins.
            cpu["4 parallel cp -r"] = dirs.cpu(lambda d: parallel_cp(small, d))
            cpu["stune-stage fetch"] = dirs.cpu(lambda d: stage_cmd(d, small), env, before=fresh_tier)
        finally:
            dirs.cleanup()
    if args.only in (None, "evict"):
        # A cache tier evicts as it fills, so copies often follow deletions: each run here first deletes
        # the previous run's copy (every subject alike), as an eviction would.
        dst, tier = work / "evict-cp", work / "evict-tier"
        results["cold_evict"] = compare(
            "stage_cold_small_after_eviction",
            {
                "cp -r (serial)": timed_then_after(lambda: drop(dst), ["cp", "-r", str(small), str(dst)]),
                "stune-stage fetch (cold)": timed_then_after(
                    lambda: (drop(dst), fresh_tier(tier)), stage_cmd(tier, small), env
                ),
            },
            rounds=args.rounds,
            warmup=1,
            baseline="cp -r (serial)",
        )
        drop(dst)
        drop(tier)

    if args.only in (None, "large"):
        big = make_large_file(work / "large.bin", 1 << 30)
        tier, dst = work / "tier-large", work / "dd-dst.bin"
        fresh_tier(tier)
        # The goal's pair alone: a subject that follows a 1 GiB dd pays for dd's aftermath (stune measured
        # 0.80 s right after a plain dd, 0.31 s right after cp, same run), so dd has its own comparison.
        results["large"] = compare(
            "stage_large_file",
            {
                "cp": timed_then(["cp", str(big), str(dst)], settled(lambda: drop(dst))),
                **stagers(
                    lambda root: timed_then(
                        stage_cmd(tier, big, root), settled(lambda: fresh_tier(tier)), env
                    )
                ),
            },
            rounds=args.rounds,
            warmup=1,
            baseline="cp",
        )
        # Staging reads from shared storage, not from this node's page cache: the same pair with the source's
        # pages dropped (untimed) before each run, as a dataset on Lustre or NFS is read the first time.
        results["large_uncached"] = compare(
            "stage_large_file_uncached_source",
            {
                "cp": uncached(big, timed_then(["cp", str(big), str(dst)], settled(lambda: drop(dst)))),
                **stagers(
                    lambda root: uncached(
                        big, timed_then(stage_cmd(tier, big, root), settled(lambda: fresh_tier(tier)), env)
                    )
                ),
            },
            rounds=args.rounds,
            warmup=1,
            baseline="cp",
        )
        results["large_dd"] = compare(
            "stage_large_file_vs_dd",
            {
                "dd bs=4M": timed_then(
                    ["dd", f"if={big}", f"of={dst}", "bs=4M", "status=none"], settled(lambda: drop(dst))
                ),
                "dd bs=4M conv=fsync": timed_then(
                    ["dd", f"if={big}", f"of={dst}", "bs=4M", "conv=fsync", "status=none"],
                    settled(lambda: drop(dst)),
                ),
                "stune-stage fetch (cold)": timed_then(
                    stage_cmd(tier, big), settled(lambda: fresh_tier(tier)), env
                ),
            },
            rounds=args.rounds,
            warmup=1,
            baseline="dd bs=4M",
        )
        fresh_tier(tier)

    if args.only in (None, "warm"):
        many = make_small_files(work / "small-100k", 100_000, 200, 64, 256)
        tier = work / "tier-warm"
        if not tier.exists():
            fresh_tier(tier)
        start = time.perf_counter()
        subprocess.run(stage_cmd(tier, many), env=env, check=True, stdout=subprocess.DEVNULL)
        print(f"(warm-up: first, cold staging of 100k files took {time.perf_counter() - start:.1f}s)")
        results["warm"] = compare(
            "stage_warm_hit",
            {
                BARE: bare_start(),
                "stune-stage fetch (hit, 100k files)": lambda: time_once(stage_cmd(tier, many), env=env),
            },
            rounds=max(args.rounds * 2, 10),
            warmup=2,
            baseline=BARE,
        )

    print()
    if "cold" in results:
        m = results["cold"]["median_s"]
        stune = m["stune-stage fetch (cold)"]
        print(
            f"cold 20k small files, quiet disk: {m['cp -r, 4 parallel'] / stune:.2f}x the speed of 4 parallel "
            f"cp -r (goal >= 1.2x); {m['cp -r (serial)'] / stune:.2f}x cp -r; "
            f"{m['cp -r + sync -f'] / stune:.2f}x cp -r + sync"
        )
        if before:
            print(f"  {args.before}: {m['cp -r, 4 parallel'] / m[old]:.2f}x the speed of 4 parallel cp -r")
        print(
            "  CPU seconds (user + system; the run of median CPU of 3): "
            + ", ".join(f"{name} {seconds:.2f} (in {wall:.2f} s)" for name, (seconds, wall) in cpu.items())
            + f" on {os.cpu_count()} CPUs"
        )
    if "cold_evict" in results:
        m = results["cold_evict"]["median_s"]
        print(
            f"cold 20k small files, after an eviction: "
            f"{m['cp -r (serial)'] / m['stune-stage fetch (cold)']:.2f}x the speed of cp -r"
        )
    if "large" in results:
        m = results["large"]["median_s"]
        print(f"1 GiB file: {m['cp'] / m['stune-stage fetch (cold)']:.2f}x the speed of cp (goal >= 1.0x)")
        if before:
            print(f"  {args.before}: {m['cp'] / m[old]:.2f}x")
        m = results["large_uncached"]["median_s"]
        print(f"1 GiB file, source not in the page cache: {m['cp'] / m['stune-stage fetch (cold)']:.2f}x cp")
        if before:
            print(f"  {args.before}: {m['cp'] / m[old]:.2f}x")
        m = results["large_dd"]["median_s"]
        stune = m["stune-stage fetch (cold)"]
        print(
            f"1 GiB file: {m['dd bs=4M'] / stune:.2f}x dd; {m['dd bs=4M conv=fsync'] / stune:.2f}x dd conv=fsync"
        )
    if "warm" in results:
        m = results["warm"]["median_s"]
        print(f"warm hit, 100k files: {m['stune-stage fetch (hit, 100k files)']:.3f}s (goal <= 0.5s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
