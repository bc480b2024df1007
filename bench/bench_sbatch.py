"""stune-sbatch's own cost: `stune-sbatch --parsable` against plain `sbatch --parsable` and a bare interpreter.

Goal (issue 23; 1.5x before it): stune-sbatch minus sbatch <= 2x the bare `python3 -I -S -c pass` of the same
interpreter (no site import: the strictest start-up baseline), timed in the same run against the local
cluster, for the installs side by side: this checkout's editable install (.venv, compiled first) and the
wheel built from it, installed by a plain `pip install` into a fresh venv as README installs it (setuptools
removed), and into one that keeps setuptools (a Python 3.11 venv's default); the wheel also as a test user
submits (the bench runs as root, who alone pays the trust checks of what it loads); with `--before REV`, the
wheel of that revision too (e.g. `main`), in the same rounds: the before/after of a change. Every process runs
with PYTHONDONTWRITEBYTECODE=1, so only bytecode the install left is used. Every submission is real (held with
-H, so nothing runs; they are cancelled afterwards) and recorded in a throw-away history, as a user's would be.

Extra rows show the paths that cost one more Slurm call: no -p (Slurm's default partition is asked for) and
a multi-node job (the partition's degraded nodes are asked for); a submission from an environment that holds
tokens (the history records their digests: no hashlib import); where the time goes in the wheel install:
the interpreter with `site` (what the launcher starts), the same plus importing what a submission imports,
pip 23's own console-script launcher (it imports re) in place of ours. The
same table again in CPU time (user + system of the child, sbatch's included), which other load distorts
less. Then the TaskProlog (goal <= 2x), each install.

    .venv/bin/python bench/bench_sbatch.py [--rounds N] [--before REV]
"""

from __future__ import annotations

import compileall
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_health import before_install, option
from common import BARE, compare, cpu_once, own_cost, time_once, wheel_install

from stune_dev.devcluster import DevCluster

USER = "stune-alice"  # a test user of the dev cluster (its accounting knows her)


