"""Acceptance of the cache tier on the local Slurm cluster, as a new user would try it: real jobs, submitted
by the unprivileged test user, staging into each node's own tier (cluster.layout.node_dir), the root epilog
hook, gc asking the real squeue, and the TaskProlog contract that stune-task-prolog builds on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import slurm_env, slurm_exports, slurm_path, wait_for_state, wait_until
from test_stage_tier import make_tree, open_up, tree_digest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = os.path.dirname(sys.executable)
USER = "stune-alice"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class Stage:
    """One test's world: a profile directory whose tiers live under each node's own directory (unique to
    the test), initialised as `stune-stage init` would, and a way to submit jobs as the test user."""

    def __init__(self, cluster, slurm, tmp: Path, quota: str = "2G"):
        self.cluster, self.slurm, self.tmp = cluster, slurm, tmp
        self.tag = uuid.uuid4().hex[:8]
        # root loads profiles (and their cache) only where root alone can write: not in the job-writable tmp
        self.profiles = cluster.layout.root / f"profiles-{self.tag}"
        self.profiles.mkdir()
        self.profile_cache = cluster.layout.root / f"profile-cache-{self.tag}"
        cache_path = str(cluster.layout.root / "nodes" / "%n" / f"cache-{self.tag}")
        for src in (REPO / "partitions").glob("*.yaml"):
            data = yaml.safe_load(src.read_text())
            if src.name != "site.yaml":
                data["cache"] = dict(data.get("cache") or {}, path=cache_path, quota=quota)
            (self.profiles / src.name).write_text(yaml.safe_dump(data))
        self.roots = {n: cluster.layout.node_dir(n) / f"cache-{self.tag}" for n in ("n1", "n2", "n3")}
        for node in self.roots:
            self.stune("init", "--node", node, "-p", "hdr")
        open_up(tmp)

    def cleanup(self):
        for root in [*self.roots.values(), self.profiles, self.profile_cache]:
            shutil.rmtree(root, ignore_errors=True)

    def env(self, **extra) -> dict[str, str]:
        return {
            "PATH": slurm_path(f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"),
            **slurm_env(),
            "STUNE_PARTITIONS": str(self.profiles),
            "LANG": "C.UTF-8",
            "STUNE_CACHE_DIR": str(self.profile_cache),
            **extra,
        }

    def stune(self, *args, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        argv = [f"{VENV_BIN}/stune-stage", *args]
        env = self.env()
        if user:
            argv = [RUNUSER, "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **env))
        if check and proc.returncode != 0:
            raise AssertionError(f"stune-stage {' '.join(args)} failed: {proc.stderr}")
        return proc

    def submit(self, script: str, *args: str, user: str = USER, **env) -> int:
        full = self.env(HOME=f"/home/{user}", USER=user, **env)
        argv = [
            RUNUSER,
            "-u",
            user,
            "--",
            "env",
            "-i",
            *[f"{k}={v}" for k, v in full.items()],
            "sbatch",
            "--parsable",
            "-o",
            f"{self.tmp}/job-%j.out",
            "-e",
            f"{self.tmp}/job-%j.err",
            "--chdir",
            str(self.tmp),
            *args,
        ]
        proc = subprocess.run(argv, input=script, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip().split(";")[0])

    def wait(self, job: int, timeout: float = 120) -> str:
        return wait_for_state(self.slurm, job, DONE, timeout=timeout)

    def out(self, job: int) -> str:
        return (self.tmp / f"job-{job}.out").read_text()

    def err(self, job: int) -> str:
        return (self.tmp / f"job-{job}.err").read_text()

    def namespace(self, node: str = "n1", user: str = USER) -> Path:
        return self.roots[node] / user


@pytest.fixture
def world(cluster, slurm, shared_tmp):
    w = Stage(cluster, slurm, shared_tmp)
    yield w
    w.cleanup()


def sums_script(fetch_args: str) -> str:
    """A job that stages, then checksums what it reads through $STUNE_STAGE_DS."""
    return f"""#!/bin/bash
set -euo pipefail
eval "$(stune-stage fetch {fetch_args})"
echo "path=$STUNE_STAGE_DS"
cd "$STUNE_STAGE_DS" && echo "sum=$(find . -type f | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum)"
"""


def source_sum(path: Path) -> str:
    out = subprocess.run(
        f"cd {path} && find . -type f | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip()


def field(text: str, key: str) -> str:
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "="))


# ---- acceptance -------------------------------------------------------------------------------------------


def test_two_jobs_in_a_row_first_copies_second_copies_nothing(world):
    ds = make_tree(world.tmp / "imagenet", dirs=6, files=50)
    open_up(ds)
    first = world.submit(sums_script(f"{ds}:DS"), "-w", "n1")
    assert world.wait(first) == "COMPLETED", world.err(first)
    second = world.submit(sums_script(f"{ds}:DS"), "-w", "n1")
    assert world.wait(second) == "COMPLETED", world.err(second)
    assert "DS: staged" in world.err(first)
    assert "DS: cache hit" in world.err(second) and "staged" not in world.err(second)
    assert "fast freshness check" in world.err(second)  # the hit line names the mode (#15 §6)
    assert "301 files" in world.err(first)  # 6 x 50 + labels.txt; the 7 directories are not counted
    path = field(world.out(first), "path")
    assert path == field(world.out(second), "path")
    assert path.startswith(str(world.namespace("n1")))
    assert field(world.out(first), "sum") == field(world.out(second), "sum") == source_sum(ds)
    entries = list((world.namespace("n1") / "entries").iterdir())
    assert len(entries) == 1
    st = world.namespace("n1").stat()
    assert oct(st.st_mode & 0o777) == "0o700"


def test_sixteen_concurrent_stagers_on_one_node_make_one_copy(world):
    ds = make_tree(world.tmp / "coco", dirs=10, files=200, size=4000)
    open_up(ds)
    script = f"""#!/bin/bash
