"""README's demo, steps 8 to 11: fair-share by GPU utilization. Two users hold the same GPUs, alice's busy and
bob's idle; the usage pipeline runs as installed on a cluster, then the accountant lowers bob's priority, and
the report, `explain` and `job` say why. demo.py runs it after its own steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_tune.slurm import Slurm

from .demo_checks import SNAPSHOT, claim, json_of, run, step, wait_done
from .layout import REPO


def summary_eta(comment: str) -> float | None:
    """The measured GPU utilization (0-1) in a job's AdminComment usage summary; None without one."""
    from slurm_tune.usage import summary as summary_mod

    parsed = summary_mod.parse(comment)
    return None if parsed is None else parsed.eta


def fairshare_alike(a: int, b: int) -> bool:
    """Two sprio fair-share values (priority points) that rank alike: equal but for a second of run time more
    or less in Slurm's record (within 2 % of the larger, and at most 50 points)."""
    return abs(a - b) <= min(50, 0.02 * max(a, b, 1))


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


def _sbatch_as(slurm: Slurm, user: str, account: str, options: list[str], wrap: str) -> int:
    """The job id of `sbatch --parsable -A account OPTIONS --wrap WRAP`, submitted as `user`."""
    out = slurm.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "-A", account, *options, "--wrap", wrap]
    )
    return int(out.strip().split(";")[0])


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
            ids[user] = _sbatch_as(
                slurm,
                user,
                account,
                ["-p", "hdr", "-w", node, "--gres=gpu:2", f"--chdir={jobs_dir}", "-J", f"train-{user[6:]}"],
                "sleep 20",
            )
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
            pending[user] = _sbatch_as(
                slurm, user, account, ["-p", "vpc", "--gres=gpu:1", f"--chdir={jobs_dir}"], "true"
            )
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
        try:
            for proc in samplers:
                proc.terminate()
            for proc in samplers:
                proc.wait(timeout=30)
            slurm.run(["scontrol", "update", "PartitionName=vpc", "State=UP"], check=False)
            for state in ("PENDING", "RUNNING"):
                slurm.run(["scancel", "--full", f"--state={state}"], check=False)
            cluster.install_stune()  # the site's own env file back
        finally:  # the fragment goes even when the above fails: slurmctld would not start on a script gone
            cluster.set_fragment("stune-demo-fairshare", None, reconfigure=False)
            cluster.restart_controller()
