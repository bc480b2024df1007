"""The accountant end to end, without a cluster: what-if runs on sacct dumps, the eta = 1 property, and the
watermark/ledger logic.

The incremental tests feed the accountant from `RowsSlurm`, a stand-in that serves sacct rows out of a list
(filtered by the time window the way `sacct -S/-E` selects jobs) and records SiteFactor writes. It stands in
for data only; what Slurm itself does (sacct, sshare, sprio, SiteFactor) is tested on the local cluster in
test_fairshare_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.errors import ConfigError
from slurm_tune.fairshare import accountant
from slurm_tune.fairshare.ledger import Ledger, LedgerError
from slurm_tune.fairshare.sacct import FIELDS
from slurm_tune.slurm import Association, Job, PrioRow
from slurm_tune.usage.config import load_config

HEADER = "|".join(FIELDS)
USERS = {"stune-alice": "physics", "stune-bob": "biology", "root": "root", "carol": "physics"}
ASSOCS = [
    Association("root", "", "", 1, "", 1),
    Association("biology", "", "root", 1, "", 2),
    Association("biology", "stune-bob", "", 1, "", 3),
    Association("physics", "", "root", 2, "", 4),
    Association("physics", "stune-alice", "", 1, "", 5),
    Association("physics", "carol", "", 3, "", 6),
    Association("root", "root", "", 1, "", 7),
]
# the local cluster's tree: two accounts of equal shares, one user each
EQUAL = [
    Association("root", "", "", 1, "", 1),
    Association("biology", "", "root", 1, "", 2),
    Association("biology", "stune-bob", "", 1, "", 3),
    Association("physics", "", "root", 1, "", 4),
    Association("physics", "stune-alice", "", 1, "", 5),
    Association("root", "root", "", 1, "", 6),
]


def summary(held, used, covered):
    return f"stune1 held={held:.1f} used={used:.1f} cov={covered:.1f} busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="


def row(job, user, start, elapsed, gpus=2, billing=4, comment="", running=False, qos="normal"):
    end = "Unknown" if running else start + elapsed
    return (
        f"{job}|{job}|{user}|{USERS[user]}|hdr|{qos}|{'RUNNING' if running else 'COMPLETED'}|{start}|{end}|"
        f"{elapsed}|billing={billing},cpu={billing},gres/gpu={gpus},node=1|{comment}"
    )


def write_config(tmp_path, text=""):
    path = tmp_path / "fairshare.yaml"
    path.write_text(f"accountant:\n  state_dir: {tmp_path / 'state'}\n  settle_delay: 300\n" + text)
    return load_config(str(path))


class RowsSlurm:
    """Serves sacct rows from a list; pending jobs and sprio from lists; records SiteFactor writes."""

    def __init__(self, rows=(), pending=(), half_life="7-00:00:00", flags="", assocs=ASSOCS):
        self.rows = list(rows)
        self.assocs = list(assocs)
        self.pending = list(pending)
        self.site = {}
        self.writes = []
        self.timeout = 30
        self.conf = {
            "PriorityType": "priority/multifactor",
            "PriorityDecayHalfLife": half_life,
            "PriorityFlags": flags,
            "PriorityWeightFairShare": "10000",
            "PrioritySiteFactorPlugin": "(null)",
            "AccountingStorageTRES": "cpu,mem,gres/gpu",
            "ClusterName": "stune",
        }

    def config(self):
        return dict(self.conf)

    def qos_usage_factors(self):
        return {"normal": 1.0}

    def associations(self):
        return list(self.assocs)

    def sacct_dump(self, fields, *, start=None, end=None, allocations=True, duplicates=True, timeout=None):
        lo = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        hi = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        keep = []
        for r in self.rows:
            cols = r.split("|")
            s, e = int(cols[7]), (int(cols[8]) if cols[8].isdigit() else None)
            if s <= hi and (e is None or e >= lo):
                keep.append(r)
        return "\n".join([HEADER, *keep]) + "\n"

    def jobs(self, states=None, **_):
        return list(self.pending)

    def pending_jobs(self):
        return [(j.job_id, j.account, j.user) for j in self.pending]

    def sprio(self, job_ids=None):
        return [
            PrioRow(j.job_id, j.user, 10000, self.site.get(j.job_id, 0), 0, 0, 0.0, "hdr")
            for j in self.pending
        ]

    def set_site_factor(self, job_id, value):
        for j in str(job_id).split(","):
            self.site[int(j)] = value
        self.writes.append((str(job_id), value))

    def sshare(self):
        return []


def pending_job(job_id, user):
    return Job(
        job_id,
        "w",
        user,
        USERS[user],
        "hdr",
        "PENDING",
        "Resources",
        "",
        1,
        10000,
        "",
        "",
        0,
        0,
        0,
        "",
        "",
        False,
        0,
        "",
    )


# ---- what-if runs on dumps: the eta = 1 property ----------------------------------------------------------
eta1_comment = st.sampled_from(["none", "full", "low", "other"])


@st.composite
def eta1_dumps(draw):
    """Random job sets in which no job has a trusted eta below 1: no summary, 100 % utilization, too little
    coverage, no GPUs, somebody else's comment, or still running."""
    lines = []
    t = 1_700_000_000
    for job in range(1, draw(st.integers(1, 40)) + 1):
        user = draw(st.sampled_from(sorted(USERS)))
        start = t + draw(st.integers(0, 20 * 86400))
        elapsed = draw(st.integers(1, 2 * 86400))
        gpus = draw(st.integers(0, 8))
        kind = draw(eta1_comment)
        held = gpus * elapsed
        comment = {
            "none": "",
            "other": "admin: re-run after maintenance",
            "full": summary(held, held, held),
            "low": summary(held, 0.01 * held, 0.3 * held),
        }[kind]
        lines.append(
            row(
                job,
                user,
                start,
                elapsed,
                gpus=gpus,
                billing=draw(st.integers(1, 64)),
                comment=comment,
                running=draw(st.booleans()) and job % 5 == 0,
            )
        )
    return "\n".join([HEADER, *lines]) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eta1_dumps(), st.sampled_from(["fair_tree", "classic"]), st.floats(0.1, 20))
