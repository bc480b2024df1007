"""The idle-GPU policy without a cluster: the sliding window, the rules (exemptions, unmeasured, once-only
warnings), dry runs, and the write into a job's stderr file as its owner. The real cluster run is in
test_fairshare_cluster.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_tune.errors import ConfigError
from slurm_tune.fairshare import idlepolicy
from slurm_tune.hw.nvml import GpuUtilization
from slurm_tune.profiles import load_profiles
from slurm_tune.slurm import Job
from slurm_tune.usage.sampler import Sampler


class Clock:
    def __init__(self, t=2_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


class Source:
    def __init__(self):
        self.sm = 0.0

    def utilization(self):
        return [
            GpuUtilization(i, f"GPU-{i}", None, self.sm, 1.0, 1 << 30, 80 << 30, 60.0, 1) for i in range(4)
        ]


class FakeSlurm:
    """`scontrol show job -o` records for the jobs given; records the writes."""

    def __init__(self, jobs, records):
        self.records = {}
        for j in jobs:
            rec = {
                "JobState": j.state,
                "Partition": j.partition,
                "Account": j.account,
                "NodeList": j.nodes,
                "UserId": f"{j.user}(1002)",
            }
            rec.update(records.get(str(j.job_id), {}))
            self.records[str(j.job_id)] = rec
        self.comments, self.cancelled = {}, []

    def jobs(self, *_, **__):
        raise AssertionError("the policy must not list the whole queue from every node")

    def job_record(self, job_id):
        return self.records.get(str(job_id), {})

    def set_job_comment(self, job_id, text):
        self.comments[str(job_id)] = text

    def cancel(self, job_id, signal=None):
        self.cancelled.append(int(job_id))


def job(job_id, user="stune-bob", account="biology", partition="gpu", node="n1"):
    return Job(
        job_id,
        "train",
        user,
        account,
        partition,
        "RUNNING",
        "None",
        node,
        1,
        1,
        "",
        "",
        0,
        0,
        0,
        "",
        "",
        False,
        0,
        node,
    )


def profiles_dir(tmp_path, text):
    d = tmp_path / "partitions"
    d.mkdir(parents=True, exist_ok=True)
    (d / "gpu.yaml").write_text("partition: gpu\nfabric:\n  type: tcp\n  socket_ifname: eth0\n" + text)
    return load_profiles(str(d))


POLICY = (
    "idle_policy:\n  enabled: true\n  threshold: 5\n  warn_after: 30m\n  cancel_after: 2h\n"
    "  exempt_qos: [debug]\n"
)


def sample(local: Path, plan, jobs=("10",)):
    """Run the sampler over `plan`: a list of (seconds, sm%) phases at 1 Hz, for each job on GPUs 0.."""
    clock = Clock()
    (local / "jobs").mkdir(parents=True, exist_ok=True)
    for n, j in enumerate(jobs):
        (local / "jobs" / j).write_text(f"{n}\n")
        os.utime(local / "jobs" / j, (clock.t, clock.t))
    source = Source()
    sampler = Sampler(source, str(local), interval=1.0, clock=clock)
    for seconds, sm in plan:
        source.sm = sm
        for _ in range(int(seconds)):
            clock.t += 1.0
            sampler.sample_once()
    sampler.close()
    return clock.t


def test_a_sliding_window_not_the_average(tmp_path):
    """Busy for 3 hours, then idle for 40 minutes: the average is high (JDS would let it be), the last 30 min
    are idle: warned. After 2 h idle: cancelled."""
    local = tmp_path / "usage"
    now = sample(local, [(3 * 3600, 95.0), (40 * 60, 0.0)])
    profiles = profiles_dir(tmp_path, POLICY)
    slurm = FakeSlurm([job(10)], {"10": {"BatchFlag": "1", "QOS": "normal"}})
    d = idlepolicy.evaluate(slurm, profiles, str(local), "n1", now=now)
    assert [(x.job_id, x.action) for x in d] == [("10", "warn")] and d[0].util < 5
    local2 = tmp_path / "usage2"
    now = sample(local2, [(3 * 3600, 95.0), (2 * 3600 + 600, 0.0)])
    d = idlepolicy.evaluate(slurm, profiles, str(local2), "n1", now=now)
    assert d[0].action == "cancel" and "over the last 2h" in d[0].why
    local3 = tmp_path / "usage3"
    now = sample(local3, [(3 * 3600, 95.0), (10 * 60, 0.0)])  # idle only 10 minutes
    assert idlepolicy.evaluate(slurm, profiles, str(local3), "n1", now=now)[0].action == "ok"


def test_exempt_and_unmeasured_jobs_are_left_alone(tmp_path):
    local = tmp_path / "usage"
    now = sample(local, [(3 * 3600, 0.0)], jobs=("10", "11", "12"))
    profiles = profiles_dir(tmp_path, POLICY)
    slurm = FakeSlurm(
        [job(10), job(11), job(12, account="ops")],
        {
            "10": {"BatchFlag": "0", "QOS": "normal"},
            "11": {"BatchFlag": "1", "QOS": "debug"},
            "12": {"BatchFlag": "1", "QOS": "normal"},
        },
    )
    d = {x.job_id: x for x in idlepolicy.evaluate(slurm, profiles, str(local), "n1", now=now)}
    assert d["10"].action == "skip" and "interactive" in d["10"].why
    assert d["11"].action == "skip" and "QOS debug" in d["11"].why
    assert d["12"].action == "cancel"
    # unmeasurable: NVML gave no utilization (MIG): nothing sampled, never judged idle
    mig = tmp_path / "mig"
    now = sample(mig, [(3 * 3600, None)])
    d = idlepolicy.evaluate(
        FakeSlurm([job(10)], {"10": {"BatchFlag": "1"}}), profiles, str(mig), "n1", now=now
    )
    assert d[0].action == "skip" and "measured" in d[0].why


def test_off_by_default_and_bad_windows_are_refused(tmp_path):
    local = tmp_path / "usage"
    now = sample(local, [(3 * 3600, 0.0)])
    slurm = FakeSlurm([job(10)], {"10": {"BatchFlag": "1"}})
    assert idlepolicy.evaluate(slurm, profiles_dir(tmp_path, ""), str(local), "n1", now=now) == []
    bad = profiles_dir(
        tmp_path / "b", "idle_policy:\n  enabled: true\n  warn_after: 2h\n  cancel_after: 1h\n"
    )
    with pytest.raises(ConfigError, match="cancel_after"):
        idlepolicy.evaluate(slurm, bad, str(local), "n1", now=now)


def test_dry_run_changes_nothing_and_a_warning_is_given_once(tmp_path):
    local = tmp_path / "usage"
    now = sample(local, [(3600, 0.0)])
    profiles = profiles_dir(tmp_path, POLICY)
    err = tmp_path / "slurm-10.err"
    err.write_text("")
    record = {"BatchFlag": "1", "QOS": "normal", "StdErr": str(err), "UserId": f"stune-bob({os.getuid()})"}
    slurm = FakeSlurm([job(10)], {"10": record})
    lines = []
    d = idlepolicy.evaluate(slurm, profiles, str(local), "n1", now=now)
    idlepolicy.act(slurm, d, profiles, str(local), dry_run=True, log=lines.append)
    assert lines == [f"job 10 (stune-bob/biology, gpu): would warn: {d[0].why}"]
    assert slurm.comments == {} and err.read_text() == ""
    idlepolicy.act(slurm, d, profiles, str(local), dry_run=False, log=lines.append)
    assert "idle GPUs warned" in slurm.comments["10"] and "will be cancelled" in err.read_text()
    assert lines[-1].startswith("job 10 (stune-bob/biology, gpu): warned:")
    again = idlepolicy.evaluate(slurm, profiles, str(local), "n1", now=now)
    idlepolicy.act(slurm, again, profiles, str(local), dry_run=False, log=lines.append)
    assert err.read_text().count("stune:") == 1 and "already warned" in lines[-1]


def test_the_stderr_write_refuses_fifos_and_symlinks(tmp_path):
    """The path comes from the user's job: never follow a symlink, never block on a FIFO, never create."""
    lines = []
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    link = tmp_path / "link.err"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.err"
    os.mkfifo(fifo)
    me = f"me({os.getuid()})"
    assert not idlepolicy._write_as_owner(str(link), me, "x", lines.append)
    assert not idlepolicy._write_as_owner(str(fifo), me, "x", lines.append)
    assert not idlepolicy._write_as_owner(str(tmp_path / "missing.err"), me, "x", lines.append)
    assert target.read_text() == "root's file\n" and not (tmp_path / "missing.err").exists()
    assert any("link.err not written: cannot open" in line for line in lines)  # O_NOFOLLOW: ELOOP
    assert any("fifo.err not written" in line for line in lines)  # no reader: ENXIO, never a hang
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # with a reader it opens, and is refused by type
    try:
        assert not idlepolicy._write_as_owner(str(fifo), me, "x", lines.append)
        assert "not a regular file" in lines[-1]
    finally:
        os.close(reader)


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another user needs root")
def test_the_stderr_write_runs_as_the_jobs_owner(shared_tmp, unix_user):
    """A root-owned file the job's user cannot write (a hard link the user made to it) stays untouched."""
    bob = unix_user("stune-bob")
    tmp_path = shared_tmp  # a directory bob can reach
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.chmod(victim, 0o644)
    lines = []
    assert not idlepolicy._write_as_owner(str(victim), f"stune-bob({bob.pw_uid})", "x", lines.append)
    assert victim.read_text() == "keep\n" and "Permission denied" in lines[-1]
    own = tmp_path / "bob.err"
    own.write_text("")
    os.chown(own, bob.pw_uid, bob.pw_gid)
    assert idlepolicy._write_as_owner(str(own), f"stune-bob({bob.pw_uid})", "hello", lines.append)
    assert own.read_text() == "hello\n"
