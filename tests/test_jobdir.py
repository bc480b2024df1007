"""The per-job directory (usage/jobdir.py): made by the prolog for the job's user, pointed at by the
TaskProlog (STUNE_STEPS_FILE; NCCL's transport log for multi-node jobs), read by root in the epilog as a
hostile place, and removed."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest
from healthkit import profile_dir
from test_nodeenv import job
from test_stage_attacks import ALICE, BOB, as_user, ensure_users

from slurm_tune.comm import cap
from slurm_tune.nodeenv.taskenv import node_exports
from slurm_tune.profiles import load_profile
from slurm_tune.usage import jobdir, jobfiles

REPO = Path(__file__).resolve().parent.parent
PROLOG = REPO / "prolog" / "20-stune-jobgpus"


@pytest.fixture
def alice():
    if os.geteuid() != 0:
        pytest.skip("acting as a second user takes root")
    ensure_users()
    return pwd.getpwnam(ALICE)


def run_prolog(usage: Path, job_id: str, uid: int | None, gpus: str = "") -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "STUNE_ENV_FILE": "/dev/null",
        "STUNE_USAGE_DIR": str(usage),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_GPUS": gpus,
    }
    if uid is not None:
        env["SLURM_JOB_UID"] = str(uid)
    return subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=30)


def test_the_prolog_makes_the_jobs_directory_for_its_user(tmp_path, alice):
    usage = tmp_path / "usage"
    proc = run_prolog(usage, "41", alice.pw_uid)
    assert proc.returncode == 0 and proc.stderr == ""
    run, mine = usage / "run", usage / "run" / "41"
    assert stat.S_IMODE(run.stat().st_mode) == 0o755 and run.stat().st_uid == 0
    st = mine.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == alice.pw_uid and stat.S_IMODE(st.st_mode) == 0o700
    # a CPU job gets one too, and a record without GPU ids ("?": the sampler of an NPU node asks Slurm)
    assert (usage / "jobs" / "41").read_text() == "?\n"


def test_a_stale_jobs_directory_is_made_anew(tmp_path, alice):
    usage = tmp_path / "usage"
    (usage / "run" / "42" / "sub").mkdir(parents=True)
    (usage / "run").chmod(0o755)
    (usage / "run" / "42" / "old.log").write_text("from a crashed job")
    assert run_prolog(usage, "42", alice.pw_uid).returncode == 0
    assert os.listdir(usage / "run" / "42") == [] and (usage / "run" / "42").stat().st_uid == alice.pw_uid


def test_a_run_directory_someone_else_owns_gets_no_jobs_directory(tmp_path, alice):
    usage = tmp_path / "usage"
    (usage / "run").mkdir(parents=True)
    os.chown(usage / "run", alice.pw_uid, alice.pw_gid)
    assert run_prolog(usage, "43", alice.pw_uid).returncode == 0
    assert not (usage / "run" / "43").exists()
    # a symlink in place of the run directory: nothing is made through it
    (tmp_path / "elsewhere").mkdir()
    usage2 = tmp_path / "usage2"
    usage2.mkdir()
    (usage2 / "run").symlink_to(tmp_path / "elsewhere")
    assert run_prolog(usage2, "44", alice.pw_uid).returncode == 0
    assert os.listdir(tmp_path / "elsewhere") == []


def test_without_a_job_uid_or_with_a_strange_job_id_nothing_is_made(tmp_path):
    usage = tmp_path / "usage"
    assert run_prolog(usage, "45", None).returncode == 0
    assert not (usage / "run" / "45").exists()
    assert run_prolog(usage, "../x", 0).returncode == 0
    assert not (usage / "x").exists() and not (tmp_path / "x").exists()


# ---- the TaskProlog's side -------------------------------------------------------------------------------


def task(tmp_path: Path, **env: str):
    base = {
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "51",
        "SLURM_JOB_NUM_NODES": "2",
        "STUNE_USAGE_DIR": str(tmp_path / "usage"),
    }
    base.update(env)
    return job({k: v for k, v in base.items() if v is not None}, load_profile("hdr"))


def make_dir(tmp_path: Path, job_id: str = "51") -> Path:
    path = tmp_path / "usage" / "run" / job_id
    path.mkdir(parents=True)
    return path


def test_a_multi_node_job_logs_ncclss_transport_into_its_directory(tmp_path):
    path = make_dir(tmp_path)
    exports, messages = node_exports(task(tmp_path))
    assert exports["NCCL_DEBUG"] == "INFO" and exports["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert exports["NCCL_DEBUG_FILE"] == f"{path}/nccl.%h.%p.log"
    assert exports["STUNE_STEPS_FILE"] == f"{path}/steps.jsonl"
    assert not any("NCCL_DEBUG" in m for m in messages)


def test_a_one_node_job_gets_the_steps_file_only(tmp_path):
    make_dir(tmp_path)
    exports, _ = node_exports(task(tmp_path, SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="n1"))
    assert "STUNE_STEPS_FILE" in exports and not {"NCCL_DEBUG", "NCCL_DEBUG_FILE"} & set(exports)


def test_no_jobs_directory_no_files(tmp_path):
    exports, _ = node_exports(task(tmp_path))
    assert not {"NCCL_DEBUG", "NCCL_DEBUG_FILE", "STUNE_STEPS_FILE"} & set(exports)
    # a symlink where the directory should be is not the job's directory
    (tmp_path / "usage" / "run").mkdir(parents=True)
    (tmp_path / "usage" / "run" / "51").symlink_to(tmp_path)
    exports, _ = node_exports(task(tmp_path))
    assert "STUNE_STEPS_FILE" not in exports


def test_the_users_nccl_debug_wins_and_the_job_is_not_judged(tmp_path):
    make_dir(tmp_path)
    exports, messages = node_exports(task(tmp_path, NCCL_DEBUG="WARN"))
    assert not {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"} & set(exports)
    assert any("NCCL_DEBUG=WARN is yours" in m and "not judged" in m for m in messages)
    exports, messages = node_exports(task(tmp_path, NCCL_DEBUG_FILE="/home/me/nccl.log"))
    assert "NCCL_DEBUG" not in exports and any(
        "NCCL_DEBUG_FILE=/home/me/nccl.log is yours" in m for m in messages
    )
    # the user's subsystems are kept, stune's level and file still go in
    exports, _ = node_exports(task(tmp_path, NCCL_DEBUG_SUBSYS="ALL"))
    assert exports["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_SUBSYS" not in exports


def test_a_later_step_keeps_stunes_log_on_its_own_node_and_gives_way_to_the_user(tmp_path):
    from slurm_tune.nodeenv.taskenv import with_managed

    make_dir(tmp_path)
    first = task(tmp_path)
    exports, _ = node_exports(first)
    exports = with_managed(exports, first.environ, "51")
    inherited = {k: v for k, v in exports.items() if v is not None}
    n2 = tmp_path / "n2"
    (n2 / "run" / "51").mkdir(parents=True)
    later, _ = node_exports(task(tmp_path, SLURMD_NODENAME="n2", STUNE_USAGE_DIR=str(n2), **inherited))
    assert later["NCCL_DEBUG_FILE"] == f"{n2}/run/51/nccl.%h.%p.log"
    assert later["STUNE_STEPS_FILE"] == f"{n2}/run/51/steps.jsonl"
    # the batch script exported its own NCCL_DEBUG after the first step: stune's file and subsystems go
    yours, messages = node_exports(task(tmp_path, **dict(inherited, NCCL_DEBUG="TRACE")))
    assert yours["NCCL_DEBUG_FILE"] is None and yours["NCCL_DEBUG_SUBSYS"] is None
    assert "NCCL_DEBUG" not in yours and any("NCCL_DEBUG=TRACE is yours" in m for m in messages)


def test_a_profile_without_the_transport_log_sets_no_nccl_debug(tmp_path):
    make_dir(tmp_path)
    edit = ("nccl:\n  net_gdr_level: PHB\n", "nccl:\n  net_gdr_level: PHB\n  transport_log: false\n")
    profiles = profile_dir(tmp_path / "profiles", {"hdr.yaml": [edit]})
    off = load_profile("hdr", str(profiles))
    assert off.nccl.transport_log is False
    exports, _ = node_exports(job(task(tmp_path).environ, off))
    assert "NCCL_DEBUG" not in exports and "STUNE_STEPS_FILE" in exports


# ---- the epilog's side: root reads what the user left ------------------------------------------------------


def user_dir(tmp_path: Path, user: pwd.struct_passwd, job_id: str = "61") -> tuple[Path, Path]:
    usage = tmp_path / "usage"
    assert run_prolog(usage, job_id, user.pw_uid).returncode == 0
    return usage, usage / "run" / job_id


def test_root_reads_the_users_logs_and_steps(shared_tmp, alice):
    tmp_path = shared_tmp
    usage, path = user_dir(tmp_path, alice)

    def write(path: str) -> None:
        with open(f"{path}/nccl.n1.100.log", "w") as fh:
            fh.write("n1:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
        with open(f"{path}/steps.jsonl", "w") as fh:
            fh.write('{"step": 1, "samples": 64, "step_s": 0.5, "data_s": 0.1}\n')

    as_user(ALICE, write, str(path))
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert files.found and files.notes == []
    assert files.nccl == [("nccl.n1.100.log", b"n1:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")]
    assert files.steps is not None and files.steps.startswith(b'{"step": 1')
    jobfiles.remove_job_dir(str(usage), "61")
    assert not path.exists() and (usage / "run").is_dir()


def test_links_fifos_and_other_owners_are_refused_without_blocking(shared_tmp, alice):
    tmp_path = shared_tmp
    usage, path = user_dir(tmp_path, alice)
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)

    def plant(path: str, secret: str) -> None:
        os.symlink(secret, f"{path}/nccl.n1.1.log")
        os.mkfifo(f"{path}/nccl.n1.2.log")
        with open(f"{path}/mine", "w") as fh:
            fh.write("x")
        os.link(f"{path}/mine", f"{path}/nccl.n1.3.log")  # two links: refused
        os.symlink(secret, f"{path}/steps.jsonl")

    as_user(ALICE, plant, str(path), str(secret))
    (path / "nccl.n1.4.log").write_text("root made this one\n")  # not the job's user's
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert files.nccl == [] and files.steps is None and files.nccl_files == 4
    assert len(files.notes) == 5 and all("not read" in n for n in files.notes)
    assert not any(b"secret" in data for _, data in files.nccl)
    jobfiles.remove_job_dir(str(usage), "61")
    assert not path.exists() and secret.read_text() == "root's secret\n"


def test_a_job_directory_swapped_for_a_symlink_is_not_read(shared_tmp, alice):
    tmp_path = shared_tmp
    usage, path = user_dir(tmp_path, alice)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "nccl.n1.1.log").write_text("NCCL INFO\n")
    os.rmdir(path)
    path.symlink_to(elsewhere)
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert not files.found and files.nccl == [] and files.notes
    jobfiles.remove_job_dir(str(usage), "61")
    assert (elsewhere / "nccl.n1.1.log").exists()


def test_another_users_directory_is_not_read_as_this_jobs(shared_tmp, alice):
    tmp_path = shared_tmp
    ensure_users()
    bob = pwd.getpwnam(BOB)
    usage, path = user_dir(tmp_path, bob)
    (path / "nccl.n1.1.log").write_text("x\n")
    os.chown(path / "nccl.n1.1.log", bob.pw_uid, bob.pw_gid)
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert not files.found and files.nccl == [] and "owned by uid" in files.notes[0]


def test_reads_are_bounded_whatever_the_files_size(shared_tmp, alice):
    tmp_path = shared_tmp
    usage, path = user_dir(tmp_path, alice)
    big = path / "nccl.n1.1.log"
    with open(big, "wb") as fh:
        fh.write(b"HEAD\n")
        fh.truncate(1 << 30)  # a sparse GiB: the middle is never read
        fh.seek((1 << 30) - 6)
        fh.write(b"\nTAIL\n")
    os.chown(big, alice.pw_uid, alice.pw_gid)
    for i in range(jobdir.MAX_FILES + 10):
        (path / f"f{i}").touch()
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    ((_, data),) = files.nccl
    assert len(data) <= cap.NODE_CAP + len(cap.CUT_MARKER) + 2
    assert data.startswith(b"HEAD\n") and data.endswith(b"TAIL\n")
    assert cap.CUT_MARKER.encode() in data  # joined as comm's parser reads a cut
    assert any(f"more than {jobdir.MAX_FILES} names" in n for n in files.notes)


def test_the_nodes_cap_holds_over_many_logs(shared_tmp, alice):
    tmp_path = shared_tmp
    usage, path = user_dir(tmp_path, alice)
    for i in range(20):
        log = path / f"nccl.n1.{i:03d}.log"
        log.write_bytes(b"x" * (1 << 20))
        os.chown(log, alice.pw_uid, alice.pw_gid)
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert sum(len(d) for _, d in files.nccl) <= cap.NODE_CAP + 20 * (len(cap.CUT_MARKER) + 2)
    assert files.nccl_files == 20 and len(files.nccl) == 20


def test_more_logs_than_the_cap_holds_are_counted_not_read(shared_tmp, alice):
    usage, path = user_dir(shared_tmp, alice)
    for i in range(cap.NODE_CAP // cap.FILE_MIN + 3):
        log = path / f"nccl.n1.{i:04d}.log"
        log.write_bytes(b"x\n")
        os.chown(log, alice.pw_uid, alice.pw_gid)
    files = jobfiles.read_job_files(str(usage), "61", alice.pw_uid)
    assert len(files.nccl) == cap.NODE_CAP // cap.FILE_MIN and any(
        "3 more NCCL logs not read" in n for n in files.notes
    )
