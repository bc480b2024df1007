"""Parsing a steps file (slurm_tune/usage/steps.py) in the epilog: MB/s, against a plain `str.split` loop.

The epilog hands parse() a bounded head and tail of the job's `$STUNE_STEPS_FILE` (the cap is the
integrator's). The subjects run interleaved in each round on the same bytes:

- baseline: decode the bytes and split every line at ',' (Python's floor for touching every line);
- parse: steps.parse() over the same bytes (JSON per line, checks, warm-up split, percentiles);
- parse, garbage: the same size of random bytes (every line bad: the cost of a hostile file);
- parse, 1/3 bad lines: a file with every third line cut.

It prints the medians, each ratio to the baseline and parse's MB/s, and checks that parse is linear: the
time per MB at 4x the size is within 1.5x of the time per MB at 1x (median of the rounds).

    .venv/bin/python bench/bench_steps.py [--rounds N] [--mb MB]
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import compare

from slurm_tune.usage import steps


def steps_file(mb: float, seed: int = 1) -> bytes:
    """A steps file as the docs' snippet writes it, about `mb` MB: 1024 samples a step, ~0.5 s steps."""
    rng = random.Random(seed)
    out, size, step = [], 0, 0
    while size < mb * 1e6:
        step_s = rng.uniform(0.45, 0.6)
        line = json.dumps(
            {"step": step, "samples": 1024, "step_s": step_s, "data_s": step_s * rng.uniform(0.01, 0.3)}
        )
        out.append(line)
        size += len(line) + 1
        step += 1
    return ("\n".join(out) + "\n").encode()


def timed(fn, data: bytes):
    def run() -> float:
        t = time.perf_counter()
        fn(data)
        return time.perf_counter() - t

    return run


def split_loop(data: bytes) -> None:
    for line in data.decode("utf-8", "replace").split("\n"):
        line.split(",")


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 15
    mb = float(sys.argv[sys.argv.index("--mb") + 1]) if "--mb" in sys.argv else 4.0
    good = steps_file(mb)
    rng = random.Random(2)
    garbage = bytes(rng.randrange(256) for _ in range(len(good)))
    lines = good.split(b"\n")
    third_bad = b"\n".join(line[: len(line) // 2] if k % 3 == 0 else line for k, line in enumerate(lines))
    big = steps_file(4 * mb, seed=3)
    stats = steps.parse(good)
    assert stats.bad == 0 and stats.steps + stats.warmup == len(lines) - 1, stats
    assert steps.parse(garbage).steps == 0
    baseline = f"str.split loop ({len(good) / 1e6:.1f} MB)"
    result = compare(
        "steps-parse",
        {
            baseline: timed(split_loop, good),
            "parse": timed(steps.parse, good),
            "parse, random bytes": timed(steps.parse, garbage),
            "parse, 1/3 lines cut": timed(steps.parse, third_bad),
            f"parse, {4 * mb:g} MB": timed(steps.parse, big),
        },
        rounds=rounds,
        warmup=1,
        baseline=baseline,
    )
    med = result["median_s"]
    per_mb_1 = med["parse"] / (len(good) / 1e6)
    per_mb_4 = med[f"parse, {4 * mb:g} MB"] / (len(big) / 1e6)
    print(
        f"\nparse: {len(good) / 1e6 / med['parse']:.0f} MB/s ({stats.steps + stats.warmup} steps), "
        f"x{result['ratio_to_baseline']['parse']:.2f} the str.split loop "
        f"({len(good) / 1e6 / med[baseline]:.0f} MB/s); at 4x the size {per_mb_4 / per_mb_1:.2f}x the time per MB"
    )
    if per_mb_4 > 1.5 * per_mb_1:
        print("FAIL: parse is not linear in its input")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
