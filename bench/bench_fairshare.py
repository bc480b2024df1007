"""The accountant's speed (issue 23's goals), side by side with baselines measured in the same run:

1. A first read of a big sacct dump (100k, 300k, 1M rows): 1M rows through the accountant's parser
   (slurm_tune/fairshare/sacct.py) in <= 3x a plain Python str.split aggregation of the same rows, and cost
   linear in rows. The baseline, exactly: open the dump in text mode, skip the header, and for every line
   `line.split("|")`, find `billing=` in the AllocTRES field by splitting it at ',', and add billing x
   ElapsedRaw to a dict keyed by (Account, User). That is what a hand-written accountant does at the least:
   no decay, no stune summaries, no validation, no tree.
   Subjects, interleaved in each round on the same file: the baseline; tokenize only (read + splitlines +
   split every line, gc paused: Python's floor for touching every field); the sacct parser (`sacct.read_file`,
   the dump into the accountant's JobTable, every row checked); the whole offline what-if (parse, summaries,
   decay and penalty, per-association sums, Fair Tree for both charges).
2. The steady-state cycle of a site with 100k jobs a day (`--cycle`): one live `stune-fairshare apply`
   (accountant.run, ledger and all) costs <= 1 s of CPU. Every Slurm call answers with text in the captured
   formats (tests/fixtures/slurm/22.05.8) at that scale: sacct with steps for the 5 minutes since the last run
   (CYCLE_FINISHED finished jobs, each with batch, extern and one srun step, and CYCLE_RUNNING running jobs),
   `squeue -o %A|%a|%u` with CYCLE_PENDING pending jobs, `sprio` for them, the association tree of ACCOUNTS x
   USERS_PER_ACCOUNT users, the QOS list and `scontrol show config`. SiteFactor updates are batched as the
   accountant batches them (one `scontrol update` per value and 500 jobs); the answer is counted, not run.

Medians of wall time and of CPU time (process_time: the machine is shared, and CPU time is less disturbed by
other users' load than wall time). Linear cost shows as a flat us/row across sizes.

    .venv/bin/python bench/bench_fairshare.py [--rounds 5] [--sizes 100000,300000,1000000] [--cycle]
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

from slurm_tune.fairshare import (
    accountant,
    sacct,
)
from slurm_tune.fairshare.accountant import PrioritySettings
from slurm_tune.fairshare.sacct import FIELDS
from slurm_tune.slurm.adapter import Slurm
from slurm_tune.slurm.version import parse_version
from slurm_tune.usage.config import load_config

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
    users = [
        (f"acct{a:02d}", f"user{a:02d}{u:02d}") for a in range(ACCOUNTS) for u in range(USERS_PER_ACCOUNT)
    ]
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
                    per_gpu = ",".join(
                        f"gpu{job % 997:03d}/{i}:{100 * eta:.1f}:30.0:40000:250.0" for i in range(gpus)
                    )
                    comment = (
                        f"stune1 held={held:.1f} used={eta * cov * held:.1f} cov={cov * held:.1f} "
                        f"busy=0.0 busy_w=- gpus={gpus} nodes={nodes}/{nodes} per_gpu={per_gpu}"
                    )
                else:
                    comment = ""
            else:
                cpus = rng.choice((1, 2, 4, 16, 32))
                tres = f"billing={cpus},cpu={cpus},mem={cpus * 4000}M,node=1"
                comment = ""
            state, end = ("RUNNING", "Unknown") if running else ("COMPLETED", str(start + elapsed))
            fh.write(
                f"{job}|{job}|{user}|{account}|gpu|normal|{state}|{start}|{end}|{elapsed}|{tres}|{comment}\n"
            )


CYCLE_FINISHED = 350  # jobs that end in 5 minutes at 100k a day
CYCLE_RUNNING = 1000  # running jobs (a 1000-GPU cluster): sacct returns them too, charged provisionally
CYCLE_PENDING = 50_000
CYCLE_NOW = 1_795_000_000
CAPTURES = Path(__file__).resolve().parent.parent / "tests/fixtures/slurm/22.05.8"


def cycle_answers(now: int = CYCLE_NOW, seed: int = 8) -> dict[str, str]:
    """Each Slurm command the cycle runs -> its answer, in the captured formats, at the scale of the goal."""
    rng = random.Random(seed)
    users = [
        (f"acct{a:02d}", f"user{a:02d}{u:02d}") for a in range(ACCOUNTS) for u in range(USERS_PER_ACCOUNT)
    ]
    fields = [*FIELDS[:-1], "NTasks", "TRESUsageInAve", "AdminComment"]
    lines = ["|".join(fields)]
    for k in range(CYCLE_FINISHED + CYCLE_RUNNING):
        job, (account, user) = 5_000_000 + k, users[rng.randrange(len(users))]
        gpus = rng.choice((1, 2, 4, 8))
        elapsed = rng.randrange(300, 86400)
        running = k >= CYCLE_FINISHED
        end = now - rng.randrange(300) if not running else None
        start = (end if end else now) - elapsed
        tres = f"billing={gpus * 4},cpu={gpus * 8},gres/gpu={gpus},mem={gpus * 64000}M,node=1"
        eta, cov = rng.random(), 0.9
        per_gpu = ",".join(f"gpu{job % 997:03d}/{i}:{100 * eta:.1f}:30.0:40000:250.0" for i in range(gpus))
        comment = (
            ""
            if running
            else (
                f"stune1 held={gpus * elapsed:.1f} used={eta * cov * gpus * elapsed:.1f} "
                f"cov={cov * gpus * elapsed:.1f} busy=0.0 busy_w=- gpus={gpus} nodes=1/1 "
                f"per_gpu={per_gpu}"
            )
        )
        state, end_text = ("RUNNING", "Unknown") if running else ("COMPLETED", str(end))
        lines.append(
            f"{job}|{job}|{user}|{account}|gpu|normal|{state}|{start}|{end_text}|{elapsed}|{tres}|||{comment}"
        )
        if not running:
            for step, tasks, util in (("batch", 1, 100 * eta), ("extern", 1, 0), ("0", gpus, 100 * eta)):
                lines.append(
                    f"{job}.{step}|{job}.{step}||{account}|||COMPLETED|{start}|{end}|{elapsed}|"
                    f"cpu={gpus * 8},gres/gpu={gpus},mem=0,node=1|{tasks}|cpu=00:01:00,gres/gpuutil="
                    f"{util:.0f},mem=1G|"
                )
    pending, prio = [], []
    for k in range(CYCLE_PENDING):
        job, (account, user) = 6_000_000 + k, users[rng.randrange(len(users))]
        pending.append(f"{job}|{account}|{user}")
        prio.append(f"{job}|{user}|9900|0|100|{rng.randrange(10000)}|0.5|gpu")
    assoc = ["stune|root|||1||1", "stune|root|root||1||2"]
    for a in range(ACCOUNTS):
        assoc.append(f"stune|acct{a:02d}||root|1||{len(assoc) + 1}")
        assoc += [
            f"stune|acct{a:02d}|user{a:02d}{u:02d}||1||{len(assoc) + 1 + u}" for u in range(USERS_PER_ACCOUNT)
        ]
    config = (CAPTURES / "scontrol_show_config.txt").read_text()
    config = config.replace("AccountingStorageTRES   = ", "AccountingStorageTRES   = gres/gpuutil,")
    return {
        "sacct": "\n".join(lines) + "\n",
        "squeue": "\n".join(pending) + "\n",
        "sprio": "\n".join(prio) + "\n",
        "sacctmgr show assoc": "\n".join(assoc) + "\n",
        "sacctmgr show qos": "normal|1.000000\n",
        "scontrol show": config,
    }


class ReplaySlurm(Slurm):
    """The adapter with every command answered from `answers` (by its first words); updates are counted."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers, self.updates = answers, 0

    def version(self):
        return parse_version((CAPTURES / "version.txt").read_text(), ["sinfo", "--version"])

    def run(self, argv, *, input=None, timeout=None, env=None, check=True) -> str:
        self.calls.append(list(argv))
        if argv[:2] == ["scontrol", "update"]:
            self.updates += 1
            return ""
        words = [a for a in argv if not a.startswith("-")]
        for key in (" ".join(words[:3]), " ".join(words[:2]), words[0]):
            if key in self.answers:
                return self.answers[key]
        raise SystemExit(f"bench: no answer for {argv}")