def test_with_eta_1_everywhere_stunes_factor_is_slurms(tmp_path, dump, algorithm, alpha):
    path = tmp_path / "dump.txt"
    path.write_text(dump)
    config = write_config(tmp_path, f"  alpha: {alpha}\n")
    slurm = RowsSlurm(flags="NO_FAIR_TREE" if algorithm == "classic" else "")
    result = accountant.run(config, slurm, sacct_file=str(path), plan=False)
    assert result.settings.algorithm == algorithm
    assert result.usage_stune == result.usage_slurm
    assert result.shares_stune.factors == result.shares_slurm.factors


def test_penalized_user_drops_below_the_one_who_uses_their_gpus(tmp_path):
    t = 1_700_000_000
    dump = tmp_path / "dump.txt"
    dump.write_text(
        "\n".join(
            [
                HEADER,
                row(1, "stune-alice", t, 3600, comment=summary(7200, 0.9 * 7200, 7200)),
                row(2, "stune-bob", t, 3600, comment=summary(7200, 0.1 * 7200, 7200)),
            ]
        )
        + "\n"
    )
    config = write_config(tmp_path)
    result = accountant.run(config, RowsSlurm(assocs=EQUAL), sacct_file=str(dump), plan=False)
    slurm_fs, stune_fs = result.shares_slurm.factors, result.shares_stune.factors
    # Slurm sees two equal jobs (alice and bob tied); stune charges bob 1.9x (alpha 1, eta 0.1), alice 1.1x.
    assert slurm_fs[("biology", "stune-bob")] == slurm_fs[("physics", "stune-alice")] == pytest.approx(2 / 3)
    assert result.usage_slurm[("physics", "stune-alice")] == result.usage_slurm[("biology", "stune-bob")]
    assert result.usage_stune[("biology", "stune-bob")] / result.usage_slurm[
        ("biology", "stune-bob")
    ] == pytest.approx(1.9)
    assert stune_fs[("biology", "stune-bob")] == pytest.approx(1 / 3)
    assert stune_fs[("physics", "stune-alice")] == pytest.approx(2 / 3)