def main() -> int:
    rounds = int(option("--rounds", "30"))
    before = option("--before")
    cluster = DevCluster()
    cluster.up(install=False)
    # An editable checkout has bytecode only where something compiled it (PYTHONDONTWRITEBYTECODE below).
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sbatch-"))
    bins = {
        "editable": Path(sys.executable).parent,
        "wheel": wheel_install(tmp),
        "wheel, setuptools": wheel_install(tmp, keep_setuptools=True),
    }
    if before:
        bins[f"wheel, {before}"] = before_install(tmp, before)
    env = dict(
        os.environ,
        SLURM_CONF=str(cluster.layout.slurm_conf),
        PYTHONDONTWRITEBYTECODE="1",
        STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
    )
    # One history and profile cache per install: the cache is keyed by the validating code's path.
    envs = {
        kind: dict(env, STUNE_HISTORY=f"{tmp}/history-{kind}.jsonl", STUNE_CACHE_DIR=f"{tmp}/cache-{kind}")
        for kind in bins
    }
    # Users submit, not root: the same wheel run by a test user (root's trust checks of the files it loads are
    # root's alone), beside plain sbatch run by the same user. Its history and caches are the user's own.
    user_dir = tmp / "user"
    user_dir.mkdir()
    tmp.chmod(0o755)
    os.chown(user_dir, pwd.getpwnam(USER).pw_uid, -1)
    envs["user"] = dict(
        env,
        HOME=str(user_dir),
        STUNE_HISTORY=f"{user_dir}/history.jsonl",
        STUNE_CACHE_DIR=f"{user_dir}/cache",
    )
    job = ["--parsable", "-H", "-o", "/dev/null", "-J", "bench", "--wrap", "true"]

    wheel_py = str(bins["wheel"] / "python")
    # pip 23's console-script launcher, as `pip install` wrote it for every command before issue 14
    pip_launcher = bins["wheel"] / "stune-sbatch-pip-launcher"
    pip_launcher.write_text(
        f"#!{wheel_py}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        "from slurm_tune.cli.sbatch import main\nif __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n"
    )
    pip_launcher.chmod(0o755)
    imports = (
        "from slurm_tune.cli import sbatch; from slurm_tune.sbatch import submit, plan, history; "
        "from slurm_tune import slurm, profilestore, stage"
    )
    argvs = {
        BARE: [wheel_py, "-I", "-S", "-c", "pass"],
        "sbatch -p roce": ["sbatch", "-p", "roce", *job],
        "stune-sbatch -p roce (editable)": [str(bins["editable"] / "stune-sbatch"), "-p", "roce", *job],
        "stune-sbatch -p roce (wheel)": [str(bins["wheel"] / "stune-sbatch"), "-p", "roce", *job],
        "stune-sbatch -p roce (wheel, setuptools)": [
            str(bins["wheel, setuptools"] / "stune-sbatch"),
            "-p",
            "roce",
            *job,
        ],
        f"sbatch -p roce ({USER})": ["sbatch", "-p", "roce", *job],
        f"stune-sbatch -p roce (wheel, {USER})": [str(bins["wheel"] / "stune-sbatch"), "-p", "roce", *job],
        "stune-sbatch (default partition)": [str(bins["editable"] / "stune-sbatch"), *job],
        "stune-sbatch -p hdr -N 2": [str(bins["editable"] / "stune-sbatch"), "-p", "hdr", "-N", "2", *job],
        "stune-sbatch, pip's launcher (wheel)": [str(pip_launcher), "-p", "roce", *job],
        "stune-sbatch -p roce, a token in the env (wheel)": [
            str(bins["wheel"] / "stune-sbatch"),
            "-p",
            "roce",
            *job,
        ],
        **(
            {
                f"stune-sbatch -p roce (wheel, {before})": [
                    str(bins[f"wheel, {before}"] / "stune-sbatch"),
                    "-p",
                    "roce",
                    *job,
                ]
            }
            if before
            else {}
        ),
        "python -c pass (wheel)": [wheel_py, "-c", "pass"],
        "python -c pass (wheel, setuptools)": [str(bins["wheel, setuptools"] / "python"), "-c", "pass"],
        "python -c 'import ...' (wheel)": [wheel_py, "-c", imports],
    }
    envs["sbatch"] = env
    # An ML user's environment often holds a token (HF_TOKEN, WANDB_API_KEY): the history records its digest.
    envs["secret"] = dict(envs["wheel"], HF_TOKEN="hf_" + "x" * 34, WANDB_API_KEY="0" * 40)
    kind_of = {
        key: (
            f"wheel, {before}"
            if before and key.endswith(f"(wheel, {before})")
            else "secret"
            if "token" in key
            else "user"
            if USER in key
            else "wheel, setuptools"
            if "setuptools" in key
            else "wheel"
            if "wheel" in key
            else "editable"
            if "stune" in key
            else "sbatch"
        )
        for key in argvs
    }
    try:
        results = [
            compare(
                name,
                {
                    key: (
                        lambda a=argv, k=kind_of[key], m=measure: m(
                            a,
                            env=envs[k],
                            cwd=str(user_dir if k == "user" else tmp),
                            user=USER if k == "user" else None,
                        )
                    )
                    for key, argv in argvs.items()
                },
                rounds=rounds,
            )
            for name, measure in (("sbatch", time_once), ("sbatch_cpu", cpu_once))
        ]
    finally:
        subprocess.run(["scancel", "-n", "bench"], env=env, check=False)
    for result in results:
        print(f"\n{result['name']}: own cost (minus plain sbatch), as a multiple of the bare start")
        for key in [k for k in argvs if k.startswith("stune-sbatch")]:
            plain = f"sbatch -p roce ({USER})" if USER in key else "sbatch -p roce"
            print(f"  {key:48s} {own_cost(result, key, plain):4.2f}x")
        for kind in [*bins, f"wheel, {USER}"]:
            plain = f"sbatch -p roce ({USER})" if USER in kind else "sbatch -p roce"
            extra = own_cost(result, f"stune-sbatch -p roce ({kind})", plain)
            print(
                f"  goal ({kind}): stune-sbatch - sbatch <= 2x: {'meets' if extra <= 2 else 'MISSES'} "
                f"({extra:.2f}x)"
            )
    taskprolog(env, tmp, bins, rounds)
    return 0


def taskprolog(env: dict, tmp: Path, bins: dict, rounds: int) -> None:
    """The TaskProlog runs before every task: its cost on a RoCE node fixture (8 HCAs, GID tables)."""
    sys.path.insert(0, str(REPO / "tests"))
    import hwtrees

    root = tmp / "node"
    hwtrees.h100_roce(root)
    tp_env = dict(
        env,
        SLURM_JOB_PARTITION="roce",
        SLURMD_NODENAME="n1",
        SLURM_LOCALID="0",
        STUNE_SYSFS_ROOT=str(root),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="n[1-2]",
    )
    runs = {BARE: ([sys.executable, "-I", "-S", "-c", "pass"], tp_env)}
    for kind, bindir in bins.items():
        runs[f"stune-task-prolog (roce, {kind})"] = (
            [str(bindir / "stune-task-prolog")],
            dict(tp_env, STUNE_CACHE_DIR=f"{tmp}/cache-{kind}"),
        )
    for name, measure in (("taskprolog", time_once), ("taskprolog_cpu", cpu_once)):
        result = compare(
            name,
            {key: (lambda a=a, e=e, m=measure: m(a, env=e, cwd=str(tmp))) for key, (a, e) in runs.items()},
            rounds=rounds,
        )
        for kind in bins:
            ratio = result["ratio_to_baseline"][f"stune-task-prolog (roce, {kind})"]
            print(
                f"  goal ({kind}, {name}): stune-task-prolog <= 2x bare start: "
                f"{'meets' if ratio <= 2 else 'MISSES'} ({ratio:.2f}x)"
            )


if __name__ == "__main__":
    sys.exit(main())
