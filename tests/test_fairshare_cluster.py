"""Fair-share by GPU utilization on the live local cluster, as a new user would try it.

The module uses the real hooks as `stune-admin install` placed them (prolog 20-stune-jobgpus, epilog
20-stune-usage, with this module's spool and config in the env file; EpilogSlurmctld stune-usage-slurmctld) and runs one `stune-gpu-sampler` per node, each driven by a snapshot GPU source.
slurm.conf gets `PrologFlags=Alloc` (the prolog runs on every node at allocation, so the sampler knows all
of a job's GPUs) and `EpilogSlurmctld=` (read only when slurmctld starts, so the controller is restarted,
once at the start and once at the end). The devcluster's `AccountingStorageEnforce=associations,limits` matters
too: without `limits`, Slurm 22.05 never charges a finished job's last partial PriorityCalcPeriod.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import sacctmgr, wait_for_state, wait_until
from usage_helpers import accounting_hooks, start_sampler, stop_samplers, write_snapshot

from slurm_tune.fairshare.sacct import FIELDS
from slurm_tune.usage import summary
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = os.path.dirname(sys.executable)
FRAGMENT = "stune-fairshare-test"


class World:
    def __init__(self, cluster, root: Path):
        self.cluster = cluster
        self.root = root
        self.spool = root / "spool"
        self.state = root / "state"
        self.config = root / "fairshare.yaml"
        self.store_log = root / "store.log"
        self.snapshots = {n: root / f"gpus-{n}.json" for n in NODES}
        self.local = {n: cluster.layout.node_dir(n) / "usage" for n in NODES}
        self.samplers: dict[str, subprocess.Popen] = {}
        self.started = int(time.time())

    def env(self) -> dict:
        return {
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "STUNE_FAIRSHARE_CONFIG": str(self.config),
            "SLURM_CONF": os.environ["SLURM_CONF"],
        }

    def write_config(self, **accountant) -> None:
        lines = ["accountant:", f"  state_dir: {self.state}", "  settle_delay: 0"]
        lines += [f"  {k}: {v}" for k, v in accountant.items()]
        lines += [
            "usage:",
            f"  spool_dir: {self.spool}",
            "  interval: 0.2",
            "  collect_wait: 20",
            "report:",
            "  idle_power_w: 100",
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def stune(self, *args, check=True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [f"{VENV_BIN}/stune-fairshare", *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=300,
        )
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("fairshare")
    w = World(cluster, root)
    w.spool.mkdir()
    w.spool.chmod(0o2775)
    w.write_config()
    for node in NODES:
        write_snapshot(w.snapshots[node], 0, gpus=4, power=60.0)
    # the hooks exactly as `stune-admin install` placed them (no wrapper): the env file's per-node
    # STUNE_USAGE_DIR (nodes/%n/usage) is expanded by the hooks themselves, as by the samplers
    with accounting_hooks(cluster, root, FRAGMENT, spool=w.spool, config=w.config, store_log=w.store_log):
        assert cluster.site_settings()["STUNE_USAGE_DIR"] == f"{cluster.layout.root}/nodes/%n/usage"
        for node in NODES:
            w.samplers[node] = start_sampler(
                w.snapshots[node], w.local[node], w.env(), root / f"sampler-{node}.log"
            )
        try:
            yield w
        finally:
            stop_samplers(w.samplers.values())


def cancel_everything(slurm) -> None:
    # scancel 22.05 takes one --state at a time ("PENDING,RUNNING" is refused)
    for state in ("PENDING", "RUNNING", "SUSPENDED"):
        slurm.run(["scancel", "--full", f"--state={state}"], check=False)
    wait_until("no jobs left", lambda: not slurm.run(["squeue", "-h", "-o", "%i"], check=False).strip())


@pytest.fixture(autouse=True)
def no_leftover_jobs(world, slurm):
    cancel_everything(slurm)
    yield
    cancel_everything(slurm)


def submit_as(slurm, user: str, account: str, args: list[str], wrap: str) -> int:
    rc, out, err = slurm.run_full(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "-A", account, *args, "--wrap", wrap]
    )
    assert rc == 0, err
    return int(out.strip().split(";")[0])


def admin_comment(slurm, job_id: int) -> str:
    rows = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job_id)])
    return rows[0]["AdminComment"] if rows else ""


def wait_summary(slurm, job_id: int, timeout: float = 60) -> summary.JobSummary:
    text = wait_until(
        f"job {job_id}'s usage summary in AdminComment",
        lambda: admin_comment(slurm, job_id).startswith(summary.PREFIX) and admin_comment(slurm, job_id),
        timeout=timeout,
        interval=0.5,
    )
    parsed = summary.parse(text)
    assert parsed is not None, text
    return parsed


def wait_calc_pass(slurm, cluster, jobs) -> None:
    """Until Slurm's next fair-share pass after the jobs ended (PriorityCalcPeriod is 1 minute here): sprio's
    FAIRSHARE column lags until then."""
    last_end = max(int(r["End"]) for r in slurm.sacct(["JobIDRaw", "End"], job_ids=[str(j) for j in jobs]))
    decay_file = cluster.layout.spool / "ctld" / "priority_last_decay_ran"
    wait_until(
        "Slurm's next fair-share pass (PriorityCalcPeriod is 1 minute)",
        lambda: decay_file.exists() and decay_file.stat().st_mtime > last_end + 1,
        timeout=90,
        interval=1,
    )


def test_users_cannot_write_their_jobs_usage_field(world, slurm, shared_tmp):
    job = submit_as(slurm, "stune-alice", "physics", ["--gres=gpu:1", f"--chdir={shared_tmp}"], "sleep 30")
    wait_until("alice's job running", lambda: slurm.job(job).state == "RUNNING")
    fake = "stune1 held=10.0 used=10.0 cov=10.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="
    rc, out, err = slurm.run_full(
        ["runuser", "-u", "stune-alice", "--", "scontrol", "update", f"JobId={job}", f"AdminComment={fake}"]
    )
    assert rc != 0 and "Access/permission denied" in err
    rc, out, err = slurm.run_full(
        [
            "runuser",
            "-u",
            "stune-alice",
            "--",
            "sacctmgr",
            "-i",
            "modify",
            "job",
            "where",
            f"JobID={job}",
            "set",
            f"AdminComment={fake}",
        ]
    )
    assert rc != 0 and "privilege" in (out + err)
    assert slurm.job(job).admin_comment == ""
    # the field a user CAN write is not the one stune reads
    rc, _, err = slurm.run_full(
        ["runuser", "-u", "stune-alice", "--", "scontrol", "update", f"JobId={job}", f"Comment={fake}"]
    )
    assert rc == 0, err
    slurm.cancel(job)


def test_ninety_versus_ten_percent(world, slurm, shared_tmp):
    """Two users, equal GPU jobs, samplers at 90 % and 10 %: summaries in sacct, then the 10 % user's pending
    job gets the lower SiteFactor, sprio shows it, and a second run changes nothing."""
    write_snapshot(world.snapshots["n1"], 90, gpus=4, power=310.0)
    write_snapshot(world.snapshots["n2"], 10, gpus=4, power=90.0)
    # Slurm's usage and the accountant's read window start together: the same history on both sides
    slurm.run(["sacctmgr", "-i", "modify", "account", "where", "name=root", "set", "RawUsage=0"])
    t0 = int(time.time())
    args = ["--gres=gpu:2", "-c", "1", "--hold", f"--chdir={shared_tmp}"]
    # Fair Tree ranks users, so a penalty shows only where it changes the order. bob's job is never longer
    # than alice's (the same size, one second shorter): Slurm never ranks bob below alice on its own.
    bob = submit_as(slurm, "stune-bob", "biology", ["-w", "n2", *args], "sleep 9")
    alice = submit_as(slurm, "stune-alice", "physics", ["-w", "n1", *args], "sleep 10")
    slurm.run(["scontrol", "release", f"{bob},{alice}"])
    for job in (bob, alice):
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    s_alice, s_bob = wait_summary(slurm, alice), wait_summary(slurm, bob)
    for s, eta in ((s_alice, 0.9), (s_bob, 0.1)):
        assert s.gpus == 2 and (s.nodes_reported, s.nodes_expected) == (1, 1)
        assert s.eta == pytest.approx(eta, abs=0.01)
        assert s.coverage > 0.8
        assert s.held == pytest.approx(2 * (10 if s is s_alice else 9), rel=0.25)
    assert {g.node for g in s_alice.per_gpu} == {"n1"} and {g.node for g in s_bob.per_gpu} == {"n2"}
    assert s_alice.per_gpu[0].watts == pytest.approx(310.0) and s_bob.per_gpu[0].sm == pytest.approx(10.0)
    assert "stored (1/1 nodes" in world.store_log.read_text()
    assert not (world.cluster.layout.root / "nodes" / "%n").exists()  # the installed prolog expanded %n
    wait_calc_pass(slurm, world.cluster, [alice, bob])

    # Both now wait in a partition that is down: pending, listed by sprio, and, unlike jobs queued behind a
    # running blocker, with nobody's usage growing between the two accountant runs below.
    slurm.run(["scontrol", "update", "PartitionName=vpc", "State=DOWN"])
    try:
        _pending_jobs_get_penalty_once(world, slurm, shared_tmp, bob, t0)
    finally:
        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=UP"])


def _pending_jobs_get_penalty_once(world, slurm, shared_tmp, bob, t0) -> None:
    pend = ["-p", "vpc", "--gres=gpu:1", f"--chdir={shared_tmp}"]
    bob_pending = submit_as(slurm, "stune-bob", "biology", pend, "true")
    alice_pending = submit_as(slurm, "stune-alice", "physics", pend, "true")
    wait_until(
        "both pending jobs in sprio",
        lambda: {bob_pending, alice_pending} <= {r.job_id for r in slurm.sprio()},
    )

    # Only this test's jobs: the accountant's first read starts when this test did. slurmdbd records a
    # finished job's end a little after it ends (later on 24.11): wait until every run in the window that is
    # not pending has its end, or the second apply would rightly settle a run the first saw as running.
    window_start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0 - 60))
    wait_until(
        "accounting to record every run's end",
        lambda: all(
            r["State"].split()[0] == "PENDING" or r["End"] not in ("", "Unknown", "None")
            for r in slurm.sacct(["JobIDRaw", "State", "End"], start=window_start)
        ),
        timeout=60,
    )
    world.state.joinpath("ledger.json").unlink(missing_ok=True)
    world.write_config(initial_history=int(time.time()) - t0 + 2)
    dry = world.stune("apply", "--dry-run")
    assert f"job {bob_pending} (stune-bob/biology): SiteFactor 0 -> -" in dry.stdout
    assert "would set" in dry.stdout and f"job {alice_pending}" not in dry.stdout
    assert {r.job_id: r.site for r in slurm.sprio()}[bob_pending] == 0  # a dry run changes nothing
    assert not world.state.joinpath("ledger.json").exists()

    first = world.stune("apply")
    assert "1 SiteFactor change(s) applied" in first.stdout
    sprio = {r.job_id: r for r in slurm.sprio()}
    # Three user associations (root 1, bob 2/3, alice 1/3 in Slurm's ranks); stune swaps bob and alice.
    # alice, the top gainer, stays at 0; bob drops below her, but not to Slurm's floor of 1: fair-share
    # points + SiteFactor = a x F_stune + b with the lowest at 1 point (a = 3 x (W/3 - 1), b = W/3 - a/3)
    site = sprio[bob_pending].site
    assert sprio[alice_pending].site == 0 and -round(2 * 10000 / 3) <= site < -3333
    assert sprio[bob_pending].fairshare + site == pytest.approx(1, abs=1)
    assert sprio[bob_pending].priority < sprio[alice_pending].priority
    # sprio rounds each column: the sum may be one off
    assert (
        abs(sprio[bob_pending].priority - (sprio[bob_pending].fairshare + sprio[bob_pending].age + site)) <= 1
    )
    ledger = json.loads(world.state.joinpath("ledger.json").read_text())

    second = world.stune("apply")
    assert "0 SiteFactor change(s) applied, 2 pending job(s) already right; 0 run(s) settled" in second.stdout
    assert {r.job_id: r.site for r in slurm.sprio()} == {j: r.site for j, r in sprio.items()}
    again = json.loads(world.state.joinpath("ledger.json").read_text())
    assert again["settled"] == ledger["settled"]
    assert again["usage"].keys() == ledger["usage"].keys()
    for key, (slurm_usage, stune_usage) in again["usage"].items():
        assert slurm_usage == pytest.approx(ledger["usage"][key][0], rel=1e-4)
        assert stune_usage == pytest.approx(ledger["usage"][key][1], rel=1e-4)

    # The report: per account held vs used, the chart, the metrics.
    png, prom = world.root / "report.png", world.root / "fairshare.prom"
    rep = world.stune(
        "report", "--format", "json", "--png", str(png), "--prom", str(prom), "--since", f"@{t0}"
    )  # this test's jobs: not the previous test's cancelled one
    doc = json.loads(rep.stdout)
    accounts = {a["account"]: a for a in doc["accounts"]}
    assert accounts["physics"]["efficiency"] == pytest.approx(0.9, abs=0.02)
    assert accounts["biology"]["efficiency"] == pytest.approx(0.1, abs=0.02)
    assert accounts["biology"]["idle_gpu_h"] > accounts["physics"]["idle_gpu_h"]
    users = {u["user"]: u for u in doc["users"]}
    assert users["stune-bob"]["site_factor"] < 0 == users["stune-alice"]["site_factor"]
    assert users["stune-bob"]["fairshare_stune"] < users["stune-alice"]["fairshare_stune"]
    assert users["stune-bob"]["fairshare_sshare"] is not None
    assert doc["top_idle"][0]["job_id"] == str(bob)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    metrics = prom.read_text()
    assert 'stune_gpu_hours_held{account="biology",user="stune-bob"}' in metrics
    assert 'stune_fairshare_factor{account="biology",kind="stune",user="stune-bob"}' in metrics
    table = world.stune("report", "--since", f"@{world.started}")
    assert "stune-bob" in table.stdout and "Jobs with the most idle GPU time" in table.stdout
    slurm.cancel([bob_pending, alice_pending])


def test_a_multi_node_job_is_merged_and_late_nodes_are_swept_in(world, slurm, shared_tmp):
    write_snapshot(world.snapshots["n1"], 90, gpus=4, power=310.0)
    write_snapshot(world.snapshots["n2"], 10, gpus=4, power=90.0)
    job = submit_as(
        slurm,
        "stune-alice",
        "physics",
        ["-N2", "-w", "n[1-2]", "--gres=gpu:1", f"--chdir={shared_tmp}"],
        "sleep 6",
    )
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    merged = wait_summary(slurm, job)
    assert (merged.gpus, merged.nodes_reported, merged.nodes_expected) == (2, 2, 2)
    assert {g.node: round(g.sm) for g in merged.per_gpu} == {"n1": 90, "n2": 10}
    assert merged.eta == pytest.approx(0.5, abs=0.02)
    assert not (world.spool / str(job)).exists()  # complete: the spool directory is gone

    # A node whose summary came too late for EpilogSlurmctld: `collect` stores the job again, whole.
    late = world.spool / str(job)
    late.mkdir()
    docs = [
        {
            "v": 1,
            "job": str(job),
            "node": n,
            "start": 0,
            "end": 100,
            "gpus": [
                {
                    "id": 0,
                    "acc": {**dict.fromkeys(summary.ACC_FIELDS, 0.0), "sm_dt": 100.0, "sm_sum": eta * 100},
                }
            ],
        }
        for n, eta in (("n1", 0.8), ("n3", 0.2))
    ]
    (late / "n1.json").write_text(json.dumps(docs[0]))
    (late / "stored").write_text(json.dumps({"stored": ["n1"], "expected": ["n1", "n3"], "at": 0}))
    out = world.stune("collect", "--min-age", "0").stdout
    assert out == ""  # nothing new since the last store
    (late / "n3.json").write_text(json.dumps(docs[1]))
    out = world.stune("collect", "--min-age", "0").stdout
    assert out.strip() == f"job {job}: stored (2/2 nodes); removed"
    again = summary.parse(admin_comment(slurm, job))
    assert (again.nodes_reported, again.used, again.covered) == (2, 100.0, 200.0)
    assert not late.exists()


def test_a_cpu_job_stores_nothing(world, slurm, shared_tmp):
    job = submit_as(slurm, "stune-bob", "biology", ["-c", "1", f"--chdir={shared_tmp}"], "true")
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=60) == "COMPLETED"
    wait_until(
        "EpilogSlurmctld's verdict", lambda: f"job {job}: no GPUs" in world.store_log.read_text(), timeout=30
    )
    assert admin_comment(slurm, job) == ""


def test_with_eta_1_everywhere_stunes_factors_equal_sshare(world, slurm, shared_tmp, cluster):
    """Reset Slurm's usage, run jobs of different sizes, wait for Slurm's next fair-share pass, then run the
    accountant on the same jobs with every eta = 1 (AdminComment dropped from the dump)."""
    slurm.run(["sacctmgr", "-i", "modify", "account", "where", "name=root", "set", "RawUsage=0"])
    t0 = int(time.time())
    # sacct's times are whole seconds: the jobs must start in a later second than the reset
    wait_until(
        "the clock to pass the reset's second", lambda: int(time.time()) > t0, timeout=5, interval=0.05
    )
    jobs = [
        submit_as(slurm, "stune-alice", "physics", ["-c", "4", f"--chdir={shared_tmp}"], "sleep 6"),
        submit_as(
            slurm, "stune-bob", "biology", ["-c", "1", "--gres=gpu:1", f"--chdir={shared_tmp}"], "sleep 6"
        ),
    ]
    for job in jobs:
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    last_end = max(int(r["End"]) for r in slurm.sacct(["JobIDRaw", "End"], job_ids=[str(j) for j in jobs]))
    decay_file = cluster.layout.spool / "ctld" / "priority_last_decay_ran"
    wait_until(
        "Slurm's next fair-share pass (PriorityCalcPeriod is 1 minute)",
        lambda: decay_file.exists() and decay_file.stat().st_mtime > last_end + 1,
        timeout=90,
        interval=1,
    )
    sshare = {(r.account, r.user): r for r in slurm.sshare() if r.user}

    dump = world.root / "eta1.txt"
    text = slurm.sacct_dump(list(FIELDS), start=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0)))
    lines = text.splitlines()
    dump.write_text("\n".join([lines[0]] + [line.rsplit("|", 1)[0] + "|" for line in lines[1:]]) + "\n")
    rep = world.stune(
        "report", "--sacct-file", str(dump), "--cluster", "--format", "json", "--now", str(int(time.time()))
    )
    doc = json.loads(rep.stdout)
    users = {(u["account"], u["user"]): u for u in doc["users"]}
    assert set(users) == set(sshare)
    for key, row in sshare.items():
        assert (
            users[key]["fairshare_stune"]
            == users[key]["fairshare_slurm"]
            == pytest.approx(row.fairshare, abs=1e-6)
        ), key
    # and the usage behind it is Slurm's own: billing x seconds (sshare prints RawUsage as an integer)
    assert sshare[("physics", "stune-alice")].raw_usage > sshare[("biology", "stune-bob")].raw_usage > 0
    assert len({r.fairshare for r in sshare.values()}) == 3  # distinct ranks: the comparison means something


def test_three_accounts_end_in_stunes_order_in_sprio(world, slurm, shared_tmp, cluster):
    """#12 §1 on a three-account tree: physics/alice holds 2 GPUs 20 s at 100 %, biology/bob 14 s at 0 %,
    chemistry/alice 17 s at 60 %. Slurm ranks by usage (bob, chemistry, physics); stune with alpha 3 charges
    idle GPUs (physics 20, chemistry 37, bob 56: margins well above a second of timing noise). After one
    `apply`, the pending jobs' priorities in sprio follow stune's order strictly: physics > chemistry > bob;
    nobody gained."""
    from stune_dev.devcluster import CLUSTER_NAME

    sacctmgr(slurm, ["add", "account", "chemistry", f"Cluster={CLUSTER_NAME}", "Fairshare=1"])
    sacctmgr(slurm, ["add", "user", "stune-alice", "Account=chemistry", f"Cluster={CLUSTER_NAME}"])
    try:
        slurm.run(["sacctmgr", "-i", "modify", "account", "where", "name=root", "set", "RawUsage=0"])
        t0 = int(time.time())
        for node, sm, power in (("n1", 100, 300.0), ("n2", 0, 60.0), ("n3", 60, 200.0)):
            write_snapshot(world.snapshots[node], sm, gpus=4, power=power)
        args = ["--gres=gpu:2", "-c", "1", "--hold", f"--chdir={shared_tmp}"]
        runs = [
            ("stune-alice", "physics", "n1", 20),
            ("stune-bob", "biology", "n2", 14),
            ("stune-alice", "chemistry", "n3", 17),
        ]
        jobs = [
            submit_as(slurm, user, account, ["-w", node, *args], f"sleep {secs}")
            for user, account, node, secs in runs
        ]
        slurm.run(["scontrol", "release", ",".join(map(str, jobs))])
        for job in jobs:
            assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
        for job in jobs:
            wait_summary(slurm, job)
        wait_calc_pass(slurm, cluster, jobs)

        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=DOWN"])
        try:
            pend = ["-p", "vpc", "--gres=gpu:1", f"--chdir={shared_tmp}"]
            pending = {account: submit_as(slurm, user, account, pend, "true") for user, account, _, _ in runs}
            wait_until(
                "pending jobs in sprio", lambda: set(pending.values()) <= {r.job_id for r in slurm.sprio()}
            )
            before = {r.job_id: r for r in slurm.sprio()}
            # Slurm alone ranks the idle user first
            assert before[pending["biology"]].fairshare > before[pending["physics"]].fairshare
            world.state.joinpath("ledger.json").unlink(missing_ok=True)
            world.write_config(initial_history=int(time.time()) - t0 + 2, alpha=3)
            world.stune("apply")
            after = {r.job_id: r for r in slurm.sprio()}
            prio = {account: after[job].priority for account, job in pending.items()}
            assert prio["physics"] > prio["chemistry"] > prio["biology"], prio
            assert all(after[job].site <= 0 for job in pending.values())
            assert max(after[job].site for job in pending.values()) == 0  # the top gainer keeps Slurm's
            # the lowest sits exactly on the line's floor (1 point), not below it where Slurm would tie it
            low = after[pending["biology"]]
            assert low.fairshare + low.site == pytest.approx(1, abs=1)
            # explain answers "why is my priority low?" in one command, as the user
            user_config = Path(shared_tmp) / "fairshare-user.yaml"  # pytest's tmp is root's alone
            user_config.write_text(world.config.read_text())
            user_config.chmod(0o644)
            as_bob = {**world.env(), "STUNE_FAIRSHARE_CONFIG": str(user_config)}
            why = subprocess.run(
                ["runuser", "-u", "stune-bob", "--", f"{VENV_BIN}/stune-fairshare", "explain", "--json"],
                capture_output=True,
                text=True,
                env=as_bob,
                timeout=120,
            )
            assert why.returncode == 0, why.stderr
            doc = json.loads(why.stdout)
            assert doc["user"] == "stune-bob"
            bio = {a["account"]: a for a in doc["associations"]}["biology"]
            assert bio["site_factor"] == after[pending["biology"]].site
            assert bio["fairshare_stune"] < bio["fairshare_slurm"]
            assert bio["top_idle_jobs"][0]["job_id"] == str(jobs[1])
            text = subprocess.run(
                ["runuser", "-u", "stune-bob", "--", f"{VENV_BIN}/stune-fairshare", "explain"],
                capture_output=True,
                text=True,
                env=as_bob,
                timeout=120,
            )
            assert "priority points fewer than Slurm alone gives them" in text.stdout, (
                text.stdout + text.stderr
            )
            # "was my job idle?": one command, as the owner; another user is refused
            mine = subprocess.run(
                [
                    "runuser",
                    "-u",
                    "stune-bob",
                    "--",
                    f"{VENV_BIN}/stune-fairshare",
                    "job",
                    str(jobs[1]),
                    "--json",
                ],
                capture_output=True,
                text=True,
                env=as_bob,
                timeout=60,
            )
            assert mine.returncode == 0, mine.stderr
            job_doc = json.loads(mine.stdout)
            assert job_doc["eta"] == pytest.approx(0.0, abs=0.01) and job_doc["charged_x"] == pytest.approx(
                4.0, abs=0.05
            )
            assert any("idle almost all the time" in h for h in job_doc["hints"])
            assert [g["node"] for g in job_doc["per_gpu"]] == ["n2", "n2"]
            theirs = subprocess.run(
                ["runuser", "-u", "stune-bob", "--", f"{VENV_BIN}/stune-fairshare", "job", str(jobs[0])],
                capture_output=True,
                text=True,
                env=as_bob,
                timeout=60,
            )
            assert theirs.returncode != 0 and "belongs to another user" in theirs.stderr
            assert "Traceback" not in theirs.stderr
        finally:
            slurm.run(["scontrol", "update", "PartitionName=vpc", "State=UP"])
    finally:
        cancel_everything(slurm)
        slurm.run(
            ["sacctmgr", "-i", "delete", "user", "stune-alice", "where", "account=chemistry"], check=False
        )
        slurm.run(["sacctmgr", "-i", "delete", "account", "chemistry"], check=False)


def test_idle_policy_warns_then_cancels_an_idle_batch_job_only(world, slurm, shared_tmp, cluster):
    """#12 §4 on the cluster: vpc opts in (warn after 12 s, cancel after 24 s below 5 %). bob's batch job
    on n3 sits idle: a dry run lists it and changes nothing; then it is warned (its stderr file, written as
    bob, and its Comment) and, once idle for the cancel window, cancelled with the reason in its record.
    alice's busy job on n1 and bob's interactive srun on n3 are left alone."""
    import shutil

    parts = world.root / "partitions"
    parts.mkdir(exist_ok=True)
    for f in (REPO / "partitions").glob("*.yaml"):
        shutil.copy(f, parts / f.name)
    with open(parts / "vpc.yaml", "a") as fh:
        fh.write(
            "idle_policy:\n  enabled: true\n  threshold: 5\n  warn_after: 12s\n  cancel_after: 24s\n"
            "  min_coverage: 0.8\n"
        )
    write_snapshot(world.snapshots["n3"], 0, gpus=4, power=60.0)
    write_snapshot(world.snapshots["n1"], 90, gpus=4, power=300.0)
    err = Path(shared_tmp) / "idle.err"
    idle = submit_as(
        slurm,
        "stune-bob",
        "biology",
        ["-p", "vpc", "-w", "n3", "--gres=gpu:1", f"--chdir={shared_tmp}", "-e", str(err)],
        "sleep 300",
    )
    busy = submit_as(
        slurm,
        "stune-alice",
        "physics",
        ["-p", "vpc", "-w", "n1", "--gres=gpu:1", f"--chdir={shared_tmp}"],
        "sleep 300",
    )
    interactive = subprocess.Popen(
        [
            "runuser",
            "-u",
            "stune-bob",
            "--",
            "srun",
            "-A",
            "biology",
            "-p",
            "vpc",
            "-w",
            "n3",
            "--gres=gpu:1",
            f"--chdir={shared_tmp}",
            "sleep",
            "300",
        ],
        env=world.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until("jobs running", lambda: len(list(slurm.jobs(states=["RUNNING"]))) == 3, timeout=60)
        inter_id = next(j.job_id for j in slurm.jobs(states=["RUNNING"]) if j.job_id not in (idle, busy))
        env = {**world.env(), "STUNE_USAGE_DIR": f"{cluster.layout.root}/nodes/%n/usage"}
        log = world.root / "idle-policy.log"

        def policy(*args):
            proc = subprocess.run(
                [
                    f"{VENV_BIN}/stune-fairshare",
                    "idle-policy",
                    "--partitions",
                    str(parts),
                    "--log",
                    str(log),
                    *args,
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        # warn_after is 12s: wait until the sampled window says so, not for a guessed time
        def dry_run_once(says: str):
            out = policy("--dry-run", "--node", "n3")
            return out if says in out else None

        dry = wait_until(
            "12s of idle samples on n3",
            lambda: dry_run_once(
                f"job {idle} (stune-bob/biology, vpc): would warn: GPU utilization 0.0% < 5%"
            ),
            timeout=90,
            interval=1,
        )
        assert f"job {inter_id} (stune-bob/biology, vpc): skip: interactive job (exempt)" in dry, dry
        assert "stune" not in slurm.job(idle).comment and "stune" not in err.read_text()

        out = policy("--node", "n3")
        assert f"job {idle} (stune-bob/biology, vpc): warned:" in out, out
        assert slurm.job(idle).comment.startswith("stune: idle GPUs warned: GPU utilization 0.0% < 5%")
        text = err.read_text()
        assert (
            "stune: this job's GPUs have been idle" in text
            and "cancelled once they stay idle for 24s" in text
        )
        assert os.stat(err).st_uid == pwd_uid("stune-bob")  # still bob's file
        assert f"job {busy} (stune-alice/physics, vpc): ok: GPU utilization 90.0%" in policy("--node", "n1")
        # "was my job idle?" while it runs: bob asks, from the sampler's live accumulators
        user_config = Path(shared_tmp) / "fairshare-user.yaml"
        user_config.write_text(world.config.read_text())
        user_config.chmod(0o644)
        live = subprocess.run(
            ["runuser", "-u", "stune-bob", "--", f"{VENV_BIN}/stune-fairshare", "job", str(idle), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "STUNE_FAIRSHARE_CONFIG": str(user_config)},
        )
        assert live.returncode == 0, live.stderr
        doc = json.loads(live.stdout)
        assert (
            doc["state"] == "RUNNING"
            and doc["source"] == "stune (live)"
            and doc["eta"] == pytest.approx(0, abs=0.01)
        )
        assert [g["node"] for g in doc["per_gpu"]] == ["n3"] and doc["timeline"] and max(doc["timeline"]) == 0

        wait_until(
            "24s of idle samples on n3",
            lambda: dry_run_once(f"job {idle} (stune-bob/biology, vpc): would cancel: "),
            timeout=90,
            interval=1,
        )
        out = policy("--node", "n3")
        assert (
            f"job {idle} (stune-bob/biology, vpc): cancelled: GPU utilization 0.0% < 5% over the last 24s"
            in out
        )
        assert wait_for_state(slurm, idle, ("CANCELLED",), timeout=60) == "CANCELLED"
        assert slurm.job_record(idle).get("Comment", "").startswith("stune: cancelled for idle GPUs")
        assert "stune: cancelled for idle GPUs" in err.read_text()
        assert slurm.job(busy).state == "RUNNING" and slurm.job(inter_id).state == "RUNNING"
        logged = log.read_text()
        assert "dry-run job" in logged and f"n3 job {idle} (stune-bob/biology, vpc): cancelled" in logged
    finally:
        interactive.terminate()
        interactive.wait(timeout=30)


def pwd_uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


# ---- faults lose nothing (#28) -------------------------------------------------------------------------------


def test_a_poisoned_ledger_changes_no_site_factor(world, slurm, shared_tmp):
    """A ledger holding NaN, inf, -1e300, 1e308 or "abc" is refused in one line naming the file and the key
    (exit 1): the file is kept and no pending job's SiteFactor moves (sprio, as Slurm has it)."""
    world.write_config()
    ledger = world.state / "ledger.json"
    slurm.run(["scontrol", "update", "PartitionName=vpc", "State=DOWN"])
    try:
        pend = ["-p", "vpc", "--gres=gpu:1", f"--chdir={shared_tmp}"]
        jobs = [
            submit_as(slurm, "stune-alice", "physics", pend, "true"),
            submit_as(slurm, "stune-bob", "biology", pend, "true"),
        ]
        wait_until("pending jobs in sprio", lambda: set(jobs) <= {r.job_id for r in slurm.sprio()})
        world.stune("apply")  # a sound ledger to poison
        sound = json.loads(ledger.read_text())
        for job in jobs:  # a value no apply sets here: any SiteFactor apply wrote would show
            slurm.run(["scontrol", "update", f"JobId={job}", "SiteFactor=77"])
        wait_until(
            "SiteFactor 77 in sprio", lambda: all(r.site == 77 for r in slurm.sprio() if r.job_id in jobs)
        )
        for bad in (float("nan"), float("inf"), -1e300, 1e308, "abc"):
            doc = dict(sound, usage={**sound["usage"], "physics|stune-alice": [bad, 1.0]})
            ledger.write_text(json.dumps(doc))
            before = ledger.read_bytes()
            proc = world.stune("apply", check=False)
            assert proc.returncode == 1, (bad, proc.stderr)
            assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
                f"stune-fairshare: {ledger}: usage.physics|stune-alice[0]: "
            ), proc.stderr
            assert ledger.read_bytes() == before
            assert {r.job_id: r.site for r in slurm.sprio() if r.job_id in jobs} == dict.fromkeys(jobs, 77), (
                bad
            )
    finally:
        slurm.run(["scontrol", "update", "PartitionName=vpc", "State=UP"])
        cancel_everything(slurm)
        (world.state / "ledger.json").unlink(missing_ok=True)


