"""What the cli_filter adds to plain `sbatch`, `salloc` and `srun`: each command with the filter beside the same
command without it, interleaved in one run against the local cluster, with the bare interpreter start as the
usual yardstick (the filter starts no interpreter: its cost should be a small part of one).

The two configurations differ in one line: a copy of the cluster's slurm.conf with
CliFilterPlugins=cli_filter/lua, and the filter rendered beside it (the cluster's own slurm.conf is not
touched), and a third with an empty cli_filter.lua (what enabling the Lua plugin costs before any of stune's
code runs). Rows: a held batch job (`sbatch -H`), an allocation that runs `true` (`salloc ... true`: scheduling
included, so its spread is wide), a job started by srun, and an srun step inside a running job, both the step
of a job that has stune's settings (STUNE_MANAGED: the filter returns at once) and one without them (a step
in an salloc: the filter reads its data and adds the environment).

    .venv/bin/python bench/bench_clifilter.py [--rounds N]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import BARE, compare, cpu_once, time_once

from stune_dev.devcluster import DevCluster

NAME = "bench-clifilter"
EMPTY_FILTER = """function slurm_cli_setup_defaults(options, early) return slurm.SUCCESS end
function slurm_cli_pre_submit(options, offset) return slurm.SUCCESS end
function slurm_cli_post_submit(offset, jobid, stepid) return slurm.SUCCESS end
"""


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20
    cluster = DevCluster()
    cluster.up(install=False)
    from slurm_tune.admin.slurmconf import SlurmConf
    from slurm_tune.clifilter.render import SLURM_CONF_LINE, default_partition_of, render

    live = cluster.layout.slurm_conf
    if "cli_filter" in SlurmConf(str(live)).get("CliFilterPlugins"):
        raise SystemExit(f"bench: {live} already enables a cli_filter: the plain rows would not be plain")
    tmp = Path(tempfile.mkdtemp(prefix="bench-clifilter-"))
    tmp.chmod(0o755)
    conf = tmp / "slurm.conf"
    conf.write_text(live.read_text() + f"\n{SLURM_CONF_LINE}\n")
    profiles = os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions"))
    for path, data in render(str(tmp), profiles, default_partition_of(SlurmConf(str(live)))).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    # the same plugin with an empty script: what enabling cli_filter/lua costs by itself, before stune's code
    empty = tmp / "empty"
    empty.mkdir()
    (empty / "slurm.conf").write_text(conf.read_text())
    (empty / "cli_filter.lua").write_text(EMPTY_FILTER)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NCCL_", "STUNE_MANAGED", "SLURM_JOB", "STUNE_EXPLAIN"))
    }
    plain_env = dict(base, SLURM_CONF=str(live))
    filter_env = dict(base, SLURM_CONF=str(conf))
    empty_env = dict(base, SLURM_CONF=str(empty / "slurm.conf"))
    # a running job whose allocation the step rows use: two tasks' worth of CPUs, steps overlap
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "roce",
            "-N1",
            "-n2",
            "-J",
            NAME,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 3600",
        ],
        capture_output=True,
        text=True,
        env=plain_env,
        check=True,
    )
    job = out.stdout.strip().split(";")[0]
    _wait_running(job, plain_env)
    in_job = {"SLURM_JOB_ID": job, "SLURM_JOB_PARTITION": "roce"}
    managed = dict(in_job, STUNE_MANAGED="NCCL_IB_HCA,MASTER_ADDR")
    held = ["sbatch", "--parsable", "-H", "-p", "roce", "-J", NAME, "-o", "/dev/null", "--wrap", "true"]
    salloc = ["salloc", "-p", "roce", "-N1", "-J", NAME, "true"]
    srun_job = ["srun", "-p", "roce", "-N1", "-n1", "-J", NAME, "true"]
    step = ["srun", "-n1", "--overlap", "true"]
    rows = {
        BARE: ([sys.executable, "-I", "-S", "-c", "pass"], plain_env),
        "sbatch -H": (held, plain_env),
        "sbatch -H, empty cli_filter.lua": (held, empty_env),
        "sbatch -H, cli_filter": (held, filter_env),
        "salloc true": (salloc, plain_env),
        "salloc true, cli_filter": (salloc, filter_env),
        "srun (a new job)": (srun_job, plain_env),
        "srun (a new job), cli_filter": (srun_job, filter_env),
        "srun step": (step, dict(plain_env, **managed)),
        "srun step, empty cli_filter.lua": (step, dict(empty_env, **in_job)),
        "srun step, cli_filter (job has STUNE_MANAGED)": (step, dict(filter_env, **managed)),
        "srun step, cli_filter (salloc-style, adds env)": (step, dict(filter_env, **in_job)),
    }
    pairs = [
        ("sbatch -H", "sbatch -H, empty cli_filter.lua"),
        ("sbatch -H", "sbatch -H, cli_filter"),
        ("sbatch -H, empty cli_filter.lua", "sbatch -H, cli_filter"),
        ("salloc true", "salloc true, cli_filter"),
        ("srun (a new job)", "srun (a new job), cli_filter"),
        ("srun step", "srun step, cli_filter (job has STUNE_MANAGED)"),
        ("srun step", "srun step, empty cli_filter.lua"),
        ("srun step", "srun step, cli_filter (salloc-style, adds env)"),
        ("srun step, empty cli_filter.lua", "srun step, cli_filter (job has STUNE_MANAGED)"),
        ("srun step, empty cli_filter.lua", "srun step, cli_filter (salloc-style, adds env)"),
    ]
    try:
        for name, measure in (("clifilter", time_once), ("clifilter_cpu", cpu_once)):
            result = compare(
                name,
                {
                    key: (lambda a=a, e=e, m=measure: m(a, env=e, cwd=str(tmp)))
                    for key, (a, e) in rows.items()
                },
                rounds=rounds,
            )
            med = result["median_s"]
            print(f"\n{name}: with the filter / without (difference, as a multiple of the bare start)")
            for plain, filtered in pairs:
                extra = (med[filtered] - med[plain]) / med[BARE]
                print(
                    f"  {filtered:48s} over {plain:32s} x{med[filtered] / med[plain]:.3f}  "
                    f"({(med[filtered] - med[plain]) * 1000:+.1f} ms, {extra:+.2f} bare starts)"
                )
    finally:
        subprocess.run(["scancel", "-n", NAME], env=plain_env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _wait_running(job: str, env: dict) -> None:
    import time

    for _ in range(120):
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=env
        ).stdout
        if re.search(r"RUNNING", state):
            return
        time.sleep(0.5)
    raise SystemExit(f"bench: job {job} did not start")


if __name__ == "__main__":
    sys.exit(main())