# ---- incremental runs ----------------------------------------------------------------------------------
def test_second_run_over_the_same_window_changes_nothing(tmp_path):
    now = 1_800_000_000
    rows = [
        row(1, "stune-alice", now - 9000, 3600, comment=summary(7200, 6480, 7200)),
        row(2, "stune-bob", now - 9000, 3600, comment=summary(7200, 720, 7200)),
        row(3, "carol", now - 100, 50, gpus=0, billing=1),
    ]  # ended 50 s ago: provisional
    slurm = RowsSlurm(
        rows,
        pending=[pending_job(100, "stune-alice"), pending_job(101, "stune-bob")],
        assocs=[*EQUAL, Association("physics", "carol", "", 1, "", 7)],
    )
    config = write_config(tmp_path)
    first = accountant.run_locked(config, slurm, now=now)
    assert first.settled_now == 2 and first.provisional == 1
    assert first.applied and len(first.changes) == 1
    change = first.changes[0]
    assert change.job_id == 101 and change.target < 0 and slurm.site[101] == change.target
    ledger_after_first = Ledger.load(accountant.ledger_path(config))

    second = accountant.run_locked(config, slurm, now=now + 5)
    assert second.settled_now == 0
    assert second.changes == [] and not second.applied
    assert second.kept == 2
    ledger = Ledger.load(accountant.ledger_path(config))
    assert ledger.settled == ledger_after_first.settled
    for key, (slurm_usage, stune_usage) in ledger.usage.items():  # only 5 s of decay
        assert slurm_usage == pytest.approx(ledger_after_first.usage[key][0], rel=1e-5)
        assert stune_usage == pytest.approx(ledger_after_first.usage[key][1], rel=1e-5)
    assert len(slurm.writes) == 1


def test_each_run_is_charged_once_even_when_its_record_arrives_late(tmp_path):
    now = 1_800_000_000
    slurm = RowsSlurm([row(1, "stune-alice", now - 5000, 1000)])
    config = write_config(tmp_path)
    accountant.run_locked(config, slurm, now=now, plan=False)
    once = Ledger.load(accountant.ledger_path(config)).usage[("physics", "stune-alice")][0]
    # a job that ended before the first run's watermark (now - 300) but reached the database only after it
    # (slurmdbd was behind, by less than settle_delay)
    slurm.rows.append(row(2, "stune-alice", now - 1400, 1000))
    # and a requeued run of job 1: same id, new start
    slurm.rows.append(row(1, "stune-alice", now - 300, 100))
    later = accountant.run_locked(config, slurm, now=now + 600, plan=False)
    assert later.settled_now == 2
    usage = Ledger.load(accountant.ledger_path(config)).usage[("physics", "stune-alice")][0]
    assert usage == pytest.approx(once * 2 ** (-600 / (7 * 86400)) + 4 * 1000 + 4 * 100, rel=1e-3)
    again = accountant.run_locked(config, slurm, now=now + 700, plan=False)
    assert again.settled_now == 0


def test_a_summary_that_lands_after_the_job_ended_is_still_used(tmp_path):
    now = 1_800_000_000
    slurm = RowsSlurm([row(1, "stune-bob", now - 1100, 1000)])
    config = write_config(tmp_path)
    first = accountant.run_locked(config, slurm, now=now, plan=False)
    assert first.settled_now == 0 and first.provisional == 1  # ended 100 s ago < settle_delay
    slurm.rows[0] = row(1, "stune-bob", now - 1100, 1000, comment=summary(2000, 200, 2000))
    later = accountant.run_locked(config, slurm, now=now + 400, plan=False)
    assert later.settled_now == 1
    slurm_usage, stune_usage = Ledger.load(accountant.ledger_path(config)).usage[("biology", "stune-bob")]
    assert stune_usage / slurm_usage == pytest.approx(1.9)


def test_dry_run_writes_nothing(tmp_path):
    now = 1_800_000_000
    slurm = RowsSlurm(
        [
            row(1, "stune-bob", now - 9000, 3600, comment=summary(7200, 720, 7200)),
            row(2, "stune-alice", now - 9000, 3600),
        ],
        pending=[pending_job(7, "stune-bob")],
        assocs=EQUAL,
    )
    config = write_config(tmp_path)
    result = accountant.run_locked(config, slurm, now=now, dry_run=True)
    assert result.changes and not result.applied
    assert slurm.writes == []
    assert not os.path.exists(accountant.ledger_path(config))


