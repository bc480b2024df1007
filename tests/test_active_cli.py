"""`stune-sweep` as the admin runs it: reports from a stored history, the catalogue, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_tune.active import store as active_store

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
FP = {"driver": "535.104.05", "cuda": "", "nccl": "2.19.3", "hca_fw": "", "kernel": "5.15.0"}


def sweep_cli(*args, env=None):
    return subprocess.run(
        [str(BIN / "stune-sweep"), *args], capture_output=True, text=True, env=dict(os.environ, **(env or {}))
    )


def history(store: Path, slow="n4", driver=FP["driver"], start=None, value=100.0):
    now = start or time.time() - 3600
    rows = []
    for i in range(1, 7):
        for run in range(3):
            v = 70.0 if f"n{i}" == slow and run != 1 else value
            rows.append(
                {
                    "at": now + i + run / 10,
                    "sweep": "s1",
                    "partition": "hdr",
                    "check": "nccl_allreduce",
                    "subject": f"n{i}",
                    "nodes": [f"n{i}"],
                    "hca": None,
                    "run": run,
                    "status": "ok",
                    "value": v,
                    "unit": "GB/s",
                    "detail": "",
                    "fingerprint": dict(FP, driver=driver),
                    "job": "1",
                }
            )
    active_store.append(str(store), "hdr", rows)


def test_report_table_csv_json_prom_and_drift(tmp_path):
    store = tmp_path / "store"
    history(store)
    env = {
        "STUNE_ACTIVE_DIR": str(store),
        "STUNE_PARTITIONS": str(REPO / "partitions"),
        "STUNE_CACHE_DIR": str(tmp_path / "cache"),
    }
    table = sweep_cli("report", "-p", "hdr", env=env)
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith("nccl_allreduce  n4"))
    assert "outlier" in line and "0.7" in line and "100.0" in line
    rows = json.loads(sweep_cli("report", "-p", "hdr", "--format", "json", env=env).stdout)["rows"]
    assert {r["subject"]: r["status"] for r in rows}["n4"] == "outlier"
    assert sweep_cli("report", "-p", "hdr", "--format", "csv", env=env).stdout.count("\n") == 7
    prom = sweep_cli("report", "-p", "hdr", "--format", "prom", env=env).stdout
    assert 'stune_active_outlier{partition="hdr",check="nccl_allreduce",subject="n4"} 1' in prom
    history(store, slow=None, driver="550.54.15", start=time.time() - 60, value=90.0)
    drift = sweep_cli("report", "-p", "hdr", "--drift", "--format", "csv", env=env).stdout.splitlines()
    assert drift[0] == "check,subject,changed,before,after,change,runs_before,runs_after"
    n1 = next(x for x in drift if ",n1," in x)
    assert "driver 535.104.05 -> 550.54.15" in n1 and ",100.0,90.0,-0.1," in n1


def test_errors_are_one_line():
    bad = sweep_cli("run", "-p", "nosuch", env={"STUNE_PARTITIONS": str(REPO / "partitions")})
    assert (
        bad.returncode == 1
        and bad.stderr.count("\n") == 1
        and "no profile for partition 'nosuch'" in bad.stderr
    )
    none = sweep_cli("run", "-p", "hdr", env={"STUNE_PARTITIONS": str(REPO / "partitions")})
    assert (
        none.returncode == 1
        and "no active checks configured" in none.stderr
        and "Traceback" not in none.stderr
    )
    spec = sweep_cli("agent", "--spec", "{not json")
    assert spec.returncode == 1 and "--spec is not JSON" in spec.stderr


def test_checks_lists_the_catalogue_with_install_hints(tmp_path):
    out = sweep_cli("checks", env={"PATH": "/nonexistent"})
    assert out.returncode == 0
    assert "ib_write_bw" in out.stdout and "perftest (apt-get install perftest)" in out.stdout


def test_checks_says_a_configured_tool_is_here_only_if_it_can_run(tmp_path):
    """The agent's rule (an executable file at the configured path), not "a path is configured"."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for f in (REPO / "partitions").glob("*.yaml"):
        (profiles / f.name).write_text(f.read_text())
    runnable = tmp_path / "ib_write_bw"
    runnable.write_text("#!/bin/sh\n")
    runnable.chmod(0o755)
    not_exec = tmp_path / "iperf3"
    not_exec.write_text("#!/bin/sh\n")
    (tmp_path / "dir").mkdir()
    with open(profiles / "hdr.yaml", "a") as fh:
        fh.write(
            "active:\n  checks:\n    ib_write_bw: {}\n    iperf3: {}\n    dcgm_diag: {}\n    nvbandwidth: {}\n"
            f"  tools:\n    ib_write_bw: {runnable}\n    iperf3: {not_exec}\n"
            f"    dcgmi: {tmp_path}/nosuch/dcgmi\n    nvbandwidth: {tmp_path}/dir\n"
        )
    out = sweep_cli(
        "checks",
        "-p",
        "hdr",
        env={"STUNE_PARTITIONS": str(profiles), "STUNE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert out.returncode == 0, out.stderr
    here = {}
    for line in out.stdout.splitlines():
        if not line.startswith(" "):
            name = line.split()[0]
        elif "tool here:" in line:
            here[name] = line.split("tool here:", 1)[1].strip()
    assert here["ib_write_bw"] == str(runnable)
    assert here["iperf3"].startswith("not available"), here
    assert here["dcgm_diag"].startswith("not available"), here
    assert here["nvbandwidth"].startswith("not available"), here


def test_history_of_one_node_and_the_sweep_lock(tmp_path):
    store = tmp_path / "store"
    history(store)
    env = {
        "STUNE_ACTIVE_DIR": str(store),
        "STUNE_PARTITIONS": str(REPO / "partitions"),
        "STUNE_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = sweep_cli("history", "-p", "hdr", "--node", "n4", "--format", "csv", env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("when,sweep,check,subject") and len(lines) == 4
    assert all(",n4," in x and "driver=535.104.05" in x for x in lines[1:])
    assert "not a duration" not in sweep_cli("history", "-p", "hdr", "--since", "7d", env=env).stderr
    bad = sweep_cli("history", "-p", "hdr", "--since", "soon", env=env)
    assert bad.returncode == 1 and "--since 'soon'" in bad.stderr
    with active_store.SweepLock(str(store), "hdr"):
        busy = sweep_cli("judge", "-p", "hdr", env=env)
    assert busy.returncode == 1 and "another sweep of this partition is running" in busy.stderr
