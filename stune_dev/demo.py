"""README's demo, run by scripts/demo.sh against the local cluster: what stune does, step by step.

Each step prints the command a user would type and what it answered. The steps run the installed stune
commands as separate processes, exactly as a user would. Every claim the demo prints is checked (`claim()`):
one that does not hold stops the demo with exit 1 and a line naming it, so a broken stune never ends in
"Demo finished". Steps 1 to 7 are here, fair-share (8 to 11) in demo_fairshare.py; demo_checks.py holds how a
step runs a command and checks a claim.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from slurm_tune.errors import StuneError
from slurm_tune.slurm import Slurm

from .demo_checks import SNAPSHOT, claim, run, step, wait_done
from .demo_fairshare import fair_share_demo

NEXT_SHELL = 'export PATH=$PWD/.venv/bin:$PATH; eval "$(stune-devcluster env)"'


def broken_copy(snapshot: Path, directory: str) -> str:
    """The same node after a bad night: an IB port down and a GPU with a row remap pending."""
    snap = json.loads(snapshot.read_text())
    port = snap["ib"]["devices"]["mlx5_2"]["ports"]["1"]
    port.update(state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)")
    snap["gpus"]["devices"][3]["remapped_rows"].update(pending=True, uncorrectable=1)
    path = os.path.join(directory, "gpu-a017-broken.json")
    Path(path).write_text(json.dumps(snap))
    return path


def demo() -> int:
    slurm = Slurm.from_env()
    workdir = tempfile.mkdtemp(prefix="stune-demo-", dir=os.environ.get("TMPDIR", "/tmp"))

    step("1. The cluster: three nodes with 4 GPUs each, one partition per profile in partitions/")
    print(slurm.run(["sinfo", "-o", "%P %.5a %.6D %.8t %G %N"]), end="")
    gres = dict(
        line.split(None, 1)
        for line in slurm.run(["sinfo", "-h", "-N", "-o", "%N %G"]).splitlines()
        if line.strip()
    )
    claim(
        "three nodes with 4 GPUs each",
        len(gres) == 3 and all(g.startswith("gpu:4") for g in gres.values()),
        ", ".join(f"{n} {g.strip()}" for n, g in sorted(gres.items())),
    )

    step("2. Partition profiles are validated at load time (a mistake is one line: file:line: key)")
    run(["stune-admin", "check-profiles"])

    step("3. Node health: judge a captured DGX-A100 node, then the same node with a port down")
    run(["stune-health", "check", "--snapshot", str(SNAPSHOT), "--partition", "hdr"])
    claim("the captured node is judged ok", True, "exit 0")
    broken = run(
        ["stune-health", "check", "--snapshot", broken_copy(SNAPSHOT, workdir), "--partition", "hdr"],
        ok_codes=(6,),
    )  # 6: the verdict is fail
    claim(
        "the same node with a port down fails, and the verdict names the port",
        "mlx5_2" in broken,
        "exit 6, mlx5_2 named",
    )

    step(
        "4. stune-sbatch explains what it would add for a 2-node RoCE job, and where each setting comes from"
    )
    plan = run(
        [
            "stune-sbatch",
            "--dry-run",
            "-p",
            "roce",
            "-N",
            "2",
            "--gres=gpu:4",
            "--wrap",
            "srun stune-bind python train.py",
        ],
        cwd=workdir,
    )
    claim("it adds the RoCE NCCL settings and MASTER_ADDR", "NCCL_IB_HCA" in plan and "MASTER_ADDR" in plan)

    step("5. A 2-GPU job through stune-sbatch, run to completion")
    script = Path(workdir) / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -J stune-demo\n#SBATCH --gres=gpu:2\n"
        'echo "job $SLURM_JOB_ID on $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\n'
        "env | grep -E '^NCCL_' | sort\n"
    )
    out = run(["stune-sbatch", "--parsable", "-p", "hdr", str(script)], cwd=workdir)
    job_id = int(out.strip().split(";")[0])
    state = wait_done(slurm, job_id)
    out_file = Path(workdir) / f"slurm-{job_id}.out"
    job_out = out_file.read_text() if out_file.exists() else ""
    print(job_out, end="")
    visible = next(
        (line.rsplit("=", 1)[1] for line in job_out.splitlines() if "CUDA_VISIBLE_DEVICES=" in line), ""
    )
    claim(
        f"job {job_id} completed, with 2 GPUs visible",
        state == "COMPLETED" and len(visible.split(",")) == 2,
        f"{state}, CUDA_VISIBLE_DEVICES={visible}",
    )

    step("6. Accounting: sacct shows the GPUs the job held")
    row = slurm.sacct(
        ["JobID", "JobName", "State", "AllocTRES", "NodeList", "Elapsed"], job_ids=[str(job_id)]
    )[0]
    for key, value in row.items():
        print(f"  {key:10s} {value}")
    claim("sacct records the 2 GPUs it held", "gres/gpu=2" in row["AllocTRES"], row["AllocTRES"])

    step("7. Every submission is recorded: stune-sbatch history")
    history = run(["stune-sbatch", "history", "-n", "3"])
    claim(
        f"the history lists job {job_id}",
        any(line.split()[2:3] == [str(job_id)] for line in history.splitlines()),
    )

    fair_share_demo(slurm, workdir)
    print(
        "\nDemo finished: every claim above was checked. README.md lists every command; docs/ has the details "
        "of each part.\n"
        "The cluster keeps running. In a new shell, from this checkout, first run\n"
        f"    {NEXT_SHELL}\n"
        "then the stune commands and Slurm's own (sinfo, sbatch, squeue, sacct) work against it, for example\n"
        "    stune-sbatch -p hdr --gres=gpu:1 --wrap 'echo $CUDA_VISIBLE_DEVICES'\n"
        "(`stune-devcluster down` stops it.)"
    )
    return 0


def main() -> int:
    try:
        return demo()
    except StuneError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