srun -n16 --overcommit bash -c '
  exec 2>{world.tmp}/task-$SLURM_PROCID.err
  eval "$(stune-stage fetch {ds}:DS)" || exit 1
  cd "$STUNE_STAGE_DS" && find . -type f | LC_ALL=C sort | xargs -d "\\n" sha256sum | sha256sum \\
      > {world.tmp}/task-$SLURM_PROCID.sum'
"""
    job = world.submit(script, "-w", "n1", "-N1", "-n16", "--overcommit")
    assert world.wait(job, timeout=300) == "COMPLETED", world.err(job)
    sums = [(world.tmp / f"task-{i}.sum").read_text().strip() for i in range(16)]
    logs = [(world.tmp / f"task-{i}.err").read_text() for i in range(16)]
    assert sums == [source_sum(ds)] * 16, "0 corrupt files: every task read the source's exact bytes"
    assert sum("DS: staged" in log for log in logs) == 1, logs
    assert len(list((world.namespace("n1") / "entries").iterdir())) == 1


def test_kill_9_mid_copy_then_a_new_job_restages_cleanly(world):
    ds = make_tree(world.tmp / "big", dirs=20, files=500, size=3000)
    open_up(ds)
    pidfile = world.tmp / "stager.pid"
    script = f"""#!/bin/bash
stune-stage fetch {ds}:DS > /dev/null &
echo $! > {pidfile}
wait
"""
    job = world.submit(script, "-w", "n1", STUNE_STAGE_JOBS="1")
    tmp = world.namespace("n1") / "tmp"

    def copying():
        # tmp/<entry>.<pid>.staging exists only between the start of the copy and its publication.
        if not pidfile.exists() or not tmp.exists():
            return False
        return any(p.name.endswith(".staging") and (p / "data" / "class00").exists() for p in tmp.iterdir())

    wait_until("the stager to be half way", copying, timeout=180, interval=0.01)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert world.wait(job) in ("COMPLETED", "FAILED")
    assert not any((world.namespace("n1") / "entries").iterdir()), "nothing looks complete"
    again = world.submit(sums_script(f"{ds}:DS"), "-w", "n1")
    assert world.wait(again, timeout=300) == "COMPLETED", world.err(again)
    assert "DS: staged" in world.err(again)
    assert field(world.out(again), "sum") == source_sum(ds)
    assert list(tmp.iterdir()) == [], "the killed stager's partial copy is gone"
    ls = world.stune("ls", "--node", "n1", "-p", "hdr", "--json")
    assert '"kind": "dir"' in ls.stdout


@pytest.mark.parametrize("arg, words", [("../../etc:x", "climbs out"), ("/etc:a/b", "must not contain '/'")])
def test_an_unsafe_stage_argument_is_refused_clearly(world, arg, words):
    proc = world.stune("fetch", arg, "--node", "n1", "-p", "hdr", user=USER, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("stune-stage: --stage") and words in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_quota_smaller_than_the_dataset_runs_the_job_from_the_source_with_a_warning(
    cluster, slurm, shared_tmp
):
    world = Stage(cluster, slurm, shared_tmp, quota="64K")
    try:
        ds = make_tree(world.tmp / "imagenet", dirs=4, files=40, size=5000)
        open_up(ds)
        job = world.submit(sums_script(f"{ds}:DS"), "-w", "n2")
        assert world.wait(job) == "COMPLETED", world.err(job)
        assert field(world.out(job), "path") == str(ds)
        assert field(world.out(job), "sum") == source_sum(ds)
        err = world.err(job)
        assert "stune-stage: warning: DS: not staged" in err and "quota" in err
        assert f"STUNE_STAGE_DS points at the source {ds}" in err
    finally:
        world.cleanup()


# ---- holds: the epilog and gc ----------------------------------------------------------------------------


def test_the_epilog_releases_holds_and_gc_reclaims_those_of_dead_jobs(world):
    ds = make_tree(world.tmp / "ds", dirs=2, files=10)
    open_up(ds)
    holds = world.namespace("n1") / "holds"
    hook = f"""#!/bin/sh
