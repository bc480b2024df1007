"""README's demo, run by scripts/demo.sh against the local cluster: what stune does, step by step.

Each step prints the command a user would type and what it answered. The steps run the installed stune
commands as separate processes, exactly as a user would. Every claim the demo prints is checked (`claim()`):
one that does not hold stops the demo with exit 1 and a line naming it, so a broken stune never ends in
"Demo finished".
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


NEXT_SHELL = 'export PATH=$PWD/.venv/bin:$PATH; eval "$(stune-devcluster env)"'


class ClaimFailed(StuneError):
    """A claim the demo prints did not hold."""


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def claim(text: str, holds: bool, seen: str = "") -> None:
    """Say a claim, checked: `  checked: TEXT (SEEN)`. One that does not hold stops the demo, named."""
    detail = f" ({seen})" if seen else ""
    if not holds:
        raise ClaimFailed(f"claim not true: {text}{detail}")
    print(f"  checked: {text}{detail}", flush=True)


def run(
    argv: list[str], *, cwd: str | None = None, ok_codes: tuple[int, ...] = (0,), quiet: bool = False
) -> str:
    """Run a stune command as a user would, echoing it and its output (`quiet`: neither, for a check)."""
    if not quiet:
        print(f"$ {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    if not quiet:
        print(output, end="" if output.endswith("\n") or not output else "\n", flush=True)
    if proc.returncode not in ok_codes:
        raise ClaimFailed(
            f"`{' '.join(argv[:3])}` exited {proc.returncode}, not {' or '.join(map(str, ok_codes))}"
            + (f": {output.strip().splitlines()[-1]}" if output.strip() else "")
        )
    return proc.stdout


def json_of(argv: list[str]) -> dict:
    """A command's --json answer, for a check (not echoed: the demo already showed the same in words)."""
    try:
        return json.loads(run(argv, quiet=True))
    except ValueError as exc:
        raise ClaimFailed(f"`{' '.join(argv[:3])}` did not answer JSON: {exc}") from None


def summary_eta(comment: str) -> float | None:
    """The measured GPU utilization (0-1) in a job's AdminComment usage summary; None without one."""
    from slurm_tune.usage import summary as summary_mod

    parsed = summary_mod.parse(comment)
    return None if parsed is None else parsed.eta


