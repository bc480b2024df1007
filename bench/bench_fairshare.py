"""The accountant on big sacct dumps: 100k, 300k and 1M rows. Goal (#12): 1M rows in <= 1.0x a plain Python
str.split aggregation of the same rows, measured side by side, and cost linear in rows.

Each size runs the whole what-if path in-process (parse the `sacct -P` text, validate and join the stune
summaries, drop unreadable and duplicate rows, charge with decay and penalty, sum per association, Fair Tree
for both charges) interleaved with two baselines on the same text: a plain str.split aggregation (split
every line, sum billing x elapsed per account and user in a dict: what a hand-written accountant does,
without decay, summaries or a tree) and Python's bare minimum for touching every field (splitlines + split).
Reports medians, the ratio to the baselines, and microseconds per row (linear cost means a flat us/row).

    .venv/bin/python bench/bench_fairshare.py [--rounds 5] [--sizes 100000,300000,1000000]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import compare  # noqa: E402

from slurm_tune.fairshare import accountant  # noqa: E402
from slurm_tune.fairshare.accountant import PrioritySettings  # noqa: E402
from slurm_tune.usage.config import load_config  # noqa: E402
from slurm_tune.fairshare.sacct import FIELDS  # noqa: E402

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
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100000,300000,1000000")
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

        def accountant_run(dump=dump):
            start = time.perf_counter()
            result = accountant.run(config, None, sacct_file=dump, plan=False, settings=settings)
            elapsed = time.perf_counter() - start
            assert result.table.n == n and result.shares_stune.factors
            return elapsed

        def tokenize_baseline(dump=dump):
            gc.disable()  # as the parser does: the fastest Python can touch every field
            start = time.perf_counter()
            with open(dump) as fh:
                rows = [line.split("|") for line in fh.read().splitlines()]
            elapsed = time.perf_counter() - start
            gc.enable()
            assert len(rows) == n + 1
            return elapsed

        def aggregate_baseline(dump=dump):
            start = time.perf_counter()
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
            elapsed = time.perf_counter() - start
            assert usage
            return elapsed

        results[n] = compare(f"bench_fairshare_{n}", {"str.split aggregation (baseline)": aggregate_baseline,
                                                      "tokenize only": tokenize_baseline,
                                                      "stune-fairshare what-if": accountant_run},
                             rounds=args.rounds, warmup=1)
        os.unlink(dump)
    print("\nper-row cost (linear = flat):")
    for n, r in results.items():
        med = r["median_s"]["stune-fairshare what-if"]
        print(f"  {n:>9} rows  {med:6.2f} s  {1e6 * med / n:6.2f} us/row  x{r['ratio_to_baseline']['stune-fairshare what-if']:.1f} "
              f"vs the str.split aggregation")
    biggest = max(results)
    ratio = results[biggest]["ratio_to_baseline"]["stune-fairshare what-if"]
    print(f"\n{biggest} rows: x{ratio:.2f} the str.split aggregation (goal <= 1.0): "
          f"{'OK' if ratio <= 1.0 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