export STUNE_BIN={VENV_BIN} STUNE_PARTITIONS={world.profiles} {slurm_exports()}
export STUNE_CACHE_DIR={world.tmp}/.root-profile-cache
exec {REPO}/epilog/30-stune-stage
"""
    world.cluster.install_hook("epilog", "30-stune-stage", hook)
    try:
        released = world.submit(sums_script(f"{ds}:DS"), "-w", "n1")
        assert world.wait(released) == "COMPLETED", world.err(released)
        wait_until("the epilog to release the hold", lambda: not (holds / str(released)).exists(), timeout=30)
    finally:
        world.cluster.install_hook("epilog", "30-stune-stage", None)
    # Without the epilog (a node crash, say) the hold outlives its job ...
    orphan = world.submit(sums_script(f"{ds}:DS"), "-w", "n1")
    assert world.wait(orphan) == "COMPLETED", world.err(orphan)
    assert (holds / str(orphan)).is_dir()
    # ... while a running job's hold must survive gc.
    running = world.submit(f'#!/bin/bash\neval "$(stune-stage fetch {ds}:DS)"\nsleep 300\n', "-w", "n1")
    try:
        _gc_keeps_the_running_jobs_hold(world, holds, orphan, running)
    finally:
        world.slurm.cancel(running)  # the fixture's scancel only reaches root's own jobs
        world.cluster.install_stune()  # the site's own 30-stune-stage back, as `up` installed it, for later tests


def _gc_keeps_the_running_jobs_hold(world, holds, orphan, running):
    wait_until("the running job's hold", lambda: (holds / str(running)).is_dir(), timeout=60)
    gc = world.stune("gc", "--node", "n1", "-p", "hdr")
    assert f"removed stale holds of job {orphan} ({USER})" in gc.stdout
    assert not (holds / str(orphan)).exists()
    assert (holds / str(running)).is_dir(), "gc never reclaims a running job's hold"
    ls = world.stune("ls", "--node", "n1", "-p", "hdr")
    assert str(running) in ls.stdout and USER in ls.stdout
    status = world.stune("status", "--node", "n1", "-p", "hdr")
    assert "1 held by running jobs" in status.stdout


# ---- the TaskProlog contract ------------------------------------------------------------------------------

TASK_PROLOG = """#!{python}
# What stune-task-prolog does with the stage library (a test stand-in for it).
import os, sys
from slurm_tune.stage.errors import StageRequiredError
from slurm_tune.nodeenv.taskenv import as_taskprolog
from slurm_tune.profiles import load_profile
from slurm_tune.stage.jobenv import JobLog, prepare_for_task
from slurm_tune.thisnode import job_context
log = JobLog(os.environ)
try:
    exports, messages = prepare_for_task(job_context(os.environ).with_profile(load_profile), progress=log)
except StageRequiredError as exc:
    log.write(f"stune-task-prolog: {{exc}}\\n")
    sys.exit(1)
sys.stdout.write(as_taskprolog(exports))
"""


@pytest.fixture
def task_prolog(world):
    script = world.tmp / "task-prolog"
    script.write_text(TASK_PROLOG.format(python=sys.executable))
    script.chmod(0o755)
    world.cluster.set_fragment("stage-test-taskprolog", f"TaskProlog={script}")
    yield script
    world.cluster.set_fragment("stage-test-taskprolog", None)


def test_a_taskprolog_exports_the_staged_path_and_required_failures_fail_the_job(world, task_prolog):
    from slurm_tune.stage.spec import StageRequest, encode_requests

    ds = make_tree(world.tmp / "tp", dirs=2, files=10)
    open_up(ds)
    value = encode_requests([StageRequest(str(ds), "TP")], required=False)
    ok = world.submit(
        '#!/bin/bash\necho "got=$STUNE_STAGE_TP"\nsrun -n2 bash -c \'echo "step=$STUNE_STAGE_TP"\'\n',
        "-w",
        "n3",
        "-n2",
        STUNE_STAGE=value,
    )
    assert world.wait(ok) == "COMPLETED", world.err(ok)
    got = field(world.out(ok), "got")
    assert got.startswith(str(world.namespace("n3"))) and tree_digest(got) == tree_digest(ds)
    assert [line for line in world.out(ok).splitlines() if line.startswith("step=")] == [f"step={got}"] * 2
    assert "TP: staged" in world.err(ok), "messages reach the job's stderr file"

    for profile in world.profiles.glob("*.yaml"):  # shrink the quota: now it cannot fit
        text = profile.read_text().replace("quota: 2G", "quota: 4K")
        profile.write_text(text)
    shutil.rmtree(world.roots["n3"] / USER)  # and the first copy is gone
    required = encode_requests([StageRequest(str(ds), "TP")], required=True)
    bad = world.submit("#!/bin/bash\necho ran\n", "-w", "n3", STUNE_STAGE=required)
    assert world.wait(bad) == "FAILED"
    assert "ran" not in world.out(bad), "the task never starts"
    err = world.err(bad)
    assert "--stage-required: TP:" in err and "quota" in err
    assert "TaskProlog failed status=1" in err
    node = world.slurm.node("n3")
    assert not node.drain, "a failed TaskProlog fails the job, not the node"
