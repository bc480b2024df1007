"""stune-sbatch's own cost: `stune-sbatch --parsable` against plain `sbatch --parsable` and a bare interpreter.

Goal (issues 4 and 14): stune-sbatch minus sbatch <= 1.5x the bare `python3 -I -S -c pass` of the same
interpreter (no site import: the strictest start-up baseline), timed in the same run against the local
cluster, for both installs side by side: this checkout's editable install (.venv, compiled first) and the
wheel built from it, installed by a plain `pip install` into a fresh venv. Every process runs with
PYTHONDONTWRITEBYTECODE=1, so only bytecode the install left is used. Every submission is real (held with -H,
so nothing runs; they are cancelled afterwards) and recorded in a throw-away history, as a user's would be.

Extra rows show the paths that cost one more Slurm call: no -p (Slurm's default partition is asked for) and
a multi-node job (the partition's degraded nodes are asked for). Then the TaskProlog (goal <= 2x), both
installs.

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

from common import BARE, bare_start, compare, own_cost, time_once, wheel_install  # noqa: E402

from slurm_tune.devcluster import DevCluster  # noqa: E402


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 30
    cluster = DevCluster()
    cluster.up(install=False)
    # An editable checkout has bytecode only where something compiled it (PYTHONDONTWRITEBYTECODE below).
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sbatch-"))
    bins = {"editable": Path(sys.executable).parent, "wheel": wheel_install(tmp)}
    env = dict(os.environ, SLURM_CONF=str(cluster.layout.slurm_conf), PYTHONDONTWRITEBYTECODE="1",
               STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")))
    # One history and profile cache per install: the cache is keyed by the validating code's path.
    envs = {kind: dict(env, STUNE_HISTORY=f"{tmp}/history-{kind}.jsonl", STUNE_CACHE_DIR=f"{tmp}/cache-{kind}")
            for kind in bins}
    job = ["--parsable", "-H", "-o", "/dev/null", "-J", "bench", "--wrap", "true"]

    def stune(kind: str, *words: str):
        argv = [str(bins[kind] / "stune-sbatch"), *words, *job]
        return lambda: time_once(argv, env=envs[kind], cwd=str(tmp))

    commands = {
        BARE: bare_start(env, str(tmp)),
        "sbatch -p roce": lambda: time_once(["sbatch", "-p", "roce", *job], env=env, cwd=str(tmp)),
        "stune-sbatch -p roce (editable)": stune("editable", "-p", "roce"),
        "stune-sbatch -p roce (wheel)": stune("wheel", "-p", "roce"),
        "stune-sbatch (default partition)": stune("editable"),
        "stune-sbatch -p hdr -N 2": stune("editable", "-p", "hdr", "-N", "2"),
    }
    try:
        result = compare("sbatch", commands, rounds=rounds)
    finally:
        subprocess.run(["scancel", "-n", "bench"], env=env, check=False)
    bare = result["median_s"][BARE]
    print()
    for key in list(commands)[2:]:
        print(f"  {key:34s} - sbatch = {own_cost(result, key, 'sbatch -p roce'):4.2f}x the bare interpreter")
    for kind in bins:
        extra = own_cost(result, f"stune-sbatch -p roce ({kind})", "sbatch -p roce")
        print(f"  goal ({kind}): stune-sbatch - sbatch <= 1.5x bare start ({1.5 * bare * 1000:.2f} ms): "
              f"{'meets' if extra <= 1.5 else 'MISSES'} ({extra:.2f}x)")
    taskprolog(env, tmp, bins, rounds)
    return 0


def taskprolog(env: dict, tmp: Path, bins: dict, rounds: int) -> None:
    """The TaskProlog runs before every task: its cost on a RoCE node fixture (8 HCAs, GID tables)."""
    sys.path.insert(0, str(REPO / "tests"))
    import hwtrees

    root = tmp / "node"
    hwtrees.h100_roce(root)
    tp_env = dict(env, SLURM_JOB_PARTITION="roce", SLURMD_NODENAME="n1", SLURM_LOCALID="0",
                  STUNE_SYSFS_ROOT=str(root), SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n[1-2]")
    commands = {BARE: bare_start(tp_env, str(tmp))}
    for kind, bindir in bins.items():
        kind_env = dict(tp_env, STUNE_CACHE_DIR=f"{tmp}/cache-{kind}")
        argv = [str(bindir / "stune-task-prolog")]
        commands[f"stune-task-prolog (roce, {kind})"] = lambda a=argv, e=kind_env: time_once(a, env=e, cwd=str(tmp))
    result = compare("taskprolog", commands, rounds=rounds)
    for kind in bins:
        ratio = result["ratio_to_baseline"][f"stune-task-prolog (roce, {kind})"]
        print(f"  goal ({kind}): stune-task-prolog <= 2x bare start: {'meets' if ratio <= 2 else 'MISSES'} "
              f"({ratio:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
