"""The accountant on big sacct dumps: 100k, 300k and 1M rows. Goal (#12): 1M rows through the accountant's
parser (slurm_tune/fairshare/sacct.py) in <= 1.0x a plain Python str.split aggregation of the same rows,
measured side by side, and cost linear in rows.

The baseline, exactly: open the dump in text mode, skip the header, and for every line `line.split("|")`, find
`billing=` in the AllocTRES field by splitting it at ',', and add billing x ElapsedRaw to a dict keyed by
(Account, User). That is what a hand-written accountant does at the least: no decay, no stune summaries, no
validation, no tree.

Subjects, interleaved in each round on the same file:
- str.split aggregation (baseline), as above;
- tokenize only: read + splitlines + split every line (gc paused): Python's floor for touching every field;
- sacct parser: `sacct.read_file`, the dump into the accountant's JobTable (the byte-level fast path);
- general parser: the same dump through the general parser (`sacct._parse_text`, the path before #12, kept as
  the reference the fast path must match and for dumps the fast path declines);
- stune-fairshare what-if: the whole offline run (parse, summaries, decay and penalty, per-association sums,
  Fair Tree for both charges).

Medians of wall time and of CPU time (process_time: the machine is shared, and CPU time is less disturbed by
other users' load than wall time). Linear cost shows as a flat us/row across sizes.

    .venv/bin/python bench/bench_fairshare.py [--rounds 5] [--sizes 100000,300000,1000000]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import RESULTS, compare  # noqa: E402

from slurm_tune.fairshare import accountant  # noqa: E402
from slurm_tune.fairshare.accountant import PrioritySettings  # noqa: E402
from slurm_tune.fairshare import sacct  # noqa: E402
from slurm_tune.usage.config import load_config  # noqa: E402
from slurm_tune.fairshare.sacct import FIELDS  # noqa: E402
from slurm_tune.fairshare.heap import keep_freed_memory  # noqa: E402

BASELINE = "str.split aggregation (baseline)"
PARSER = "sacct parser"
WHAT_IF = "stune-fairshare what-if"
ACCOUNTS = 60
USERS_PER_ACCOUNT = 12


def synth_dump(path: str, rows: int, seed: int = 6) -> None:
    """A realistic month of a 1000-GPU cluster: 70 % GPU jobs, most with a stune summary, some running,
    a few requeued, AllocTRES in the handful of shapes real partitions produce."""
    rng = random.Random(seed)
    shapes = [("billing={b},cpu={c},gres/gpu={g},mem={m}M,node={n}", g) for g in (1, 2, 4, 8)]
    users = [(f"acct{a:02d}", f"user{a:02d}{u:02d}") for a in range(ACCOUNTS) for u in range(USERS_PER_ACCOUNT)]
    t0 = 1_790_000_000
    with open(path, "w") as fh:
        fh.write("|".join(FIELDS) + "\n")
        for job in range(1, rows + 1):
            account, user = users[rng.randrange(len(users))]
            start = t0 + rng.randrange(30 * 86400)
            elapsed = rng.randrange(60, 2 * 86400)
            running = rng.random() < 0.02
            if rng.random() < 0.7:
                fmt, gpus = shapes[rng.randrange(len(shapes))]
                nodes = max(1, gpus // 8)
                tres = fmt.format(b=gpus * 4, c=gpus * 8, g=gpus, m=gpus * 64000, n=nodes)
                held = gpus * elapsed
                if rng.random() < 0.85 and not running:
                    eta, cov = rng.random(), 0.5 + 0.5 * rng.random()
                    per_gpu = ",".join(f"gpu{job % 997:03d}/{i}:{100 * eta:.1f}:30.0:40000:250.0" for i in range(gpus))
                    comment = (f"stune1 held={held:.1f} used={eta * cov * held:.1f} cov={cov * held:.1f} "
                               f"busy=0.0 busy_w=- gpus={gpus} nodes={nodes}/{nodes} per_gpu={per_gpu}")
                else:
                    comment = ""
            else:
                cpus = rng.choice((1, 2, 4, 16, 32))
                tres = f"billing={cpus},cpu={cpus},mem={cpus * 4000}M,node=1"
                comment = ""
            state, end = ("RUNNING", "Unknown") if running else ("COMPLETED", str(start + elapsed))
            fh.write(f"{job}|{job}|{user}|{account}|gpu|normal|{state}|{start}|{end}|{elapsed}|{tres}|{comment}\n")


def main() -> int:
    # this process's malloc set as stune-fairshare sets its own (fairshare/heap.py); the baseline runs in it too
    keep_freed_memory()
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--no-general", action="store_true", help="skip the general parser (saves time)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="bench-fairshare-")
    cfg = os.path.join(work, "fs.yaml")
    Path(cfg).write_text(f"accountant:\n  state_dir: {work}/state\n")
    config = load_config(cfg)
    settings = PrioritySettings(weight_fairshare=10000)
    results = {}
    for n in sizes:
        dump = os.path.join(work, f"sacct-{n}.txt")
        t = time.perf_counter()
        synth_dump(dump, n)
        print(f"generated {n} rows ({os.path.getsize(dump) / 1e6:.0f} MB) in {time.perf_counter() - t:.1f}s",
              flush=True)

        cpu: dict = {}

        def timed(name, fn):
            def run():
                wall, used = time.perf_counter(), time.process_time()
                fn()
                used = time.process_time() - used
                cpu.setdefault(name, []).append(used)
                return time.perf_counter() - wall
            return run

        def accountant_run(dump=dump):
            result = accountant.run(config, None, sacct_file=dump, plan=False, settings=settings)
            assert result.table.n == n and result.shares_stune.factors

        def sacct_parser(dump=dump):
            assert sacct.read_file(dump).n == n

        def general_parser(dump=dump):
            with open(dump, encoding="utf-8", errors="replace") as fh:
                assert sacct._parse_text(fh.read(), dump).n == n

        def tokenize_baseline(dump=dump):
            gc.disable()  # as the parser does: the fastest Python can touch every field
            try:
                with open(dump) as fh:
                    rows = [line.split("|") for line in fh.read().splitlines()]
            finally:
                gc.enable()
            assert len(rows) == n + 1

        def aggregate_baseline(dump=dump):
            usage: dict = {}
            with open(dump) as fh:
                next(fh)
                for line in fh:
                    cols = line.split("|")
                    billing = 0.0
                    for item in cols[10].split(","):
                        if item.startswith("billing="):
                            billing = float(item[8:])
                    key = (cols[3], cols[2])
                    usage[key] = usage.get(key, 0.0) + billing * int(cols[9])
            assert usage

        subjects = {BASELINE: aggregate_baseline, "tokenize only": tokenize_baseline, PARSER: sacct_parser,
                    "general parser (before #12)": general_parser, WHAT_IF: accountant_run}
        if args.no_general:
            del subjects["general parser (before #12)"]
        results[n] = compare(f"bench_fairshare_{n}", {k: timed(k, fn) for k, fn in subjects.items()},
                             rounds=args.rounds, warmup=1)
        results[n]["cpu_median_s"] = {k: statistics.median(v[-args.rounds:]) for k, v in cpu.items()}
        base = results[n]["cpu_median_s"][BASELINE]
        (RESULTS / f"bench_fairshare_{n}.json").write_text(json.dumps(results[n], indent=2) + "\n")
        print("  CPU time (process_time), medians:")
        for key, med in results[n]["cpu_median_s"].items():
            print(f"  {key:34s}  {med * 1000:9.2f} ms   x{med / base:.2f}")
        os.unlink(dump)
    print("\nper-row cost (linear = flat), wall / CPU:")
    for n, r in results.items():
        for key in (PARSER, WHAT_IF):
            wall, used = r["median_s"][key], r["cpu_median_s"][key]
            print(f"  {n:>9} rows  {key:24s} {wall:6.2f} s  {1e6 * wall / n:5.2f} us/row  "
                  f"x{r['ratio_to_baseline'][key]:.2f} wall, x{used / r['cpu_median_s'][BASELINE]:.2f} CPU "
                  f"vs the str.split aggregation")
    biggest = max(results)
    r = results[biggest]
    for key in (PARSER, WHAT_IF):
        ratio = r["ratio_to_baseline"][key]
        ratio_cpu = r["cpu_median_s"][key] / r["cpu_median_s"][BASELINE]
        print(f"{biggest} rows, {key}: x{ratio:.2f} wall, x{ratio_cpu:.2f} CPU the str.split aggregation "
              f"(goal <= 1.0): {'OK' if max(ratio, ratio_cpu) <= 1.0 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
