"""Throughput in the history: `stune-sbatch history` and `history diff` with each run's steps summary, read
from its job's AdminComment by one sacct call through the adapter. sacct is a stand-in here that answers as
sacct -P -n does (the rows of tests/fixtures/slurm/*/sacct_dump_X.txt's layout), from a table of jobs, and
logs its argv; test_sbatch_cluster.py runs the same commands against the dev cluster's real sacct."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.sbatch.history import record
from slurm_tune.sbatch.historyview import changes, headline, throughput
from slurm_tune.slurm import Slurm
from slurm_tune.usage.steps import StepStats

BIN = os.path.dirname(sys.executable)
# Job 1's AdminComment as the 22.05 and 25.05 captures hold it (sacct_dump_X.txt): the usage summary alone.
USAGE = (
    "stune1 held=7200.0 used=6480.2 cov=7195.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 "
    "per_gpu=n1/0:90.1:40.2:30517:250.3"
)
FAST = StepStats(1180, 10, 0, 1, 1830.2, 1790.4, 1871.5, 1822.9, 0.061, 0.093, 95.2, 905.1)
SLOW = StepStats(1180, 10, 0, 1, 1210.0, 1100.0, 1300.0, 1195.5, 0.31, 0.402, 96.0, 880.0)

STANDIN = r'''#!{python}
"""sacct stand-in: `-P -n --format=F1,F2,...` rows of the jobs asked for (--jobs=), from $STANDIN_JOBS."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if os.environ.get("STANDIN_FAIL"):
    sys.stderr.write("sacct: error: Problem talking to the database: Connection refused\n")
    sys.exit(1)
fmt = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
jobs = next(a.split("=", 1)[1] for a in args if a.startswith("--jobs=")).split(",")
assert "-P" in args and "-n" in args and "-X" in args, args
table = json.load(open(os.environ["STANDIN_JOBS"]))
for row in table:
    if row["JobIDRaw"] in jobs or row["JobID"].split("_")[0] in jobs:
        print("|".join(row.get(f, "") for f in fmt.split(",")))