def fairshare_alike(a: int, b: int) -> bool:
    """Two sprio fair-share values (priority points) that rank alike: equal but for a second of run time more
    or less in Slurm's record (within 2 % of the larger, and at most 50 points)."""
    return abs(a - b) <= min(50, 0.02 * max(a, b, 1))


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
    config.write_text(
        f"accountant:\n  state_dir: {root / 'state'}\n  settle_delay: 0\n  initial_history: 1h\n"
        f"usage:\n  spool_dir: {spool}\n  interval: 0.5\n  collect_wait: 20\n"
    )
    config.chmod(0o644)
    usage = f"{cluster.layout.root}/nodes/%n/usage"
    os.environ.update(STUNE_FAIRSHARE_CONFIG=str(config), STUNE_USAGE_SPOOL=str(spool), STUNE_USAGE_DIR=usage)
    # the hooks as `stune-admin install` placed them, with the demo's spool and config in the env file
    cluster.install_stune(STUNE_USAGE_SPOOL=str(spool), STUNE_FAIRSHARE_CONFIG=str(config))
    ctld = root / "epilog-slurmctld"
    slurm_env = " ".join(
        f"{k}={v}" for k, v in cluster.slurm_env().items()
    )  # SLURM_CONF, a built Slurm's bin
    ctld.write_text(
        f"#!/bin/sh\nexport PATH={bin_dir}:/usr/bin:/bin {slurm_env} "
        f"STUNE_BIN={bin_dir} STUNE_FAIRSHARE_CONFIG={config} STUNE_USAGE_SPOOL={spool} "
        f"STUNE_USAGE_DIR=/nonexistent STUNE_USAGE_LOG={root / 'store.log'}\n"
        f"exec {REPO}/epilog/stune-usage-slurmctld\n"
    )
    ctld.chmod(0o755)
    cluster.set_fragment(
        "stune-demo-fairshare", f"EpilogSlurmctld={ctld}\nPrologFlags=Alloc", reconfigure=False
    )
    cluster.restart_controller()
    samplers = []
    try:
        for node, sm, watts in (("n1", 95.0, 320.0), ("n2", 0.0, 60.0)):
            snap = utilization_copy(SNAPSHOT, root / f"gpus-{node}.json", sm, watts)
            samplers.append(
                subprocess.Popen(
                    [
                        f"{bin_dir}/stune-gpu-sampler",
                        "run",
                        "--snapshot",
                        snap,
                        "--local-dir",
                        str(cluster.layout.node_dir(node) / "usage"),
                        "--interval",
                        "0.5",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        step("8. Fair-share by GPU utilization: alice's 2 GPUs busy (95 %), bob's 2 GPUs idle, 20 s each")
        slurm.run(["sacctmgr", "-i", "modify", "account", "where", "name=root", "set", "RawUsage=0"])
        ids = {}
        for user, account, node in (("stune-alice", "physics", "n1"), ("stune-bob", "biology", "n2")):
            out = slurm.run(
                [
                    "runuser",
                    "-u",
                    user,
                    "--",
                    "sbatch",
                    "--parsable",
                    "-A",
                    account,
                    "-p",
                    "hdr",
                    "-w",
                    node,
                    "--gres=gpu:2",
                    f"--chdir={jobs_dir}",
                    "-J",
                    f"train-{user[6:]}",
                    "--wrap",
                    "sleep 20",
                ]
            )
            ids[user] = int(out.strip().split(";")[0])
            print(
                f"$ sbatch -A {account} -w {node} --gres=gpu:2 --wrap 'sleep 20'   ({user}): job {ids[user]}"
            )
        for job_id in ids.values():
            wait_done(slurm, job_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            (slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(j)]) or [{}])[0]
            .get("AdminComment", "")
            .startswith("stune1 ")
            for j in ids.values()
        ):
            time.sleep(1)
        etas = {}
        for user, job_id in ids.items():
            comment = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job_id)])[0]["AdminComment"]
            print(f"  job {job_id} ({user}) AdminComment: {comment[:110]}...")
            etas[user] = summary_eta(comment)
        claim(
            "each job's GPU usage summary reached its AdminComment",
            None not in etas.values(),
            ", ".join(f"{u[6:]}: {'none' if e is None else 'stored'}" for u, e in etas.items()),
        )
        claim(
            "alice's GPUs were measured busy and bob's idle",
            etas["stune-alice"] >= 0.8 and etas["stune-bob"] <= 0.1,
            f"alice {100 * etas['stune-alice']:.0f}%, bob {100 * etas['stune-bob']:.0f}%",
        )

        step("9. Both users queue another job (a partition that is down, so both wait)")
        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=DOWN"])
        pending = {}
        for user, account in (("stune-alice", "physics"), ("stune-bob", "biology")):
            out = slurm.run(
                [
                    "runuser",
                    "-u",
                    user,
                    "--",
                    "sbatch",
                    "--parsable",
                    "-A",
                    account,
                    "-p",
                    "vpc",
                    "--gres=gpu:1",
                    f"--chdir={jobs_dir}",
                    "--wrap",
                    "true",
                ]
            )
            pending[user] = int(out.strip().split(";")[0])
        print("  waiting for Slurm's next fair-share pass (PriorityCalcPeriod, 1 minute here)...", flush=True)
        decay = cluster.layout.spool / "ctld" / "priority_last_decay_ran"
        mark = time.time()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (decay.exists() and decay.stat().st_mtime > mark):
            time.sleep(1)
        claim(
            "Slurm ran its fair-share pass",
            decay.exists() and decay.stat().st_mtime > mark,
            f"{decay.name} updated within 90 s",
        )
        print(slurm.run(["sprio", "-o", "%.8i %.10u %.10Y %.10F %.8S"]), end="")
        rows = {r.job_id: r for r in slurm.sprio()}
        before = {user: rows.get(job) for user, job in pending.items()}
        claim(
            "both jobs wait, and Slurm alone ranks them alike: the same GPU-hours held, whether used or idle",
            None not in before.values()
            and fairshare_alike(before["stune-alice"].fairshare, before["stune-bob"].fairshare),
            "fair-share points "
            + ", ".join(f"{u[6:]} {'not pending' if r is None else r.fairshare}" for u, r in before.items()),
        )

        step("10. The accountant charges idle GPUs and sets SiteFactor on pending jobs")
        config.write_text(
            config.read_text().replace(
                "initial_history: 1h", f"initial_history: {int(time.time()) - started + 5}"
            )
        )
        run(["stune-fairshare", "apply"])
        print(slurm.run(["sprio", "-o", "%.8i %.10u %.10Y %.10F %.8S"]), end="")
        rows = {r.job_id: r for r in slurm.sprio()}
        bob, alice = rows.get(pending["stune-bob"]), rows.get(pending["stune-alice"])
        claim(
            f"bob's pending job {pending['stune-bob']} is now below alice's {pending['stune-alice']} in sprio",
            bob is not None and alice is not None and bob.priority < alice.priority,
            f"priority {'-' if bob is None else bob.priority} vs {'-' if alice is None else alice.priority}",
        )
        claim(
            "the accountant set a negative SiteFactor on bob's job only",
            bob.site < 0 and alice.site == 0,
            f"SiteFactor bob {bob.site}, alice {alice.site}",
        )

        step("11. The report, and the two questions users ask: why is my priority low? was my job idle?")
        run(["stune-fairshare", "report", "--since", f"@{started}"])
        users = {
            u["user"]: u
            for u in json_of(["stune-fairshare", "report", "--since", f"@{started}", "--json"])["users"]
        }
        idle = {u: users.get(u, {}).get("idle_gpu_h") or 0.0 for u in ("stune-alice", "stune-bob")}
        claim(
            "the report shows bob's GPU time idle and alice's used",
            idle["stune-bob"] > 3 * idle["stune-alice"],
            f"idle GPU-seconds bob {3600 * idle['stune-bob']:.0f}, alice {3600 * idle['stune-alice']:.0f}",
        )
        as_bob = ["runuser", "-u", "stune-bob", "--", f"{bin_dir}/stune-fairshare"]
        run([*as_bob, "explain"])
        why = {a["account"]: a for a in json_of([*as_bob, "explain", "--json"])["associations"]}.get(
            "biology", {}
        )
        claim(
            "explain tells bob his priority is lowered, and names his idle job",
            (why.get("site_factor") or 0) < 0
            and str(ids["stune-bob"]) in [j["job_id"] for j in why.get("top_idle_jobs", [])],
            f"SiteFactor {why.get('site_factor')}, job {ids['stune-bob']} among the costly ones",
        )
        run([*as_bob, "job", str(ids["stune-bob"])])
        job = json_of([*as_bob, "job", str(ids["stune-bob"]), "--json"])
        claim(
            "job says bob's job was idle and was charged for it",
            job.get("eta") is not None and job["eta"] <= 0.1 and (job.get("charged_x") or 0) > 1,
            f"utilization {job.get('eta')}, charged x{job.get('charged_x')}",
        )
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
