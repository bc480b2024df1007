"""Submission throughput: 100 submissions from 4 parallel shells, `stune-sbatch` against plain `sbatch`.

What a user who loops over `stune-sbatch` in a few shells gets, on the local cluster: each round runs
4 workers, each submitting 25 held jobs (-H, cancelled afterwards) one after another, first with plain
`sbatch --parsable`, then with `stune-sbatch --parsable -p roce` (this checkout's install, one shared
history file as one user's shells share it); rounds alternate the order. Reports submissions per second
(100 / wall time of the round), medians over the rounds, and checks that the history holds one whole record
per stune submission (the appends queue on an flock: none is torn or lost).

    .venv/bin/python bench/bench_submit_rate.py [--rounds N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stune_dev.devcluster import DevCluster

SUBMISSIONS, SHELLS = 100, 4
NAME = "bench-rate"


def one_round(argv: list[str], env: dict) -> float:
    """Submissions per second for SUBMISSIONS jobs from SHELLS workers."""
    per_shell = SUBMISSIONS // SHELLS

    def shell(_: int) -> None:
        for _ in range(per_shell):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()}")

    start = time.monotonic()
    with ThreadPoolExecutor(SHELLS) as pool:
        list(pool.map(shell, range(SHELLS)))
    return per_shell * SHELLS / (time.monotonic() - start)


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    cluster = DevCluster()
    cluster.up(install=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rate-"))
    history = tmp / "history.jsonl"
    env = dict(
        os.environ,
        SLURM_CONF=str(cluster.layout.slurm_conf),
        STUNE_HISTORY=str(history),
        STUNE_CACHE_DIR=str(tmp / "cache"),
        STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
    )
    job = ["--parsable", "-H", "-o", "/dev/null", "-J", NAME, "-p", "roce", "--wrap", "true"]
    commands = {
        "sbatch": ["sbatch", *job],
        "stune-sbatch": [str(Path(sys.executable).parent / "stune-sbatch"), *job],
    }
    rates: dict[str, list[float]] = {k: [] for k in commands}
    try:
        subprocess.run(commands["stune-sbatch"], env=env, check=True, capture_output=True)  # warm the caches
        for r in range(rounds):
            for key in list(commands) if r % 2 == 0 else list(reversed(commands)):
                rates[key].append(one_round(commands[key], env))
                subprocess.run(["scancel", "-n", NAME], env=env, check=False)
    finally:
        subprocess.run(["scancel", "-n", NAME], env=env, check=False)
    lines = history.read_text().splitlines()
    whole = sum(1 for line in lines if isinstance(json.loads(line), dict))
    expected = 1 + rounds * SUBMISSIONS
    result = {
        "submissions": SUBMISSIONS,
        "shells": SHELLS,
        "rounds": rounds,
        "per_second": {k: statistics.median(v) for k, v in rates.items()},
        "all": rates,
        "history_records": whole,
        "history_expected": expected,
        "load": os.getloadavg()[0],
    }
    for key, values in rates.items():
        print(
            f"{key:14s} {statistics.median(values):7.1f} submissions/s (rounds: "
            f"{', '.join(f'{v:.1f}' for v in values)})"
        )
    print(f"history: {whole} whole records of {expected} submissions; load {result['load']:.1f}")
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_submit_rate.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if whole == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
