"""`stune-stage` as an admin and a user run it: init, fetch (eval-able), ls, status, release, gc; clean errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_stage_tier import make_tree, open_up, tree_digest

STAGE = str(Path(sys.executable).parent / "stune-stage")
REPO = Path(__file__).resolve().parent.parent


def run(*args, env=None, check=True):
    proc = subprocess.run([STAGE, *args], capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    assert "Traceback" not in proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_the_admin_and_user_round_trip(shared_tmp):
    open_up(shared_tmp)
    tier = shared_tmp / "nvme" / "cache"
    tier.parent.mkdir()
    ds = make_tree(shared_tmp / "ds")
    assert "created" in run("init", "--path", str(tier)).stdout
    assert oct(tier.stat().st_mode & 0o7777) == "0o1777" and (tier / ".ledger").is_dir()
    assert "already set up" in run("init", "--path", str(tier)).stdout

    fetched = run("fetch", "--path", str(tier), "--job", "31", f"{ds}:TRAIN")
    assert "TRAIN: staged" in fetched.stderr
    shell = subprocess.run(
        ["bash", "-c", fetched.stdout + 'printf %s "$STUNE_STAGE_TRAIN"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert tree_digest(shell) == tree_digest(ds)
    paths = run("fetch", "--path", str(tier), "--format", "paths", f"{ds}:TRAIN").stdout
    assert paths == f"STUNE_STAGE_TRAIN {shell}\n"

    listing = json.loads(run("ls", "--path", str(tier), "--json").stdout)
    assert [(r["user"], r["source"], r["holds"]) for r in listing] == [("root", str(ds), ["31"])]
    table = run("ls", "--path", str(tier)).stdout
    assert str(ds) in table and "31" in table
    status = run("status", "--path", str(tier)).stdout
    assert "1 ready" in status and "1 held by running jobs" in status

    run("release", "--path", str(tier), "--job", "31")
    assert json.loads(run("ls", "--path", str(tier), "--json").stdout)[0]["holds"] == []
    assert "nothing to do" in run("gc", "--path", str(tier), "--dry-run").stdout
    assert "nothing to do" in run("gc", "--path", str(tier), "--to-low").stdout, "far below the low watermark"
    assert "evicted root/" in run("gc", "--path", str(tier), "--evict-all").stdout
    assert json.loads(run("ls", "--path", str(tier), "--json").stdout) == []


def test_fetch_with_nothing_to_stage_says_so():
    proc = run("fetch", env={"STUNE_STAGE": ""}, check=False)
    assert proc.returncode == 1 and "nothing to stage" in proc.stderr


def test_fetch_required_fails_cleanly_where_a_plain_fetch_falls_back(shared_tmp):
    ds = make_tree(shared_tmp / "ds", dirs=1, files=2)
    missing = shared_tmp / "no-such-tier"
    plain = run("fetch", "--path", str(missing), f"{ds}:D")
    assert plain.stdout == f"export STUNE_STAGE_D='{ds}'\n" and "warning: D: not staged" in plain.stderr
    required = run("fetch", "--path", str(missing), "--required", f"{ds}:D", check=False)
    assert required.returncode == 1 and required.stdout == ""
    assert (
        required.stderr.startswith("stune-stage: --stage-required: D: cache tier")
        and "does not exist" in required.stderr
    )


def test_the_epilog_never_fails(shared_tmp):
    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_PARTITION": "nosuch",
        "STUNE_PARTITIONS": str(shared_tmp / "no-profiles"),
    }
    proc = run("epilog", env=env, check=False)
    assert proc.returncode == 0 and "epilog: job 12" in proc.stderr and "deprecated" not in proc.stderr
    old = run("release", "--epilog", env=env, check=False)  # the spelling hook scripts of older installs use
    assert old.returncode == 0 and "epilog: job 12" in old.stderr
    assert "note: --epilog is deprecated; use `stune-stage epilog`" in old.stderr
    hook = Path(__file__).resolve().parent.parent / "epilog" / "30-stune-stage"
    proc = subprocess.run(
        [str(hook)],
        capture_output=True,
        text=True,
        env=dict(
            env,
            STUNE_BIN=str(Path(sys.executable).parent),
            PATH="/usr/bin:/bin",
            STUNE_ENV_FILE="/nonexistent",
        ),
    )
    assert proc.returncode == 0 and "epilog: job 12" in proc.stderr


def test_the_epilog_takes_the_jobs_partition_from_the_job_context(tmp_path):
    """Slurm may give a list in $SLURM_JOB_PARTITION (a job submitted to several): the epilog uses the one
    the job runs in (the first, thisnode.job_partition), as every other entry point does."""
    (tmp_path / "profiles").mkdir()
    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_PARTITION": "nosuch,gpu",
        "STUNE_PARTITIONS": str(tmp_path / "profiles"),
    }
    proc = run("epilog", env=env, check=False)
    assert proc.returncode == 0 and "no profile for partition 'nosuch' " in proc.stderr, proc.stderr


def test_the_epilog_hook_exports_the_whole_hook_environment_file(shared_tmp):
    """Like every stune hook, it reads /etc/default/stune with `set -a`: STUNE_CACHE_DIR reaches stune-stage."""
    cache = (
        shared_tmp.parent / f"{shared_tmp.name}-profile-cache"
    )  # root's cache: not in the job-writable tmp
    env_file = shared_tmp.parent / f"{shared_tmp.name}-default-stune"  # root sources only a root-only file
    env_file.write_text(
        f"STUNE_BIN={Path(sys.executable).parent}\nSTUNE_PARTITIONS={REPO / 'partitions'}\n"
        f"STUNE_CACHE_DIR={cache}\n"
    )
    env = {
        "SLURM_JOB_ID": "13",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_PARTITION": "hdr",
        "PATH": "/usr/bin:/bin",
        "STUNE_ENV_FILE": str(env_file),
    }
    proc = subprocess.run([str(REPO / "epilog" / "30-stune-stage")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert any(cache.iterdir()), "the profiles were loaded with the env file's STUNE_CACHE_DIR"


def test_bad_input_is_one_line_and_exit_1_and_a_misspelt_option_gets_the_subcommands_usage(tmp_path):
    for bad, why in (
        (["fetch", "--job", "../../x", "/data/x"], "--job '../../x': not a Slurm job id"),
        (["release", "--job", "12_3"], "--job '12_3': not a Slurm job id"),
        (["fetch", "--jobs", "0", "/data/x"], "--jobs '0': the number of copy threads must be 1 to 256"),
    ):
        proc = run(*bad, check=False)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"stune-stage: {why}")
    proc = run("gc", "--path", str(tmp_path), "--dryrun", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: stune-stage gc ")
    assert "--evict-all" in proc.stderr and proc.stderr.rstrip().endswith("(did you mean --dry-run?)")


def test_ls_of_a_missing_tier_is_an_error(tmp_path):
    for extra in ([], ["--json"]):
        proc = run("ls", "--path", str(tmp_path / "gone"), *extra, check=False)
        assert (
            proc.returncode == 1 and f"{tmp_path / 'gone'}" in proc.stderr and "does not exist" in proc.stderr
        )
    assert run("ls", "--path", str(tmp_path / "gone"), check=False).stdout == ""
