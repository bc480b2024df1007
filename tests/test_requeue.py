"""Requeue that avoids the culprit (health/requeue.py): which job, once, opt-in, not requeueable, the user's
--no-requeue, the admin's drain untouched, the state it keeps, and the adapter's forms per release.

Slurm here is the real adapter on stand-in commands that answer with what Slurm 22.05.8 and 26.05.5 printed
for the same jobs on the dev cluster (tests/fixtures/requeue/<release>/README) and record every write."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import healthkit as kit
import pytest

from slurm_tune.health import apply, requeue, state
from slurm_tune.nodestate import DEGRADED_FEATURE
from slurm_tune.profilestore import load_profiles
from slurm_tune.slurm import Node, Slurm

FIX = Path(__file__).resolve().parent / "fixtures" / "requeue"
POLICY = "6c1f0e2a"
REASON = "mlx5_2/1 state DOWN"
# the 22.05.8 jobs 2-5 ended at 1796238540, the 26.05.5 jobs 6 and 7 at 1796238292, job 4's run at 1796237489
HEALTHY_AT = 1796237000.0
NOW = 1796238600.0


def stand_in(tmp_path: Path, release: str, version: str, refuse: str = "") -> tuple[Slurm, Path]:
    """Slurm on stand-in sinfo/squeue/scontrol/sacct answering from FIX/release; writes (requeue, update,
    release) are appended to writes.log and answered as `refuse` says (Slurm's message, exit 1) when set."""
    bin_dir, fix, log = tmp_path / "bin", FIX / release, tmp_path / "writes.log"
    bin_dir.mkdir()
    log.write_text("")
    squeue = next(fix.glob("squeue_json_*.json"))
    sacct = fix / "sacct_D_held.txt"
    scripts = {
        "sinfo": f'echo "{version}"',
        "squeue": f'echo "$*" >> {log}.reads; cat {shlex.quote(str(squeue))}',
        "sacct": f'echo "sacct $*" >> {log}.reads; cat {shlex.quote(str(sacct))} 2>/dev/null; true',
        "scontrol": (
            'if [ "$1 $2" = "show job" ]; then grep "^JobId=$4 " '
            f"{shlex.quote(str(fix / 'scontrol_show_job_o.txt'))}; exit 0; fi\n"
            f'printf "%s\\n" "$*" >> {log}\n' + (f'echo "{refuse}" >&2; exit 1\n' if refuse else "")
        ),
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return Slurm(bin_dir=str(bin_dir)), log


def writes(log: Path) -> list[str]:
    return log.read_text().splitlines()


def reads(log: Path) -> list[str]:
    path = Path(f"{log}.reads")
    return path.read_text().splitlines() if path.exists() else []


def node_state(healthy_at=HEALTHY_AT, trusted=True) -> dict:
    st = state.empty("n1")
    st["last"] = {"mode": "run", "at": NOW, "status": "fail", "reason": REASON, "policy": POLICY}
    st["trusted"] = [POLICY] if trusted else []
    if healthy_at is not None:
        st["healthy"] = {"at": healthy_at}
    return st


@pytest.fixture
def opted(tmp_path):
    """The shipped profiles, hdr opted in."""
    directory = kit.profile_dir(
        tmp_path / "profiles",
        {"hdr.yaml": [("placement:\n", "recovery:\n  avoid_culprit: true\nplacement:\n")]},
    )
    return load_profiles(directory)


def test_a_failed_multi_node_job_is_requeued_once_without_the_node_on_22_05(tmp_path, opted):
    slurm, log = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    st = node_state()
    notes = requeue.avoid_culprit(slurm, "n1", REASON, st, NOW, opted)
    assert writes(log) == [
        "requeue 2",
        "update JobId=2 ExcNodeList=n1 Comment=lr sweep 3; stune: requeued once without n1: " + REASON,
    ]
    assert notes == [
        "requeued job 2 without n1 (it failed on n1,n2)",
        "job 3 not requeued: Requeue=0 (the user's --no-requeue, or JobRequeue=0 without --requeue)",
        "job 4 not requeued: a single-node job",
    ]  # job 1 ran on n[2-3], job 5 completed: nothing to say about them
    assert st["requeued"] == [{"job": 2, "at": NOW, "node": "n1", "form": "requeue"}]
    assert reads(log) == ["--json -t FAILED,NODE_FAIL"]  # 22.05: no expedited requeue to look for
    # never twice: the same node again
    again = requeue.avoid_culprit(slurm, "n1", REASON, st, NOW + 60, opted)
    assert len(writes(log)) == 2 and "job 2 not requeued: stune requeued it once already" in again


def test_a_job_another_node_requeued_is_not_requeued_again(tmp_path, opted):
    slurm, log = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    # job 1 carries the mark in its Comment (n1's run requeued it); it then failed again on n[2-3]
    notes = requeue.avoid_culprit(slurm, "n3", REASON, node_state(), NOW, opted)
    assert writes(log) == [] and notes == ["job 1 not requeued: stune requeued it once already"]


def test_nothing_happens_without_the_opt_in(tmp_path):
    slurm, log = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    shipped = load_profiles(kit.profile_dir(tmp_path / "profiles"))
    assert requeue.avoid_culprit(slurm, "n1", REASON, node_state(), NOW, shipped) == []
    assert writes(log) == [] and reads(log) == [] and slurm.calls == []  # not even a read


def test_the_opt_in_is_the_jobs_partition(tmp_path):
    slurm, log = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    roce = load_profiles(
        kit.profile_dir(
            tmp_path / "profiles",
            {"roce.yaml": [("partition: roce\n", "partition: roce\nrecovery:\n  avoid_culprit: true\n")]},
        )
    )
    assert requeue.avoid_culprit(slurm, "n1", REASON, node_state(), NOW, roce) == []
    assert writes(log) == []  # the jobs ran in hdr, which did not opt in


@pytest.mark.parametrize(
    "healthy_at, trusted, note",
    [
        (NOW - 30, True, None),  # healthy after the jobs failed: they failed for another reason
        (None, True, "requeue: n1 was never seen healthy under this policy: no job requeued"),
        (HEALTHY_AT, False, "requeue: n1 was never seen healthy under this policy: no job requeued"),
    ],
)
def test_only_jobs_that_failed_since_the_node_was_last_healthy(tmp_path, opted, healthy_at, trusted, note):
    slurm, log = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    notes = requeue.avoid_culprit(slurm, "n1", REASON, node_state(healthy_at, trusted), NOW, opted)
    assert writes(log) == [] and notes == ([note] if note else [])


def test_a_refused_requeue_is_a_note_and_not_recorded(tmp_path, opted):
    slurm, log = stand_in(
        tmp_path, "22.05.8", "slurm-wlm 22.05.8", refuse="Requested operation is presently disabled for job 2"
    )
    st = node_state()
    notes = requeue.avoid_culprit(slurm, "n1", REASON, st, NOW, opted)
    assert writes(log) == ["requeue 2"]  # no exclusion for a job that did not go back to pending
    assert notes[0] == (
        "job 2 not requeued: scontrol failed (exit 1): Requested operation is presently disabled for job 2"
    )
    assert "requeued" not in st


def test_an_internal_error_is_a_note_never_an_exception(tmp_path, opted, monkeypatch):
    slurm, _ = stand_in(tmp_path, "22.05.8", "slurm-wlm 22.05.8")
    monkeypatch.setattr(requeue, "failed_runs", lambda *a: [None])
    notes = requeue.avoid_culprit(slurm, "n1", REASON, node_state(), NOW, opted)
    assert len(notes) == 1 and notes[0].startswith(
        "requeue: internal error, nothing requeued: AttributeError"
    )


def test_on_26_05_a_held_expedited_job_is_released_without_the_node(tmp_path, opted):
    slurm, log = stand_in(tmp_path, "26.05.5", "slurm-wlm 26.05.5")
    st = node_state()
    notes = requeue.avoid_culprit(slurm, "n2", REASON, st, NOW, opted)
    mark = "stune: requeued once without n2: " + REASON
    assert writes(log) == [
        "requeue 6",
        f"update JobId=6 ExcNodeList=n2 Comment=lr sweep 3; {mark}",
        f"update JobId=4 ExcNodeList=n2 Comment={mark}",  # excluded while held, then released
        "release 4",
    ]
    assert notes == [
        "requeued job 6 without n2 (it failed on n1,n2)",
        "job 7 not requeued: Requeue=0 (the user's --no-requeue, or JobRequeue=0 without --requeue)",
        "released job 4 without n2 (Slurm held it after its expedited requeue)",
    ]
    assert [e["form"] for e in st["requeued"]] == ["release", "requeue"]
    assert reads(log) == [
        "--json -t FAILED,NODE_FAIL,REQUEUE_HOLD",
        "sacct -P --noconvert -n --allusers --format=JobIDRaw,State,NodeList,End,ExitCode -X --jobs=4 -D",
    ]


def test_a_held_job_whose_last_run_was_elsewhere_is_left_held(tmp_path, opted):
    slurm, log = stand_in(tmp_path, "26.05.5", "slurm-wlm 26.05.5")
    requeue.avoid_culprit(slurm, "n1", REASON, node_state(), NOW, opted)  # job 4 last ran on n[2-3]
    assert [w for w in writes(log) if w.endswith(" 4") or "JobId=4" in w] == []


@pytest.mark.parametrize(
    "version, expedite",
    [
        ("slurm-wlm 22.05.8", False),
        ("slurm 24.11.5", False),
        ("slurm 25.11.2", False),  # 25.11.0-25.11.2 requeue an expedited job after exit 0 too
        ("slurm 25.11.3", True),
        ("slurm-wlm 26.05.5", True),
    ],
)
def test_the_adapter_chooses_the_requeue_forms_by_release(tmp_path, version, expedite):
    slurm, log = stand_in(tmp_path, "22.05.8", version)
    assert slurm.expedited_requeue() is expedite
    assert slurm.requeue_option(True) == ("--requeue=expedite" if expedite else "--requeue")
    assert slurm.requeue_option(False) == "--requeue"
    slurm.requeue(12)
    slurm.update_job(12, exclude_nodes="n[1,3]", comment="stune: requeued once without n1: x")
    slurm.update_job(12)  # nothing to change: no call
    slurm.release(12)
    assert writes(log) == [
        "requeue 12",
        "update JobId=12 ExcNodeList=n[1,3] Comment=stune: requeued once without n1: x",
        "release 12",
    ]


def test_the_exclusion_and_the_comment_keep_what_the_job_had():
    assert requeue.exclusion("(null)", "n1") == "n1"
    assert requeue.exclusion("n[3-4]", "n1") == "n[1,3-4]"
    assert requeue.exclusion("n1", "n1") == "n1"
    assert requeue.marked_comment("", "n1", "x") == "stune: requeued once without n1: x"
    assert requeue.marked_comment("lr sweep", "n1", "x") == "lr sweep; stune: requeued once without n1: x"
    assert len(requeue.marked_comment("", "n1", "y" * 500)) == requeue.MARK_MAX


def test_slurms_record_decides_what_may_be_requeued():
    run = requeue.Run(9, "hdr", ["n1", "n2"], NOW, "", requeue.REQUEUE)
    ok = {"BatchFlag": "1", "Requeue": "1", "JobState": "FAILED"}
    assert requeue.judge_record(run, ok) == ""
    assert requeue.judge_record(run, {**ok, "JobState": "NODE_FAIL"}) == ""
    assert "not a batch job" in requeue.judge_record(run, {**ok, "BatchFlag": "0"})  # salloc, srun
    assert "Requeue=0" in requeue.judge_record(run, {**ok, "Requeue": "0"})  # --no-requeue
    assert "it is PENDING now" in requeue.judge_record(run, {**ok, "JobState": "PENDING"})  # someone requeued
    assert "no longer knows it" in requeue.judge_record(run, {})  # past MinJobAge
    held = run._replace(form=requeue.RELEASE)
    hold = {**ok, "JobState": "REQUEUE_HOLD", "ExpeditedRequeue": "Yes"}
    assert requeue.judge_record(held, hold) == ""
    assert "not released" in requeue.judge_record(held, {**hold, "ExpeditedRequeue": ""})  # a plain hold


# ---- the hook: apply.sync calls it under stune's drain or mark only --------------------------------------


def slurm_node(**kw) -> Node:
    base = {
        "name": "n1",
        "state": "idle",
        "flags": (),
        "reason": "",
        "reason_user": "root",
        "reason_time": 0,
        "features": "",
        "active_features": "",
        "comment": "",
        "partitions": ("hdr",),
        "gres": "gpu:4",
        "gres_used": "",
        "tres": "",
    }
    base.update(kw)
    return Node(**base)


class Cluster:
    """apply.sync's view of Slurm: the partition's nodes; updates change n1."""

    def __init__(self, n1: Node):
        self.n1, self.updates = n1, []

    def nodes(self):
        return [self.n1, slurm_node(name="n2"), slurm_node(name="n3")]

    def update_node(self, name, **fields):
        self.updates.append(fields)
        if fields.get("state") == "DRAIN":
            self.n1 = self.n1._replace(flags=("DRAIN",), reason=fields["reason"], reason_time=int(NOW))


@pytest.fixture
def hook_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(requeue, "avoid_culprit", lambda *a: calls.append(a[1:3]) or ["requeued job 2"])
    return calls


def run_sync(n1: Node, want, monkeypatch, hook_state=None):
    profile = kit.profile("hdr")
    st = node_state()
    if hook_state:
        st["hook_fail"] = hook_state
    cluster = Cluster(n1)
    outcome = apply.sync(cluster, "n1", want, st, profile, NOW, sleep=lambda s: None)
    return outcome, cluster


def test_the_hook_runs_when_stune_drains_or_takes_over_a_hook_drain(monkeypatch, hook_calls):
    drain = apply.Want(apply.DRAIN, REASON)
    outcome, _ = run_sync(slurm_node(), drain, monkeypatch)
    assert outcome.notes == ["requeued job 2"] and hook_calls == [("n1", REASON)]
    epilog = slurm_node(flags=("DRAIN",), reason="Epilog error", reason_time=int(NOW))
    run_sync(epilog, drain, monkeypatch, {"mode": "epilog", "at": NOW - 5})
    assert len(hook_calls) == 2
    run_sync(slurm_node(), apply.Want(apply.DEGRADE, "mlx5_3/1 rate 100 Gb/s < 200"), monkeypatch)
    assert len(hook_calls) == 3


def test_the_admins_drain_is_left_alone_and_its_jobs_too(monkeypatch, hook_calls):
    admin = slurm_node(flags=("DRAIN",), reason="bad DIMM, ticket 4711", reason_time=int(NOW))
    for want in (apply.Want(apply.DRAIN, REASON), apply.Want(apply.DEGRADE, "slow")):
        _outcome, cluster = run_sync(admin, want, monkeypatch)
        assert cluster.n1.reason == "bad DIMM, ticket 4711"
        assert all("state" not in u and "reason" not in u for u in cluster.updates)
    assert hook_calls == []  # stune did not drain it: nothing is requeued on its account


def test_no_requeue_when_the_breaker_holds_the_drain_back_or_the_node_is_healthy(monkeypatch, hook_calls):
    busy = [
        slurm_node(name=f"m{i}", flags=("DRAIN",), reason="stune: x", reason_time=int(NOW)) for i in range(3)
    ]

    class Tripped(Cluster):
        def nodes(self):
            return [self.n1, *busy]

    st = node_state()
    outcome = apply.sync(
        Tripped(slurm_node()), "n1", apply.Want(apply.DRAIN, REASON), st, kit.profile("hdr"), NOW
    )
    assert not outcome.breaker.allowed and hook_calls == []
    run_sync(slurm_node(features=DEGRADED_FEATURE), apply.Want(apply.CLEAR, ""), monkeypatch)
    assert hook_calls == []


# ---- the node's state ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("healthy", {"at": float("nan")}, "healthy.at"),
        ("requeued", [{"job": 2, "at": 1e300, "node": "n1", "form": "requeue"}], "requeued[0]"),
        ("requeued", [{"job": -1, "at": NOW}], "requeued[0]"),
        ("requeued", [{"job": True, "at": NOW}], "requeued[0]"),
        ("requeued", ["2"], "requeued[0]: not a record"),
    ],
)
def test_a_requeue_record_stune_never_writes_starts_the_state_over(tmp_path, key, value, why):
    directory = tmp_path / "state"
    directory.mkdir()
    data = state.empty("n1")
    data[key] = value
    (directory / state.STATE_FILE).write_text(json.dumps(data))
    read, problem = state.read(str(directory))
    assert key not in read and problem and why in problem


