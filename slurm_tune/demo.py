"""README's demo, run by scripts/demo.sh against the local cluster: what stune does, step by step.

Each step prints the command a user would type and what it answered. The steps run the installed stune
commands as separate processes, exactly as a user would.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import StuneError
from .slurm import Slurm

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "dgx-a100-ib.json"
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(argv: list[str], *, cwd: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> str:
    """Run a stune command as a user would, echoing it and its output."""
    print(f"$ {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    print(output, end="" if output.endswith("\n") or not output else "\n", flush=True)
    if proc.returncode not in ok_codes:
        raise StuneError(f"{argv[0]} exited {proc.returncode}")
    return proc.stdout


def wait_done(slurm: Slurm, job_id: int, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = slurm.sacct(["JobID", "State"], job_ids=[str(job_id)])
        state = rows[0]["State"].split()[0] if rows else "PENDING"
        if state in FINISHED:
            return state
        time.sleep(1)
    raise StuneError(f"job {job_id} did not finish within {timeout:g}s")


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

    step("2. Partition profiles are validated at load time (a mistake is one line: file:line: key)")
    run(["stune-admin", "check-profiles"])

    step("3. Node health: judge a captured DGX-A100 node, then the same node with a port down")
    run(["stune-health", "check", "--snapshot", str(SNAPSHOT), "--partition", "hdr"])
    run(["stune-health", "check", "--snapshot", broken_copy(SNAPSHOT, workdir), "--partition", "hdr"],
        ok_codes=(6,))  # 6: the verdict is fail

    step("4. stune-sbatch explains what it would add for a 2-node RoCE job, and where each setting comes from")
    run(["stune-sbatch", "--dry-run", "-p", "roce", "-N", "2", "--gres=gpu:4", "--wrap",
         "srun stune-bind python train.py"], cwd=workdir)

    step("5. A 2-GPU job through stune-sbatch, run to completion")
    script = Path(workdir) / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -J stune-demo\n#SBATCH --gres=gpu:2\n"
                      "echo \"job $SLURM_JOB_ID on $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"\n"
                      "env | grep -E '^NCCL_' | sort\n")
    out = run(["stune-sbatch", "--parsable", "-p", "hdr", str(script)], cwd=workdir)
    job_id = int(out.strip().split(";")[0])
    state = wait_done(slurm, job_id)
    print((Path(workdir) / f"slurm-{job_id}.out").read_text(), end="")

    step("6. Accounting: sacct shows the GPUs the job held")
    row = slurm.sacct(["JobID", "JobName", "State", "AllocTRES", "NodeList", "Elapsed"], job_ids=[str(job_id)])[0]
    for key, value in row.items():
        print(f"  {key:10s} {value}")

    step("7. Every submission is recorded: stune-sbatch history")
    run(["stune-sbatch", "history", "-n", "3"])

    step("8. Fair-share by GPU utilization: what the accountant would do, and the usage report")
    run(["stune-fairshare", "apply", "--dry-run"], ok_codes=(0, 1))
    run(["stune-fairshare", "report", "--since", "1d"], ok_codes=(0, 1))

    if "gres/gpu=" not in row["AllocTRES"] or state != "COMPLETED":
        print("demo: the GPU job did not complete with gres/gpu in AllocTRES", file=sys.stderr)
        return 1
    print("\nDemo finished. README.md lists every command; docs/ has the details of each part.")
    return 0


def main() -> int:
    try:
        return demo()
    except StuneError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
