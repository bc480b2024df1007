"""Lemons and the reliability report on the dev cluster, for real: multi-node jobs that a node keeps killing
(slurmctld sets it DOWN with a health reason, as a failed GPU's drain would: the jobs end NODE_FAIL and
Slurm records the node event), beside jobs that complete. `stune-health lemons` reads the live sacct and
`sacctmgr show event`, finds the lemon and marks it (opt-in), and a partition with clean jobs flags nothing.

The jobs run in partitions the other cluster tests leave alone (vpc, roce), and the window is this test's
own time, so jobs of earlier tests do not count."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import wait_for_state, wait_until

from slurm_tune.cli.health import main as health_main
from slurm_tune.nodestate import DEGRADED_FEATURE, LEMON_COMMENT

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
REASON = "stune: gpu3 Xid 79"
FAILURES = 6


def _idle(slurm, name: str) -> bool:
    node = slurm.node(name)
    return node.state in ("idle", "mixed", "allocated") and "DOWN" not in node.flags and not node.drain


def _kill_on_n2(slurm, partition: str) -> int:
    """A 2-node job on n1,n2 that n2's going DOWN ends NODE_FAIL."""
    job = slurm.submit(["-p", partition, "-N2", "-w", "n1,n2", "--no-requeue", "--wrap", "sleep 300"])
    wait_until(f"job {job} running", lambda: slurm.job(job).state == "RUNNING", timeout=60)
    time.sleep(2)
    slurm.update_node("n2", state="DOWN", reason=REASON)
    assert wait_for_state(slurm, job, ("NODE_FAIL",), timeout=60) == "NODE_FAIL"
    if not _idle(slurm, "n2"):  # ReturnToService=2 brings it back when slurmd registers; help it along
        slurm.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], check=False)
    wait_until("n2 back in service", lambda: _idle(slurm, "n2"), timeout=60, interval=1)
    return job


def _window(start: float) -> str:
    return f"{int(time.time() - start) + 10}s"


def test_a_node_that_keeps_killing_jobs_is_found_marked_and_cleared(
    slurm, tmp_path_factory, capsys, monkeypatch
):
    # (not under tmp_path: the slurm fixture opens that to the jobs' users, and root loads no profile there)
    profiles = tmp_path_factory.mktemp("lemon-profiles") / "partitions"
    shutil.copytree(REPO / "partitions", profiles)
    with open(profiles / "vpc.yaml", "a") as fh:
        fh.write("health:\n  lemon_mark: true\n  drain_max_fraction: 0.34\n")
    monkeypatch.setenv("STUNE_PARTITIONS", str(profiles))
    start = time.time()
    clean = [
        slurm.submit(["-p", "vpc", "-N2", "-w", "n1,n3", "--no-requeue", "--wrap", "sleep 60"])
        for _ in range(3)
    ]
    failed = [_kill_on_n2(slurm, "vpc") for _ in range(FAILURES)]
    clean += [
        slurm.submit(["-p", "roce", "-N2", "-w", "n2,n3", "--no-requeue", "--wrap", "sleep 5"])
        for _ in range(2)
    ]
    for job in clean:
        assert wait_for_state(slurm, job, ("COMPLETED",), timeout=180) == "COMPLETED"

    assert health_main(["lemons", "-p", "vpc", "--window", _window(start), "--json"]) == 3
    (part,) = json.loads(capsys.readouterr().out)["partitions"]
    assert [s["node"] for s in part["lemons"]] == ["n2"] and part["with_events"]
    (lemon,) = part["lemons"]
    assert lemon["failures"] == lemon["localized"] == lemon["caught"] == FAILURES
    assert lemon["causes"] == {"hardware": FAILURES} and set(lemon["jobs"]) <= {str(j) for j in failed}
    assert health_main(["lemons", "-p", "roce", "--window", _window(start)]) == 0  # clean: nothing
    assert "no lemon" in capsys.readouterr().out

    assert health_main(["reliability", "-p", "vpc", "--since", _window(start), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["cause"], c["code"], c["count"]) for c in doc["causes"]] == [("hardware", "xid79", FAILURES)]
    assert doc["interruptions"] == FAILURES and doc["runs"] == FAILURES + 3 and doc["with_events"]

    assert health_main(["lemons", "-p", "vpc", "--window", _window(start), "--mark"]) == 3
    out, err = capsys.readouterr()
    assert "profiles not read" not in err
    assert "n2: marked degraded: lemon: 6 failed multi-node runs" in out
    n2 = slurm.node("n2")
    assert DEGRADED_FEATURE in n2.feature_set and n2.comment.startswith(LEMON_COMMENT) and not n2.drain
    # a window without the failures: n2 is no lemon any more, and its mark goes
    assert health_main(["lemons", "-p", "vpc", "--window", "1s", "--mark"]) == 0
    assert "n2: lemon mark cleared" in capsys.readouterr().out
    n2 = slurm.node("n2")
    assert DEGRADED_FEATURE not in n2.feature_set and n2.comment == ""