'''


@pytest.fixture
def world(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sacct").write_text(STANDIN.format(python=sys.executable))
    (bindir / "sacct").chmod(0o755)
    env = dict(
        os.environ,
        STUNE_HISTORY=str(tmp_path / "h.jsonl"),
        STUNE_SLURM_BIN=str(bindir),
        STANDIN_LOG=str(tmp_path / "sacct.log"),
        STANDIN_JOBS=str(tmp_path / "jobs.json"),
    )
    env.pop("STANDIN_FAIL", None)
    return {"env": env, "tmp": tmp_path, "bin": bindir}


def jobs(world, rows):
    Path(world["env"]["STANDIN_JOBS"]).write_text(json.dumps(rows))


def calls(world) -> list[list[str]]:
    log = Path(world["env"]["STANDIN_LOG"])
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def entry(job, argv, env=None, partition="roce", digest="d1", cluster=None):
    return {
        "time": 1700000000,
        "job_id": job,
        "cluster": cluster,
        "partition": partition,
        "argv": argv,
        "sbatch": [],
        "added": ["--requeue"],
        "cwd": "/w",
        "script": "train.sh",
        "profile": f"/p/{partition}.yaml",
        "digest": digest,
        "env": env or {"NCCL_IB_TIMEOUT": "22"},
    }


def stune_sbatch(world, *args):
    return subprocess.run(
        [os.path.join(BIN, "stune-sbatch"), *args], capture_output=True, text=True, env=world["env"]
    )


def three_runs(world):
    record(entry("812", ["-p", "roce", "--stage", "/data/imagenet", "-N", "2", "train.sh"]), world["env"])
    record(entry("977", ["-p", "roce", "--nodes=2", "train.sh"]), world["env"])
    record(
        entry("978", ["-p", "roce", "-N", "4", "train.sh", "--lr", "3"], {"NCCL_IB_TIMEOUT": "14"}),
        world["env"],
    )
    jobs(
        world,
        [
            {"JobIDRaw": "812", "JobID": "812", "AdminComment": f"{USAGE} {FAST.tokens()}"},
            {"JobIDRaw": "977", "JobID": "977", "AdminComment": f"{USAGE} {SLOW.tokens()}"},
            {"JobIDRaw": "978", "JobID": "978", "AdminComment": USAGE},  # a usage summary, no steps record
        ],
    )


def test_history_shows_each_runs_samples_per_second_from_one_sacct_call(world):
    three_runs(world)
    out = stune_sbatch(world, "history")
    assert out.returncode == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    assert lines[0].split()[:7] == ["when", "job", "partition", "digest", "samples/s", "data", "wait"]
    assert "812" in lines[1] and "1830 (1790-1872)" in lines[1] and " 6 % " in lines[1]
    assert "977" in lines[2] and "1210 (1100-1300)" in lines[2] and " 31 % " in lines[2]
    assert lines[3].split()[5:7] == ["-", "-"] and "stune-sbatch -p roce -N 4 train.sh --lr 3" in lines[3]
    (argv,) = calls(world)  # one call for the three runs
    assert "--format=JobIDRaw,JobID,AdminComment" in argv and "--jobs=812,977,978" in argv
    out = stune_sbatch(world, "history", "-n", "2")
    assert len(out.stdout.splitlines()) == 3 and calls(world)[-1][-1] == "--jobs=977,978"


def test_history_diff_puts_the_throughput_change_next_to_the_settings_change(world):
    three_runs(world)
    out = stune_sbatch(world, "history", "diff", "812", "977")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("history diff 812 (") and " -> 977 (" in lines[0]
    assert lines[1] == "samples/s 1830 -> 1210 (-34 %); data wait 6 % -> 31 %; --stage dropped"
    assert lines[2:] == [
        "command: -p roce --stage /data/imagenet -N 2 train.sh",
        "     ->  -p roce --nodes=2 train.sh",
    ]
    assert calls(world)[-1][-1] == "--jobs=812,977"
    out = stune_sbatch(world, "history", "diff", "-2", "-1")
    assert out.stdout.splitlines()[1] == (
        "samples/s 1210 -> - (978: no steps record); --nodes 2 -> 4; script arguments changed; "
        "NCCL_IB_TIMEOUT changed"
    )


def test_history_diff_json_carries_both_summaries(world):
    three_runs(world)
    out = stune_sbatch(world, "history", "diff", "812", "-1", "--json")
    doc = json.loads(out.stdout)
    assert doc["a"]["steps"]["sps_p50"] == 1830.2 and doc["a"]["steps"]["dwait_p90"] == pytest.approx(0.093)
    assert doc["b"]["steps"] is None
    assert doc["summary"].startswith(
        "samples/s 1830 -> - (978: no steps record); --nodes 2 -> 4; --stage dropped"
    )
    assert "--stage dropped" in doc["changes"] and doc["differences"][0].startswith("command: ")
    listing = json.loads(stune_sbatch(world, "history", "--json").stdout)
    assert [e["steps"] and e["steps"]["steps"] for e in listing] == [1180, 1180, None]


def test_sacct_failing_is_one_warning_line_and_the_list_still_prints(world):
    three_runs(world)
    world["env"]["STANDIN_FAIL"] = "1"
    out = stune_sbatch(world, "history")
    assert out.returncode == 0
    assert out.stderr == (
        "stune-sbatch: warning: no throughput shown: sacct failed (exit 1): "
        "sacct: error: Problem talking to the database: Connection refused\n"
    )
    rows = out.stdout.splitlines()[1:]
    assert len(rows) == 3 and all(r.split()[5:7] == ["?", "?"] for r in rows)
    out = stune_sbatch(world, "history", "diff", "812", "977")
    assert out.returncode == 0 and out.stderr.count("\n") == 1
    assert out.stdout.splitlines()[1] == "samples/s ?: sacct could not be asked; --stage dropped"
    world["env"]["STUNE_SLURM_BIN"] = str(world["tmp"] / "nowhere")  # no sacct at all
    out = stune_sbatch(world, "history", "--json")
    assert out.returncode == 0 and "cannot run sacct" in out.stderr and out.stderr.count("\n") == 1
    assert [e["steps"] for e in json.loads(out.stdout)] == [None, None, None]


def test_an_empty_history_asks_sacct_nothing(world):
    out = stune_sbatch(world, "history")
    assert out.stdout == "no submissions recorded yet\n" and calls(world) == []


def test_throughput_through_the_adapter_one_call_per_cluster(world):
    env = world["env"]
    jobs(
        world,
        [
            {"JobIDRaw": "5", "JobID": "5", "AdminComment": f"{USAGE} {FAST.tokens()}"},
            # an array's tasks: the task that kept the array's id has no record, another one has
            {"JobIDRaw": "7", "JobID": "7_1", "AdminComment": USAGE},
            {"JobIDRaw": "9", "JobID": "7_2", "AdminComment": f"stune1 {SLOW.tokens()}"},
            {
                "JobIDRaw": "11",
                "JobID": "11",
                "AdminComment": "something an admin wrote sps=1/1/1/1 steps=1/0/0/1",
            },
            {"JobIDRaw": "12", "JobID": "12", "AdminComment": "stune1 sps=garbage steps=1/0/0/1"},
            {"JobIDRaw": "6", "JobID": "6", "AdminComment": f"{USAGE} {SLOW.tokens()}"},  # on cluster other
        ],
    )
    os.environ["STANDIN_LOG"], os.environ["STANDIN_JOBS"] = env["STANDIN_LOG"], env["STANDIN_JOBS"]
    try:
        slurm = Slurm(bin_dir=str(world["bin"]))
        entries = [entry(j, ["x.sh"]) for j in ("5", "7", "11", "12", "5", "not-a-job")]
        entries.append(entry("6", ["x.sh"], cluster="other"))
        rates, warning = throughput(entries, slurm)
    finally:
        del os.environ["STANDIN_LOG"], os.environ["STANDIN_JOBS"]
    assert warning is None
    assert rates["5"].tokens() == FAST.tokens() and rates["7"].tokens() == SLOW.tokens()
    assert rates["11"] is None and rates["12"] is None  # not stune's line; unreadable tokens
    assert [c[-1] for c in slurm.calls] == ["--jobs=5,7,11,12", "--clusters=other"]
    assert "--jobs=6" in slurm.calls[1] and rates["6;other"].tokens() == SLOW.tokens() and "6" not in rates


def test_changes_reads_options_not_words():
    a = entry("1", ["-p", "roce", "-N", "2", "--exclusive", "--stage", "/d:x", "train.sh"])
    b = entry("2", ["--partition=vpc", "--nodes=2", "--exclusive", "train.sh"], partition="vpc")
    assert changes(a, b) == ["partition roce -> vpc", "--stage dropped"]
    c = entry(
        "3", ["-p", "roce", "-N", "2", "--exclusive", "--stage=/d:x", "-t", "1:00", "train.sh"], digest="d2"
    )
    assert changes(a, c) == ["profile changed", "--time 1:00 added"]
    assert changes(a, a) == []
    rates = {"1": FAST, "2": FAST}
    assert headline(a, a, rates) == "samples/s 1830 -> 1830 (+0 %); data wait 6 % -> 6 %; same settings"
    many = entry("4", a["argv"], env={f"V{i}": "1" for i in range(5)})
    assert changes(a, many) == ["6 environment variables changed"]
    assert headline(a, many, {}) == "samples/s ?: sacct could not be asked; 6 environment variables changed"
    assert headline(a, many, {"1": None, "4": None}).startswith(
        "samples/s -: no steps record for either run (docs/steps.md); "
    )