def test_a_site_factor_min_the_line_cannot_fit_is_refused_in_one_line(tmp_path):
    """min -1000 on this tree: no line keeps every SiteFactor within [-1000, 0] (root's, alice's and bob's
    Slurm points already spread wider), and a clamp after the line would tie or swap users. Refused, naming
    the file, the line and the key, with the value that is always safe (1 - W)."""
    now = 1_800_000_000
    slurm = RowsSlurm(
        [
            row(1, "stune-bob", now - 9000, 3600, comment=summary(7200, 0, 7200)),
            row(2, "stune-alice", now - 9000, 3600, comment=summary(7200, 7200, 7200)),
        ],
        pending=[pending_job(7, "stune-bob")],
        assocs=EQUAL,
    )
    config = write_config(tmp_path, "site_factor:\n  min: -1000\n")
    with pytest.raises(
        ConfigError,
        match=r"fairshare.yaml:5: site_factor.min: -1000 is too high .* set it to "
        r"-9999 \(1 - PriorityWeightFairshare\) or lower",
    ):
        accountant.run_locked(config, slurm, now=now)
    assert slurm.writes == []


def _final_priorities(monkeypatch, tmp_path, slurm_factors, stune_factors, config_text):
    """Runs the accountant on these fair-share factors (W = 10000) with one pending job per user; returns
    {user: Slurm's fair-share points + the SiteFactor set}."""
    from slurm_tune.fairshare.tree import ShareResult

    results = iter(
        [
            ShareResult("fair_tree", [], {(USERS[u], u): f for u, f in slurm_factors.items()}),
            ShareResult("fair_tree", [], {(USERS[u], u): f for u, f in stune_factors.items()}),
        ]
    )
    monkeypatch.setattr(accountant.tree_mod, "compute", lambda *args: next(results))
    users = sorted(slurm_factors)
    slurm = RowsSlurm(pending=[pending_job(100 + i, u) for i, u in enumerate(users)])
    accountant.run_locked(write_config(tmp_path, config_text), slurm, now=1_800_000_000)
    return {u: 10000 * slurm_factors[u] + slurm.site.get(100 + i, 0) for i, u in enumerate(users)}


def test_site_factor_min_is_kept_by_choosing_the_line_within_it(monkeypatch, tmp_path):
    """carol gains, alice and bob lose, bob (idle) most. With min -6000 the full-width line would put bob at
    SiteFactor -8999, and clamping him to -6000 tied him with busy alice. The line is chosen within the range
    instead: bob stays strictly below alice, and nobody's SiteFactor needed the clamp."""
    slurm_f = {"carol": 0.8, "stune-alice": 0.9, "stune-bob": 0.9}
    stune_f = {"carol": 1.0, "stune-alice": 0.45, "stune-bob": 0.2}
    final = _final_priorities(
        monkeypatch, tmp_path, slurm_f, stune_f, "site_factor:\n  min: -6000\n  deadband: 0\n"
    )
    assert final["carol"] > final["stune-alice"] > final["stune-bob"] >= 1, final
    assert all(final[u] - 10000 * slurm_f[u] >= -6000 for u in final)
    # the same factors with the default floor: the full-width line, bob far below
    (tmp_path / "d").mkdir()
    default = _final_priorities(
        monkeypatch, tmp_path / "d", slurm_f, stune_f, "site_factor:\n  deadband: 0\n"
    )
    assert default["carol"] > default["stune-alice"] > default["stune-bob"] and default["stune-bob"] < 3000


def test_a_site_factor_plugin_is_refused(tmp_path):
    now = 1_800_000_000
    slurm = RowsSlurm(
        [
            row(1, "stune-bob", now - 9000, 3600, comment=summary(7200, 0, 7200)),
            row(2, "stune-alice", now - 9000, 3600),
        ],
        pending=[pending_job(7, "stune-bob")],
        assocs=EQUAL,
    )
    slurm.conf["PrioritySiteFactorPlugin"] = "site_factor/example"
    with pytest.raises(accountant.AccountantError, match="would overwrite stune's SiteFactor"):
        accountant.run_locked(write_config(tmp_path), slurm, now=now)