def _stop_slurmdbd(cluster) -> None:
    import signal

    from stune_dev.host import port_open

    pid = int(cluster.layout.pidfile("slurmdbd").read_text().split()[0])
    os.kill(pid, signal.SIGTERM)
    wait_until(
        "slurmdbd to stop",
        lambda: not os.path.exists(f"/proc/{pid}") and not port_open(cluster.layout.dbd_port),
        timeout=60,
    )


def _start_slurmdbd(cluster) -> None:
    """Start it again; a second try when the first start is judged too early (its pidfile read mid-fork)."""
    from stune_dev.devcluster import ClusterError
    from stune_dev.host import port_open

    try:
        cluster.start_slurmdbd()
    except ClusterError:
        time.sleep(2)
        if not port_open(cluster.layout.dbd_port):
            cluster.start_slurmdbd()


def test_after_a_slurmdbd_outage_collect_leaves_no_spool_for_complete_jobs(world, slurm, shared_tmp, cluster):
    """slurmdbd stops while three GPU jobs (one of them on two nodes) finish: EpilogSlurmctld cannot store
    them, but it recorded each job's node list first. Once slurmdbd is back, `collect` stores each whole
    (k/k nodes) and removes its spool directory at once. A 2-node job whose second node never reported, with
    no node list recorded, is stored as partial (1/2), never as complete, and its directory is kept."""
    for node, sm in (("n1", 80), ("n2", 40), ("n3", 20)):
        write_snapshot(world.snapshots[node], sm, gpus=4, power=200.0)
    args = ["--gres=gpu:1", f"--chdir={shared_tmp}"]
    jobs = {
        submit_as(slurm, "stune-alice", "physics", ["-w", "n1", *args], "sleep 15"): 1,
        submit_as(slurm, "stune-bob", "biology", ["-w", "n2", *args], "sleep 15"): 1,
        submit_as(slurm, "stune-alice", "physics", ["-N2", "-w", "n[2-3]", *args], "sleep 15"): 2,
    }
    for job in jobs:
        wait_for_state(slurm, job, ("RUNNING", "COMPLETED"), timeout=60)
    log_start = world.store_log.stat().st_size if world.store_log.exists() else 0
    _stop_slurmdbd(cluster)
    try:
        ids = {str(j) for j in jobs}  # sacct cannot answer now: slurmctld's queue says when they are done
        wait_until(
            "the jobs to finish",
            lambda: not ids & set(slurm.run(["squeue", "-h", "-o", "%i"], check=False).split()),
            timeout=90,
            interval=0.5,
        )

        def failed_stores() -> int:
            with open(world.store_log, "rb") as fh:
                fh.seek(log_start)
                return fh.read().decode(errors="replace").count("sacctmgr failed")

        wait_until("EpilogSlurmctld's three failed stores", lambda: failed_stores() >= len(jobs), timeout=90)
        for job, n in jobs.items():
            marker = json.loads((world.spool / str(job) / "stored").read_text())
            assert len(marker["expected"]) == n and marker["stored"] == []  # recorded before the failed store
    finally:
        _start_slurmdbd(cluster)
    wait_until(
        "the jobs in slurmdbd",
        lambda: len(slurm.sacct(["JobIDRaw"], job_ids=[str(j) for j in jobs])) >= len(jobs),
        timeout=120,
        interval=1,
    )
    out = world.stune("collect", "--min-age", "0").stdout
    for job, n in jobs.items():
        assert f"job {job}: stored ({n}/{n} nodes); removed" in out, out
        assert not (world.spool / str(job)).exists()
        stored = wait_summary(slurm, job)
        assert (stored.nodes_reported, stored.nodes_expected) == (n, n)

    # the 2-node job again, as if n3 had never reported and no EpilogSlurmctld had run
    two = next(job for job, n in jobs.items() if n == 2)
    late = world.spool / str(two)
    late.mkdir()
    doc = {
        "v": 1,
        "job": str(two),
        "node": "n2",
        "start": 0,
        "end": 100,
        "gpus": [
            {"id": 0, "acc": {**dict.fromkeys(summary.ACC_FIELDS, 0.0), "sm_dt": 100.0, "sm_sum": 50.0}}
        ],
    }
    (late / "n2.json").write_text(json.dumps(doc))
    out = world.stune("collect", "--min-age", "0").stdout
    assert out.strip() == f"job {two}: stored partial (1 node(s))", out
    partial = summary.parse(admin_comment(slurm, two))
    assert (partial.nodes_reported, partial.nodes_expected) == (1, 2)
    assert late.exists() and json.loads((late / "stored").read_text())["expected"] == ["n2", "n3"]
