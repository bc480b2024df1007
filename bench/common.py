"""Shared benchmark harness: interleaved runs of a subject and its baselines, medians and ratios."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def time_once(argv: list[str], env: dict | None = None, stdin: bytes | None = None, cwd: str | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[:4])} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def compare(name: str, commands: dict[str, "callable"], rounds: int = 30, warmup: int = 3,
            baseline: str | None = None) -> dict:
    """Run each command (a zero-argument callable returning seconds) `rounds` times, interleaved so drift in
    machine load hits every command alike. Returns and saves {command: median seconds} plus ratios."""
    for _ in range(warmup):
        for fn in commands.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(rounds):
        for key, fn in commands.items():
            samples[key].append(fn())
    medians = {k: statistics.median(v) for k, v in samples.items()}
    base = baseline or next(iter(commands))
    result = {"name": name, "rounds": rounds, "baseline": base,
              "median_s": medians,
              "ratio_to_baseline": {k: v / medians[base] for k, v in medians.items()},
              "host": os.uname().nodename, "python": sys.version.split()[0], "when": time.strftime("%F %T")}
    report(result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def report(result: dict) -> None:
    print(f"\n{result['name']}  ({result['rounds']} interleaved rounds, medians; baseline: {result['baseline']})")
    width = max(len(k) for k in result["median_s"])
    for key, med in result["median_s"].items():
        print(f"  {key:{width}s}  {med * 1000:9.2f} ms   x{result['ratio_to_baseline'][key]:.2f}")
