"""A year of a 1000-node site's sacct rows through the reliability package, side by side with a plain str.split
loop over the same dump (issue 25, §4 and §6: "read in reasonable time").

The dump: `sacct -a -X -D -P` in history.FIELDS' layout, ROWS_PER_DAY x 365 rows over 1000 nodes `gpu[0001-1000]`,
60 % single-node jobs, the rest on 2-64 nodes in contiguous blocks (NodeList as Slurm compresses it); states
in a real site's mix (COMPLETED most, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, a requeued run after most
NODE_FAILs); most GPU jobs with stune's usage summary in AdminComment, multi-node ones with the transport
verdict tokens (`comm=`, `commn=`) as EpilogSlurmctld stores them.

Subjects, interleaved in each round on the same file:
- the baseline, a plain str.split loop: open the dump in text mode, skip the header, `line.split("|")` every
  line, and add NNodes x ElapsedRaw to a dict by Partition, counting the rows whose State is not COMPLETED:
  what a hand-written reliability count does at the least (no validation, no causes, no months);
- the reader (`history.read_file`: the dump into Runs, every row checked);
- the report (`stune-health reliability` without events: read, classify, build);
- the lemon test over the whole year for the partition (read, classify, score): the default reads 30 days.

Medians of wall and CPU time (process_time) over the rounds.

    .venv/bin/python bench/bench_reliability.py [--rounds 3] [--rows-per-day 3000]
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

from common import RESULTS, compare

from slurm_tune.hostlist import compress_hostlist
from slurm_tune.reliability import causes, history, lemons, report

BASELINE = "str.split loop (baseline)"
READER = "reader (history.read_file)"
REPORT = "stune-health reliability"
LEMONS = "stune-health lemons (a year)"
NODES = 1000
T0 = 1_760_000_000
STATES = [
    ("COMPLETED", 0.80),
    ("FAILED", 0.08),
    ("CANCELLED by 1001", 0.07),
    ("TIMEOUT", 0.03),
    ("NODE_FAIL", 0.02),
]


def synth_dump(path: str, per_day: int, seed: int = 25) -> int:
    rng = random.Random(seed)
    names = [f"gpu{i:04d}" for i in range(1, NODES + 1)]
    weights = [w for _, w in STATES]
    ok = "c1;ok;x:ib;g:1;l:NCCL;v:2.21.5;w:IB;t:IB~48~48~48~48;k:8;ln:412;nl:398"
    bad = "c1;errors;f:errors;x:ib;g:1;l:NCCL;v:2.21.5;w:IB;e:completion~4;k:8;ln:520;nl:470"
    rows = 0
    with open(path, "w") as fh:
        fh.write("|".join(history.FIELDS) + "\n")
        for job in range(1, per_day * 365 + 1):
            start = T0 + job * 86400 // per_day + rng.randrange(3600)
            elapsed = rng.randrange(60, 24 * 3600)
            k = 1 if rng.random() < 0.6 else rng.choice((2, 2, 4, 4, 8, 8, 16, 32, 64))
            first = rng.randrange(NODES - k + 1)
            hosts = compress_hostlist(names[first : first + k])
            state = rng.choices(STATES, weights)[0][0]
            gpus = 8 * k
            comment = (
                f"stune1 held={gpus * elapsed:.1f} used={gpus * elapsed * 0.6:.1f} cov={gpus * elapsed * 0.9:.1f} "
                f"busy=0.0 busy_w=- gpus={gpus} nodes={k}/{k} per_gpu="
                + ",".join(f"{names[first]}/{i}:61.2:30.0:40000:250.0" for i in range(min(gpus, 8)))
            )
            if k > 1:
                verdict = bad if state == "FAILED" and rng.random() < 0.3 else ok
                comment += f" comm={'|'.join(f'{n}@{verdict}' for n in names[first : first + min(k, 4)])} commn={k}/{k}/0"
            tres = f"billing={gpus},cpu={64 * k},gres/gpu={gpus},mem={512000 * k}M,node={k}"
            row = f"{job}|{job}|user{job % 300}|p{job % 4}|{state}|{start}|{start + elapsed}|{elapsed}|{k}|{tres}|{hosts}|{comment}\n"
            fh.write(row)
            rows += 1
            if state == "NODE_FAIL" and rng.random() < 0.8:
                again = start + elapsed + rng.randrange(60, 1800)
                fh.write(
                    f"{job}|{job}|user{job % 300}|p{job % 4}|COMPLETED|{again}|{again + elapsed}|{elapsed}|{k}|"
                    f"{tres}|{hosts}|\n"
                )
                rows += 1
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows-per-day", type=int, default=3000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-reliability-")
    dump = os.path.join(work, "sacct.txt")
    t = time.perf_counter()
    rows = synth_dump(dump, args.rows_per_day)
    size = os.path.getsize(dump)
    print(f"generated {rows} rows ({size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f}s", flush=True)
    cpu: dict = {}

    def timed(name, fn):
        def run():
            gc.collect()
            wall, used = time.perf_counter(), time.process_time()
            fn()
            cpu.setdefault(name, []).append(time.process_time() - used)
            return time.perf_counter() - wall

        return run

    def baseline():
        held: dict = {}
        broken = 0
        with open(dump) as fh:
            next(fh)
            for line in fh:
                cols = line.split("|")
                held[cols[3]] = held.get(cols[3], 0) + int(cols[8]) * int(cols[7])
                broken += cols[4] != "COMPLETED"
        assert len(held) == 4 and broken

    def reader():
        assert history.read_file(dump).n == rows

    def reliability():
        runs = history.read_file(dump)
        rep = report.build(runs, causes.classify(runs), T0, runs.as_of)
        assert rep.runs == rows and rep.interruptions

    def lemon_year():
        runs = history.read_file(dump)
        found = causes.classify(runs)
        scored = lemons.score(runs, found, "p1", T0, runs.as_of, lemons.Policy())
        assert scored.nodes == NODES and not scored.lemons

    subjects = {BASELINE: baseline, READER: reader, REPORT: reliability, LEMONS: lemon_year}
    result = compare(
        "bench_reliability", {k: timed(k, fn) for k, fn in subjects.items()}, rounds=args.rounds, warmup=1
    )
    result["rows"], result["bytes"] = rows, size
    result["cpu_median_s"] = {k: statistics.median(v[-args.rounds :]) for k, v in cpu.items()}
    base = result["cpu_median_s"][BASELINE]
    print("  CPU time (process_time), medians:")
    for key, med in result["cpu_median_s"].items():
        print(f"  {key:30s}  {med:7.2f} s   x{med / base:.2f}   {1e6 * med / rows:5.2f} us/row")
    (RESULTS / "bench_reliability.json").write_text(json.dumps(result, indent=2) + "\n")
    os.unlink(dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
