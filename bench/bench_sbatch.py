"""stune-sbatch's own cost: `stune-sbatch --parsable` against plain `sbatch --parsable` and a bare interpreter.

Goal (issue 4): stune-sbatch minus sbatch <= 1.5x the bare `python3 -I -S -c pass` of the same interpreter
(no site import: the strictest start-up baseline; `python -c pass` is shown too), timed in
the same run against the local cluster. Every submission is real (held with -H, so nothing runs; they are
cancelled afterwards) and recorded in a throw-away history, as a user's would be.

Extra rows show the paths that cost one more Slurm call: no -p (Slurm's default partition is asked for) and
a multi-node job (the partition's degraded nodes are asked for).

    .venv/bin/python bench/bench_sbatch.py [--rounds N]
"""
from __future__ import annotations

import compileall
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import compare, time_once  # noqa: E402

from stune_dev.devcluster import DevCluster  # noqa: E402


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 30
    cluster = DevCluster()
    cluster.up(install=False)
    # An installed package ships bytecode; this checkout may run with PYTHONDONTWRITEBYTECODE.
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    bindir = os.path.dirname(sys.executable)
    tmp = tempfile.mkdtemp(prefix="bench-sbatch-")
    env = dict(os.environ, SLURM_CONF=str(cluster.layout.slurm_conf), STUNE_HISTORY=f"{tmp}/history.jsonl",
               STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
               STUNE_CACHE_DIR=os.environ.get("STUNE_CACHE_DIR", f"{tmp}/cache"))
    job = ["--parsable", "-H", "-o", "/dev/null", "-J", "bench", "--wrap", "true"]
    stune = os.path.join(bindir, "stune-sbatch")
    commands = {
        "python3 -I -S -c pass": lambda: time_once([sys.executable, "-I", "-S", "-c", "pass"], env=env, cwd=tmp),
        "python -c pass": lambda: time_once([sys.executable, "-c", "pass"], env=env, cwd=tmp),
        "sbatch -p roce": lambda: time_once(["sbatch", "-p", "roce", *job], env=env, cwd=tmp),
        "stune-sbatch -p roce": lambda: time_once([stune, "-p", "roce", *job], env=env, cwd=tmp),
        "stune-sbatch (default partition)": lambda: time_once([stune, *job], env=env, cwd=tmp),
        "stune-sbatch -p hdr -N 2": lambda: time_once([stune, "-p", "hdr", "-N", "2", *job], env=env, cwd=tmp),
    }
    try:
        result = compare("sbatch", commands, rounds=rounds, baseline="python3 -I -S -c pass")
    finally:
        subprocess.run(["scancel", "-n", "bench"], env=env, check=False)
    med = result["median_s"]
    bare = med["python3 -I -S -c pass"]
    print()
    for key in ("stune-sbatch -p roce", "stune-sbatch (default partition)", "stune-sbatch -p hdr -N 2"):
        extra = med[key] - med["sbatch -p roce"]
        print(f"  {key:34s} - sbatch = {extra * 1000:6.2f} ms = {extra / bare:4.2f}x the bare interpreter")
    extra = med["stune-sbatch -p roce"] - med["sbatch -p roce"]
    verdict = "meets" if extra <= 1.5 * bare else "MISSES"
    print(f"\n  goal: stune-sbatch - sbatch <= 1.5x bare start ({1.5 * bare * 1000:.2f} ms): {verdict}")
    taskprolog(env, tmp, rounds)
    return 0


def taskprolog(env: dict, tmp: str, rounds: int) -> None:
    """The TaskProlog runs before every task: its cost on a RoCE node fixture (8 HCAs, GID tables)."""
    sys.path.insert(0, str(REPO / "tests"))
    import hwtrees

    root = Path(tmp) / "node"
    hwtrees.h100_roce(root)
    tp_env = dict(env, SLURM_JOB_PARTITION="roce", SLURMD_NODENAME="n1", SLURM_LOCALID="0",
                  STUNE_SYSFS_ROOT=str(root), SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n[1-2]")
    prolog = os.path.join(os.path.dirname(sys.executable), "stune-task-prolog")
    compare("taskprolog", {
        "python3 -I -S -c pass": lambda: time_once([sys.executable, "-I", "-S", "-c", "pass"], env=tp_env, cwd=tmp),
        "stune-task-prolog (roce)": lambda: time_once([prolog], env=tp_env, cwd=tmp),
    }, rounds=rounds, baseline="python3 -I -S -c pass")


if __name__ == "__main__":
    sys.exit(main())