def cycle(rounds: int) -> int:
    """The steady-state cycle: a first run makes the ledger (untimed), then each round restores that ledger
    and times one live run: reading sacct, squeue, sprio, charging, both trees, planning and applying."""
    work = tempfile.mkdtemp(prefix="bench-cycle-")
    cfg = os.path.join(work, "fs.yaml")
    Path(cfg).write_text(f"accountant:\n  state_dir: {work}/state\n")
    config = load_config(cfg)
    answers = cycle_answers()
    print(
        f"cycle: sacct {len(answers['sacct']) / 1e6:.1f} MB, squeue {len(answers['squeue']) / 1e6:.1f} MB, "
        f"sprio {len(answers['sprio']) / 1e6:.1f} MB",
        flush=True,
    )
    accountant.run(config, ReplaySlurm(answers), now=CYCLE_NOW - 300)
    ledger = Path(accountant.ledger_path(config))
    saved = ledger.read_bytes()
    cpu, wall, last = [], [], None
    for _ in range(rounds):
        ledger.write_bytes(saved)
        slurm = ReplaySlurm(answers)
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        last = accountant.run(config, slurm, now=CYCLE_NOW)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    result = {
        "cpu_median_s": statistics.median(cpu),
        "wall_median_s": statistics.median(wall),
        "rounds": rounds,
        "rows": last.table.n,
        "changes": len(last.changes),
        "scontrol_updates": slurm.updates,
        "load": os.getloadavg()[0],
        "when": time.strftime("%F %T"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_fairshare_cycle.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"steady-state cycle ({rounds} rounds, load {result['load']:.1f}): {result['rows']} jobs read, "
        f"{result['changes']} SiteFactor changes in {result['scontrol_updates']} scontrol updates; "
        f"CPU {result['cpu_median_s']:.2f} s (goal <= 1.0: {'OK' if result['cpu_median_s'] <= 1.0 else 'OVER'}), "
        f"wall {result['wall_median_s']:.2f} s"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--cycle", action="store_true", help="time the steady-state cycle instead")
    args = parser.parse_args()
    if args.cycle:
        return cycle(args.rounds)
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
        print(
            f"generated {n} rows ({os.path.getsize(dump) / 1e6:.0f} MB) in {time.perf_counter() - t:.1f}s",
            flush=True,
        )

        cpu: dict = {}

        def timed(name, fn, cpu=cpu):
            def run():
                wall, used = time.perf_counter(), time.process_time()
                fn()
                used = time.process_time() - used
                cpu.setdefault(name, []).append(used)
                return time.perf_counter() - wall

            return run

        def accountant_run(dump=dump, n=n):
            result = accountant.run(config, None, sacct_file=dump, plan=False, settings=settings)
            assert result.table.n == n and result.shares_stune.factors

        def sacct_parser(dump=dump, n=n):
            assert sacct.read_file(dump).n == n

        def tokenize_baseline(dump=dump, n=n):
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

        subjects = {
            BASELINE: aggregate_baseline,
            "tokenize only": tokenize_baseline,
            PARSER: sacct_parser,
            WHAT_IF: accountant_run,
        }
        results[n] = compare(
            f"bench_fairshare_{n}",
            {k: timed(k, fn) for k, fn in subjects.items()},
            rounds=args.rounds,
            warmup=1,
        )
        results[n]["cpu_median_s"] = {k: statistics.median(v[-args.rounds :]) for k, v in cpu.items()}
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
            print(
                f"  {n:>9} rows  {key:24s} {wall:6.2f} s  {1e6 * wall / n:5.2f} us/row  "
                f"x{r['ratio_to_baseline'][key]:.2f} wall, x{used / r['cpu_median_s'][BASELINE]:.2f} CPU "
                f"vs the str.split aggregation"
            )
    biggest = max(results)
    r = results[biggest]
    for key in (PARSER, WHAT_IF):
        ratio = r["ratio_to_baseline"][key]
        ratio_cpu = r["cpu_median_s"][key] / r["cpu_median_s"][BASELINE]
        goal = (
            f"goal <= 3.0: {'OK' if max(ratio, ratio_cpu) <= 3.0 else 'OVER'}" if key == PARSER else "no goal"
        )
        print(
            f"{biggest} rows, {key}: x{ratio:.2f} wall, x{ratio_cpu:.2f} CPU the str.split aggregation ({goal})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