def test_two_accountants_never_run_at_once(tmp_path):
    from slurm_tune.fairshare.ledger import LedgerLock

    config = write_config(tmp_path)
    lock = LedgerLock(accountant.ledger_path(config))
    with lock, pytest.raises(LedgerError, match="another stune-fairshare is running"):
        accountant.run_locked(config, RowsSlurm(), now=1_800_000_000)


def test_a_corrupt_ledger_is_a_clear_error(tmp_path):
    config = write_config(tmp_path)
    os.makedirs(config.accountant.state_dir)
    with open(accountant.ledger_path(config), "w") as fh:
        fh.write("{not json")
    with pytest.raises(LedgerError, match="unreadable ledger"):
        accountant.run_locked(config, RowsSlurm(), now=1_800_000_000)


# ---- config and CLI --------------------------------------------------------------------------------------
def test_config_errors_name_file_line_and_key(tmp_path):
    path = tmp_path / "fs.yaml"
    path.write_text("accountant:\n  alpha: 1.5\n  coverage_mni: 0.5\n")
    with pytest.raises(
        ConfigError,
        match=r"fs.yaml:3: accountant.coverage_mni: unknown key \(did you mean "
        r"'coverage_min'\?\)",
    ):
        load_config(str(path))
    path.write_text("site_factor:\n  min: 5\n  max: 0\n")
    with pytest.raises(ConfigError, match=r"fs.yaml:2: site_factor.min: 5 is above site_factor.max"):
        load_config(str(path))
    path.write_text("usage:\n  interval: fast\n")
    with pytest.raises(ConfigError, match=r"fs.yaml:2: usage.interval: expected a number"):
        load_config(str(path))