def test_the_state_keeps_the_requeued_jobs_and_the_last_healthy_verdict(tmp_path):
    directory = tmp_path / "state"
    with state.Locked(str(directory)) as st:
        st.state.update(
            healthy={"at": NOW}, requeued=[{"job": 2, "at": NOW, "node": "n1", "form": "requeue"}]
        )
        st.save()
    read, problem = state.read(str(directory))
    assert problem is None and requeue.done_ids(read) == {2} and requeue.window_start(read) is None
    read["last"], read["trusted"] = {"policy": POLICY}, [POLICY]
    assert requeue.window_start(read) == NOW


# ---- stune-sbatch: --requeue=expedite where it fits ---------------------------------------------------


def expedite_plan(tmp_path, argv, word="--requeue=expedite"):
    from slurm_tune.sbatch.options import Effective, parse_args
    from slurm_tune.sbatch.plan import build_plan

    directory = kit.profile_dir(
        tmp_path / "expedite",
        {"hdr.yaml": [("placement:\n", "recovery:\n  avoid_culprit: true\n  expedite: true\nplacement:\n")]},
    )
    asked = []

    def requeue_option(expedite):
        asked.append(expedite)
        if isinstance(word, Exception):
            raise word
        return word

    parsed = parse_args(["-p", "hdr", *argv, "--wrap", "true"])
    plan = build_plan(
        partition="hdr",
        partition_source="test",
        profile=kit.profile("hdr", directory),
        eff=Effective(parsed.options, [], {}),
        environ={},
        cwd="/home/u",
        stage_args=[],
        stage_required=False,
        degraded_nodes=list,
        het=False,
        requeue_option=requeue_option,
    )
    return plan, asked


