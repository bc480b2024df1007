"""The per-user submission history: its JSON, what it keeps of the environment, list and diff."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_tune.fastjson import dumps
from slurm_tune.sbatch import history
from slurm_tune.sbatch.history import record, recorded_env
from slurm_tune.sbatch.historyview import HistoryError, diff, find, format_list, load


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_the_records_json_reads_back_with_the_json_module(value):
    assert json.loads(dumps(value)) == value


def test_the_records_json_escapes_what_json_must():
    assert dumps('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\u0001"'
    assert json.loads(dumps("caf\u00e9 \u2603")) == "caf\u00e9 \u2603"


def test_recorded_env_drops_session_noise_and_hides_secrets():
    env = recorded_env(
        {
            "NCCL_IB_HCA": "=mlx5_0:1",
            "OLDPWD": "/x",
            "_": "/usr/bin/stune-sbatch",
            "SHLVL": "2",
            "WANDB_API_KEY": "s3cr3t",
            "HF_TOKEN": "hf_abc",
            "BASH_FUNC_module%%": "() {}",
        }
    )
    assert set(env) == {"NCCL_IB_HCA", "WANDB_API_KEY", "HF_TOKEN"}
    assert "s3cr3t" not in dumps(env) and env["WANDB_API_KEY"].startswith("<secret sha256:")
    # a changed secret still shows as a change
    assert recorded_env({"HF_TOKEN": "hf_other"})["HF_TOKEN"] != env["HF_TOKEN"]


def entry(job, env, partition="roce", argv=None, digest="d1"):
    return {
        "time": 1700000000,
        "job_id": job,
        "cluster": None,
        "partition": partition,
        "argv": argv or ["-p", partition, "train.sh"],
        "sbatch": [],
        "added": ["--requeue"],
        "cwd": "/w",
        "script": "train.sh",
        "profile": f"/p/{partition}.yaml",
        "digest": digest,
        "env": env,
    }


def test_record_load_find_and_the_file_is_private(tmp_path):
    environ = {"STUNE_HISTORY": str(tmp_path / "state" / "h.jsonl")}
    record(entry("10", {"A": "1"}), environ)
    record(entry("11", {"A": "2"}), environ)
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "h.jsonl").st_mode) == 0o600
    entries = load(environ)
    assert [e["job_id"] for e in entries] == ["10", "11"]
    assert find(entries, "10")["env"] == {"A": "1"} and find(entries, "-1")["job_id"] == "11"
    assert find(entries, "11.batch")["job_id"] == "11"
    with pytest.raises(HistoryError, match="job 12 is not in the history"):
        find(entries, "12")
    with pytest.raises(HistoryError, match="there is no run -3"):
        find(entries, "-3")


def test_odd_bytes_and_non_ascii_in_the_environment_read_back(tmp_path):
    environ = {"STUNE_HISTORY": str(tmp_path / "h.jsonl")}
    env = {"ODD": os.fsdecode(b"caf\xe9"), "TEXT": "caf\u00e9 \u2603", "CTRL": "a\tb\x01"}
    record(entry("1", env), environ)
    assert load(environ)[0]["env"] == env


def test_a_torn_line_is_skipped_not_fatal(tmp_path):
    path = tmp_path / "h.jsonl"
    environ = {"STUNE_HISTORY": str(path)}
    record(entry("1", {}), environ)
    with open(path, "a") as fh:
        fh.write('{"job_id": "2", "env": {"A"')  # a crash mid-write
    record(entry("3", {}), environ)
    assert [e["job_id"] for e in load(environ)] == ["1", "3"]


def test_default_location_follows_xdg_state_home(tmp_path):
    assert history.history_path({"XDG_STATE_HOME": str(tmp_path)}) == str(
        tmp_path / "stune" / "sbatch-history.jsonl"
    )


def test_the_first_record_makes_its_private_directory(tmp_path):
    environ = {"XDG_STATE_HOME": str(tmp_path / "state")}
    path = record(entry("1", {}), environ)
    assert path == str(tmp_path / "state" / "stune" / "sbatch-history.jsonl")
    assert oct((tmp_path / "state" / "stune").stat().st_mode & 0o777) == "0o700"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    record(entry("2", {}), environ)
    assert [e["job_id"] for e in load(environ)] == ["1", "2"]


def test_diff_of_two_runs_differing_in_one_variable_shows_exactly_that_variable():
    a = entry("10", {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_TIMEOUT": "22", "HOME": "/home/u"})
    b = entry("11", {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_TIMEOUT": "18", "HOME": "/home/u"})
    assert diff(a, b) == ["environment (1 variable differ):", "  ~ NCCL_IB_TIMEOUT: '22' -> '18'"]


def test_diff_reports_added_removed_partition_profile_and_command():
    a = entry("10", {"A": "1", "B": "2"}, partition="roce", digest="d1")
    b = entry(
        "11", {"B": "2", "C": "3"}, partition="vpc", argv=["-p", "vpc", "-N", "2", "train.sh"], digest="d2"
    )
    lines = diff(a, b)
    assert "partition: 'roce' -> 'vpc'" in lines
    assert any(line.startswith("profile: /p/roce.yaml digest d1 -> /p/vpc.yaml digest d2") for line in lines)
    assert "command: -p roce train.sh" in lines and "     ->  -p vpc -N 2 train.sh" in lines
    assert lines[-3:] == ["environment (2 variables differ):", "  - A=1", "  + C=3"]
    assert diff(a, a) == []


def test_list_shows_one_line_per_run():
    text = format_list([entry("10", {}), entry("11", {}, partition="vpc")], rates={"10": None, "11": None})
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["when", "job", "partition", "digest"]
    assert lines[1].split()[5:7] == ["-", "-"]  # no steps record (test_steps_history.py: with one)
    assert "10" in lines[1] and "stune-sbatch -p roce train.sh" in lines[1] and "vpc" in lines[2]
    assert format_list([]) == "no submissions recorded yet\n"


def test_history_commands(tmp_path):
    # no Slurm here: sacct cannot run, which history says in one line and lists the runs anyway
    # (test_steps_history.py: the throughput columns with a sacct that answers)
    env = dict(os.environ, STUNE_HISTORY=str(tmp_path / "h.jsonl"), STUNE_SLURM_BIN=str(tmp_path / "none"))
    record(entry("10", {"X": "1"}), env)
    record(entry("11", {"X": "2"}), env)
    run = lambda *a: subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "stune-sbatch"), *a],
        capture_output=True,
        text=True,
        env=env,
    )
    out = run("history")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 3
    assert out.stderr.startswith("stune-sbatch: warning: no throughput shown: sacct failed (exit 127)")
    out = run("history", "diff", "10", "11")
    assert out.returncode == 0 and out.stdout.splitlines()[1:] == [
        "samples/s ?: sacct could not be asked; X changed",
        "environment (1 variable differ):",
        "  ~ X: '1' -> '2'",
    ]
    out = run("history", "diff", "10", "99")
    assert out.returncode == 1 and out.stderr.startswith("stune-sbatch: job 99 is not in the history")
    assert "Traceback" not in out.stderr
    assert run("history", "diff", "10").returncode == 2