def test_defaults_without_a_config_file(monkeypatch, tmp_path):
    monkeypatch.delenv("STUNE_FAIRSHARE_CONFIG", raising=False)
    monkeypatch.setattr("slurm_tune.usage.config.DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    config = load_config()
    assert config.accountant.alpha == 1.0 and config.site_factor.max == 0
    assert config.usage.spool_dir == "/var/spool/stune/usage"


def _cli(args, env_extra=None, tmp_path=None):
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "no-such-slurm.conf"))
    env.update(env_extra or {})
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "stune-fairshare"), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def test_cli_what_if_on_a_dump_without_a_cluster(tmp_path):
    t = 1_700_000_000
    dump = tmp_path / "dump.txt"
    dump.write_text(
        "\n".join(
            [
                HEADER,
                row(1, "stune-alice", t, 3600, comment=summary(7200, 6480, 7200)),
                row(2, "stune-bob", t, 3600, comment=summary(7200, 720, 7200)),
            ]
        )
        + "\n"
    )
    cfg = tmp_path / "fs.yaml"
    cfg.write_text(f"accountant:\n  state_dir: {tmp_path / 'state'}\n")
    proc = _cli(
        ["report", "--sacct-file", str(dump), "--config", str(cfg), "--format", "json"], tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    users = {(u["account"], u["user"]): u for u in doc["users"]}
    assert users[("physics", "stune-alice")]["efficiency"] == pytest.approx(0.9)
    assert users[("biology", "stune-bob")]["idle_gpu_h"] == pytest.approx(1.8)
    assert (
        users[("biology", "stune-bob")]["fairshare_stune"]
        < users[("biology", "stune-bob")]["fairshare_slurm"]
    )
    assert any("offline what-if: flat association tree" in w for w in doc["warnings"])
    assert not (tmp_path / "state").exists()  # a what-if keeps no ledger
    same = _cli(["report", "--sacct-file", str(dump), "--config", str(cfg), "--json"], tmp_path=tmp_path)
    assert same.returncode == 0 and same.stdout == proc.stdout  # --json is --format json
    proc = _cli(["apply", "--dry-run", "--sacct-file", str(dump), "--config", str(cfg)], tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "0 SiteFactor change(s) planned" in proc.stdout
    proc = _cli(
        ["apply", "--dry-run", "--json", "--sacct-file", str(dump), "--config", str(cfg)], tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["dry_run"] is True and doc["changes"] == [] and doc["ledger"] is None
    assert any("offline what-if" in w for w in doc["warnings"]) and doc["as_of"] >= t


def test_cli_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("JobIDRaw|User\n1|x\n")
    proc = _cli(["report", "--sacct-file", str(bad)], tmp_path=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("stune-fairshare: ") and "bad.txt:1: header lacks" in proc.stderr
    assert "Traceback" not in proc.stderr
    cfg = tmp_path / "fs.yaml"
    cfg.write_text("report:\n  top_jobs: many\n")
    proc = _cli(["report", "--config", str(cfg)], tmp_path=tmp_path)
    assert proc.returncode == 1 and "fs.yaml:2: report.top_jobs: expected an integer" in proc.stderr
    proc = _cli(
        ["apply"], tmp_path=tmp_path, env_extra={"STUNE_FAIRSHARE_CONFIG": str(tmp_path / "none.yaml")}
    )
    assert proc.returncode == 1 and "none.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_without_the_reports_extra_the_outputs_say_so(tmp_path):
    t = 1_700_000_000
    dump = tmp_path / "dump.txt"
    dump.write_text(
        "\n".join([HEADER, row(1, "stune-bob", t, 3600, comment=summary(7200, 720, 7200))]) + "\n"
    )
    cfg = tmp_path / "fs.yaml"
    cfg.write_text("")
    blocked = (
        "import sys\nfor m in ('matplotlib', 'matplotlib.pyplot', 'rich', 'rich.console', 'rich.table', "
        "'prometheus_client'):\n    sys.modules[m] = None\n"
        "from slurm_tune.cli.fairshare import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    base = [sys.executable, "-c", blocked, "report", "--sacct-file", str(dump), "--config", str(cfg)]
    for extra, what in (
        ([], "the terminal table"),
        (["--format", "none", "--png", str(tmp_path / "x.png")], "the PNG chart"),
        (["--format", "none", "--prom", str(tmp_path / "x.prom")], "the Prometheus textfile"),
    ):
        proc = subprocess.run(base + extra, capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip() == (
            f"stune-fairshare: {what} needs the `reports` extra "
            f"({proc.stderr.split('(')[1].split(')')[0]}): pip install 'slurm-tune[reports]'"
        )
    proc = subprocess.run([*base, "--format", "csv"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("level,account,user,")


def test_report_outputs_offline(tmp_path):
    t = 1_700_000_000
    dump = tmp_path / "dump.txt"
    busy_idle_power = (
        "stune1 held=7200.0 used=7128.0 cov=7200.0 busy=7000.0 busy_w=62.0 gpus=2 nodes=1/1 "
        "per_gpu=n1/0:99.0:1.0:500:62.0,n1/1:99.0:1.0:500:62.0"
    )
    dump.write_text(
        "\n".join(
            [
                HEADER,
                row(1, "stune-alice", t, 3600, comment=busy_idle_power),
                row(2, "stune-bob", t, 3600, comment=summary(7200, 720, 7200)),
                row(3, "carol", t, 600, gpus=0, billing=1),
            ]
        )
        + "\n"
    )
    cfg = tmp_path / "fs.yaml"
    cfg.write_text("")
    png, prom = tmp_path / "r.png", tmp_path / "r.prom"
    proc = _cli(
        [
            "report",
            "--sacct-file",
            str(dump),
            "--config",
            str(cfg),
            "--format",
            "json",
            "--png",
            str(png),
            "--prom",
            str(prom),
        ],
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [j["job_id"] for j in doc["flagged"]] == ["1"]
    assert "62 W mean power" in doc["flagged"][0]["flag"]
    assert [j["job_id"] for j in doc["top_idle"]] == ["2", "1"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "stune_jobs_flagged 1.0" in prom.read_text()
    assert 'stune_job_stalled{account="physics",job_id="1",user="stune-alice"} 1.0' in prom.read_text()
    # -o writes the table too (#12 §5), plain text, nothing on stdout
    table = tmp_path / "report.txt"
    proc = _cli(
        ["report", "--sacct-file", str(dump), "--config", str(cfg), "--format", "table", "-o", str(table)],
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout == ""
    text = table.read_text()
    assert "stune-bob" in text and "Flagged for review" in text and "\x1b[" not in text
    proc = _cli(
        ["report", "--sacct-file", str(dump), "--config", str(cfg), "--format", "csv"], tmp_path=tmp_path
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("level,account,user,jobs,gpu_jobs,held_gpu_h,used_gpu_h,efficiency")
    assert any(line.startswith("user,biology,stune-bob,1,1,2,0.2,0.1,1.8,") for line in lines)


def test_a_report_reaching_back_charges_nothing_twice(tmp_path):
    now = 1_800_000_000
    rows = [
        row(1, "stune-alice", now - 20 * 86400, 3600),
        row(2, "stune-bob", now - 9000, 3600, comment=summary(7200, 720, 7200)),
    ]
    slurm = RowsSlurm(rows, assocs=EQUAL)
    config = write_config(tmp_path)
    accountant.run_locked(config, slurm, now=now, plan=False)
    later = now + 3 * 86400
    applied = accountant.run_locked(config, RowsSlurm(rows, assocs=EQUAL), now=later, plan=False)
    report = accountant.run_locked(
        config, RowsSlurm(rows, assocs=EQUAL), now=later + 1, plan=False, dry_run=True, since=now - 30 * 86400
    )
    assert report.table.n == 2  # the report sees both jobs...
    for key, value in applied.usage_slurm.items():  # ...but charges neither again
        assert report.usage_slurm[key] == pytest.approx(value, rel=1e-5)


# ---- the final order is stune's order ------------------------------------------------------------------
THREE_ACCOUNTS = [
    Association("root", "", "", 1, "", 1),
    Association("biology", "", "root", 1, "", 2),
    Association("biology", "stune-bob", "", 1, "", 3),
    Association("physics", "", "root", 2, "", 4),
    Association("physics", "stune-alice", "", 1, "", 5),
    Association("physics", "carol", "", 3, "", 6),
    Association("chemistry", "", "root", 1, "", 7),
    Association("chemistry", "dave", "", 1, "", 8),
    Association("root", "root", "", 1, "", 9),
]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["stune-alice", "stune-bob", "carol", "dave", "root"]),
            st.integers(60, 20000),
            st.integers(0, 100),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["", "PRIORITY_FLAGS_NONE_PLACEHOLDER"]),
)
def test_fairshare_points_plus_site_factor_order_jobs_as_stune_does(tmp_path_factory, jobs, flags):
    """Fair Tree and classic, three accounts: W x F_slurm + SiteFactor sorts pending jobs exactly as F_stune
    does, every SiteFactor is <= 0 and the top gainer's is 0."""
    tmp_path = tmp_path_factory.mktemp("order")
    now = 1_800_000_000
    USERS.setdefault("dave", "chemistry")
    rows = [
        row(i, user, now - 30000, secs, comment=summary(2 * secs, 2 * secs * eta / 100, 2 * secs))
        for i, (user, secs, eta) in enumerate(jobs, start=1)
    ]
    users = ["stune-alice", "stune-bob", "carol", "dave", "root"]
    slurm = RowsSlurm(
        rows,
        pending=[pending_job(1000 + i, u) for i, u in enumerate(users)],
        assocs=THREE_ACCOUNTS,
        flags="" if not flags else "NO_FAIR_TREE",
    )
    config = write_config(tmp_path, "site_factor:\n  deadband: 0\n")
    result = accountant.run_locked(config, slurm, now=now)
    weight = 10000
    final, stune = {}, {}
    for i, user in enumerate(users):
        key = (USERS[user], user)
        site = slurm.site.get(1000 + i, 0)
        assert site <= 0
        final[user] = weight * result.shares_slurm.factor(*key) + site
        stune[user] = result.shares_stune.factor(*key)
    scale, _offset = result.site_line
    assert 0 < scale <= weight
    for a in users:
        for b in users:
            if stune[a] > stune[b] + 2 / scale:
                assert final[a] > final[b], (a, b, final, stune)
        assert final[a] >= 0.5  # nobody is pushed to Slurm's floor of 1, where submit order decides
    if scale == weight:  # a pure shift: the top gainer keeps Slurm's priority
        gaps = {u: weight * (stune[u] - result.shares_slurm.factor(USERS[u], u)) for u in users}
        top = max(gaps, key=gaps.get)
        assert slurm.site.get(1000 + users.index(top), 0) == 0
    assert max(slurm.site.get(1000 + i, 0) for i in range(len(users))) == 0


def test_explain_says_why_in_priority_points_and_names_the_costly_jobs(tmp_path):
    from slurm_tune.fairshare import explain

    now = 1_800_000_000
    rows = [
        row(1, "stune-alice", now - 9000, 3600, comment=summary(7200, 6480, 7200)),
        row(2, "stune-bob", now - 9000, 3000, comment=summary(6000, 0, 6000)),
        row(3, "stune-bob", now - 5000, 300, comment=summary(600, 300, 600)),
    ]
    slurm = RowsSlurm(rows, pending=[pending_job(9, "stune-bob")], assocs=EQUAL)
    config = write_config(tmp_path)
    result = accountant.run(config, slurm, now=now, use_ledger=False)
    assert result.ledger_path is None and not os.path.exists(accountant.ledger_path(config))
    doc = explain.explain(result, config, "stune-bob", slurm.sprio())
    (bio,) = doc["associations"]
    assert bio["account"] == "biology" and bio["fairshare_stune"] < bio["fairshare_slurm"]
    assert bio["site_factor"] < 0 and bio["rank_stune"] > bio["rank_slurm"]
    assert [j["job_id"] for j in bio["top_idle_jobs"]] == ["2", "3"]
    assert bio["top_idle_jobs"][0]["charged_x"] == pytest.approx(2.0)
    assert doc["pending"][0]["job_id"] == 9
    text = explain.explain_text(doc)
    assert (
        f"get {-bio['site_factor']} priority points fewer than Slurm alone gives them (SiteFactor "
        f"{bio['site_factor']})" in text
    )
    assert "job 2: 2 GPUs" in text and "charged x2.00" in text
    with pytest.raises(Exception, match="no fair-share association"):
        explain.explain(result, config, "nobody")


def test_job_view_text_json_and_png(tmp_path):
    """`job` on a finished job: per-GPU means, the timeline as a sparkline and a PNG, the charge and why."""
    from slurm_tune.fairshare import explain, jobdoc, jobview
    from slurm_tune.usage import summary as summary_mod

    s = summary_mod.JobSummary(
        7200.0,
        3600.0,
        7200.0,
        0.0,
        None,
        2,
        1,
        1,
        (
            summary_mod.GpuMeans("n1", "0", 50.0, 10.0, 1000.0, 200.0),
            summary_mod.GpuMeans("n1", "1", None, None, None, None),
        ),
        drops=0,
        noproc=0.0,
        timeline="9" * 24 + "0" * 24,
    )
    text_row = row(7, "stune-bob", 1_700_000_000, 3600, comment=summary_mod.encode(s))

    class OneJob:
        def sacct(self, fields, job_ids=None, **_):
            cols = text_row.split("|", len(fields) - 1)
            return [dict(zip(fields, cols))]

    config = write_config(tmp_path)
    doc = jobview.job_view(OneJob(), config, "7")
    assert doc["eta"] == pytest.approx(0.5) and doc["charged_x"] == pytest.approx(1.5)
    assert doc["timeline"][0] == pytest.approx(100.0) and doc["timeline"][-1] == 0
    text = jobdoc.job_text(doc)
    assert "n1 GPU 1: utilization unmeasured" in text and "n1 GPU 0: utilization 50%, 200 W" in text
    assert "timeline |" + "█" * 24 in text and "x (1 + 1 x 0.50) = x1.50" in text
    png = tmp_path / "job.png"
    jobdoc.timeline_png(doc, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    if os.getuid() == 0:  # root sees every job; a user only their own (tested as a user on the cluster)
        assert explain.may_see("stune-bob")