def requeue_setting(plan):
    (found,) = [s for s in plan.settings if s.name == "--requeue"]
    return found


def test_stune_sbatch_asks_for_an_expedited_requeue_for_a_multi_node_job(tmp_path):
    plan, asked = expedite_plan(tmp_path, ["-N2"])
    assert "--requeue=expedite" in plan.options and asked == [True]
    assert "recovery.expedite @ " in requeue_setting(plan).source


def test_stune_sbatch_keeps_the_plain_requeue_where_expedite_does_not_fit(tmp_path):
    from slurm_tune.errors import SlurmError

    plan, asked = expedite_plan(tmp_path, ["-N1"])  # one node: nothing to hold for it
    assert "--requeue" in plan.options and asked == []
    plan, asked = expedite_plan(tmp_path, ["-N2"], word="--requeue")  # a release before 25.11.3
    assert "--requeue" in plan.options and requeue_setting(plan).note.startswith(
        "plain --requeue: --requeue=exp"
    )
    plan, _ = expedite_plan(tmp_path, ["-N2"], word=SlurmError(["sinfo", "--version"], 1, "no config"))
    assert "--requeue" in plan.options and "cannot tell the Slurm release" in requeue_setting(plan).note
    plan, asked = expedite_plan(tmp_path, ["-N2", "--no-requeue"])  # the user's word wins
    assert not any(o.startswith("--requeue") for o in plan.options) and asked == []
    assert requeue_setting(plan).note == "kept your --no-requeue (command line)"


def test_expedite_needs_the_culprit_requeue(tmp_path):
    from slurm_tune.errors import ConfigError

    directory = kit.profile_dir(
        tmp_path / "bad", {"hdr.yaml": [("placement:\n", "recovery:\n  expedite: true\nplacement:\n")]}
    )
    with pytest.raises(
        ConfigError, match=r"recovery\.expedite.*needs recovery\.requeue and recovery\.avoid_culprit"
    ):
        load_profiles(directory)
