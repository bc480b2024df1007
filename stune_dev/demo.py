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

from slurm_tune.errors import StuneError
from slurm_tune.slurm import Slurm

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


def utilization_copy(snapshot: Path, path: Path, sm: float, watts: float) -> str:
    """The captured node with every GPU at `sm` % utilization and `watts` (what the sampler reads)."""
    snap = json.loads(snapshot.read_text())
    for dev in snap["gpus"]["devices"][:4]:
        dev["utilization"] = {"gpu": sm, "memory": sm / 3}
        dev["power_w"] = watts
        dev["processes"] = [{"pid": 4242}]
    snap["gpus"]["devices"] = snap["gpus"]["devices"][:4]
    from slurm_tune.safeio import write_atomic

    write_atomic(str(path), json.dumps(snap))
    return str(path)


def fair_share_demo(slurm: Slurm, workdir: str) -> None:
    """Two users, the same GPU jobs: alice's GPUs busy (n1), bob's idle (n2). The usage pipeline runs as
    installed on a cluster (prolog record, a sampler per node, epilog summary, EpilogSlurmctld into
    AdminComment); then the accountant, the report, `explain`, `job`, and sprio with both waiting."""
    from .devcluster import DevCluster

    cluster = DevCluster()
    root = Path(workdir)
    jobs_dir = root / "jobs"
    jobs_dir.mkdir()
    jobs_dir.chmod(0o777)
    root.chmod(0o711)
    spool = root / "spool"
    spool.mkdir()
    spool.chmod(0o2775)
    bin_dir = os.path.dirname(sys.executable)
    started = int(time.time())
    config = root / "fairshare.yaml"
    config.write_text(f"accountant:\n  state_dir: {root / 'state'}\n  settle_delay: 0\n  initial_history: 1h\n"
                      f"usage:\n  spool_dir: {spool}\n  interval: 0.5\n  collect_wait: 20\n")
    config.chmod(0o644)
    usage = f"{cluster.layout.root}/nodes/%n/usage"
    os.environ.update(STUNE_FAIRSHARE_CONFIG=str(config), STUNE_USAGE_SPOOL=str(spool), STUNE_USAGE_DIR=usage)
    # the hooks as `stune-admin install` placed them, with the demo's spool and config in the env file
    cluster.install_stune(STUNE_USAGE_SPOOL=str(spool), STUNE_FAIRSHARE_CONFIG=str(config))
    ctld = root / "epilog-slurmctld"
    slurm_env = " ".join(f"{k}={v}" for k, v in cluster.slurm_env().items())  # SLURM_CONF, a built Slurm's bin
    ctld.write_text(f"#!/bin/sh\nexport PATH={bin_dir}:/usr/bin:/bin {slurm_env} "
                    f"STUNE_BIN={bin_dir} STUNE_FAIRSHARE_CONFIG={config} STUNE_USAGE_SPOOL={spool} "
                    f"STUNE_USAGE_DIR=/nonexistent STUNE_USAGE_LOG={root / 'store.log'}\n"
                    f"exec {REPO}/epilog/stune-usage-slurmctld\n")
    ctld.chmod(0o755)
    cluster.set_fragment("stune-demo-fairshare", f"EpilogSlurmctld={ctld}\nPrologFlags=Alloc", reconfigure=False)
    cluster.restart_controller()
    samplers = []
    try:
        for node, sm, watts in (("n1", 95.0, 320.0), ("n2", 0.0, 60.0)):
            snap = utilization_copy(SNAPSHOT, root / f"gpus-{node}.json", sm, watts)
            samplers.append(subprocess.Popen(
                [f"{bin_dir}/stune-gpu-sampler", "run", "--snapshot", snap, "--local-dir",
                 str(cluster.layout.node_dir(node) / "usage"), "--interval", "0.5"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        step("8. Fair-share by GPU utilization: alice's 2 GPUs busy (95 %), bob's 2 GPUs idle, 20 s each")
        slurm.run(["sacctmgr", "-i", "modify", "account", "where", "name=root", "set", "RawUsage=0"])
        ids = {}
        for user, account, node in (("stune-alice", "physics", "n1"), ("stune-bob", "biology", "n2")):
            out = slurm.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "-A", account, "-p", "hdr", "-w",
                             node, "--gres=gpu:2", f"--chdir={jobs_dir}", "-J", f"train-{user[6:]}",
                             "--wrap", "sleep 20"])
            ids[user] = int(out.strip().split(";")[0])
            print(f"$ sbatch -A {account} -w {node} --gres=gpu:2 --wrap 'sleep 20'   ({user}): job {ids[user]}")
        for job_id in ids.values():
            wait_done(slurm, job_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                (slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(j)]) or [{}])[0].get("AdminComment", "")
                .startswith("stune1 ") for j in ids.values()):
            time.sleep(1)
        for user, job_id in ids.items():
            comment = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job_id)])[0]["AdminComment"]
            print(f"  job {job_id} ({user}) AdminComment: {comment[:110]}...")

        step("9. Both users queue another job (a partition that is down, so both wait)")
        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=DOWN"])
        pending = {}
        for user, account in (("stune-alice", "physics"), ("stune-bob", "biology")):
            out = slurm.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "-A", account, "-p", "vpc",
                             "--gres=gpu:1", f"--chdir={jobs_dir}", "--wrap", "true"])
            pending[user] = int(out.strip().split(";")[0])
        print("  waiting for Slurm's next fair-share pass (PriorityCalcPeriod, 1 minute here)...", flush=True)
        decay = cluster.layout.spool / "ctld" / "priority_last_decay_ran"
        mark = time.time()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (decay.exists() and decay.stat().st_mtime > mark):
            time.sleep(1)
        print(slurm.run(["sprio", "-o", "%.8i %.10u %.10Y %.10F %.8S"]), end="")
        print("  Slurm alone ranks them alike: the same GPU-hours held, whether used or idle")

        step("10. The accountant charges idle GPUs and sets SiteFactor on pending jobs")
        config.write_text(config.read_text().replace("initial_history: 1h",
                                                     f"initial_history: {int(time.time()) - started + 5}"))
        run(["stune-fairshare", "apply"])
        print(slurm.run(["sprio", "-o", "%.8i %.10u %.10Y %.10F %.8S"]), end="")
        prio = {r.job_id: r.priority for r in slurm.sprio()}
        print(f"  bob's pending job {pending['stune-bob']} is now below alice's {pending['stune-alice']}: "
              f"{prio.get(pending['stune-bob'])} < {prio.get(pending['stune-alice'])}")

        step("11. The report, and the two questions users ask: why is my priority low? was my job idle?")
        run(["stune-fairshare", "report", "--since", f"@{started}"])
        run(["runuser", "-u", "stune-bob", "--", f"{bin_dir}/stune-fairshare", "explain"])
        run(["runuser", "-u", "stune-bob", "--", f"{bin_dir}/stune-fairshare", "job", str(ids["stune-bob"])])
    finally:
        for proc in samplers:
            proc.terminate()
        for proc in samplers:
            proc.wait(timeout=30)
        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=UP"], check=False)
        for state in ("PENDING", "RUNNING"):
            slurm.run(["scancel", "--full", f"--state={state}"], check=False)
        cluster.install_stune()  # the site's own env file back
        cluster.set_fragment("stune-demo-fairshare", None, reconfigure=False)
        cluster.restart_controller()


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

    if "gres/gpu=" not in row["AllocTRES"] or state != "COMPLETED":
        print("demo: the GPU job did not complete with gres/gpu in AllocTRES", file=sys.stderr)
        return 1

    fair_share_demo(slurm, workdir)
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
