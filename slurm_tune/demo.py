"""README's demo, run by scripts/demo.sh against the local cluster: what stune does, step by step.

It grows as features land. Each step prints what it runs and what Slurm says.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from .errors import StuneError
from .slurm import Slurm


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def wait_done(slurm: Slurm, job_id: int, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = slurm.sacct(["JobID", "State"], job_ids=[str(job_id)])
        state = rows[0]["State"] if rows else "PENDING"
        if state.split()[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(1)
    raise StuneError(f"job {job_id} did not finish within {timeout:g}s")


def run() -> int:
    slurm = Slurm.from_env()
    step("The cluster: sinfo")
    print(slurm.run(["sinfo", "-o", "%P %.5a %.6D %.8t %G %N"]), end="")

    step("A GPU job: 2 GPUs on one node, run to completion")
    workdir = tempfile.mkdtemp(prefix="stune-demo-", dir=os.environ.get("TMPDIR", "/tmp"))
    script = ("#!/bin/bash\n"
              "echo \"job $SLURM_JOB_ID on $(hostname -s)/$SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"\n")
    job_id = slurm.submit(["--gres=gpu:2", "-N1", f"--chdir={workdir}", "--output=demo-%j.out", "-J", "stune-demo"],
                          script=script)
    print(f"submitted job {job_id}")
    state = wait_done(slurm, job_id)
    with open(os.path.join(workdir, f"demo-{job_id}.out")) as fh:
        print(fh.read(), end="")

    step("Accounting: sacct shows the GPUs the job held")
    row = slurm.sacct(["JobID", "JobName", "State", "AllocTRES", "NodeList", "Elapsed"], job_ids=[str(job_id)])[0]
    for key, value in row.items():
        print(f"  {key:10s} {value}")
    if "gres/gpu=" not in row["AllocTRES"] or not state.startswith("COMPLETED"):
        print("demo: the GPU job did not complete with gres/gpu in AllocTRES", file=sys.stderr)
        return 1
    print("\nDemo finished: see README.md for what else stune does.")
    return 0


def main() -> int:
    try:
        return run()
    except StuneError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
