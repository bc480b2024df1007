"""The node epilog's part from the job's directory (usage/jobfiles.py): the steps file and the NCCL logs
judged against the partition's profile, the node's record of judged jobs, and the job-level tokens the
controller stores in AdminComment."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_tune import comm
from slurm_tune.health import state
from slurm_tune.usage import jobfiles, spool, summary
from slurm_tune.usage.pipeline import admin_fields

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "comm"
SOCKET = "nccl-socket-ncclTests179.txt"
IB_GDR = "nccl-ib-gdr-a100-nccl707.txt"


def job_dir(tmp_path: Path, job_id: str, logs: dict[str, str], steps: str | None = None) -> Path:
    local = tmp_path / "usage"
    path = local / "run" / job_id
    path.mkdir(parents=True)
    (local / "run").chmod(0o755)
    for name, capture in logs.items():
        (path / name).write_bytes((FIXTURES / capture).read_bytes())
    if steps is not None:
        (path / "steps.jsonl").write_text(steps)
    return local


def epilog_env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_PARTITION": "hdr",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "STUNE_STATE_DIR": str(tmp_path / "health"),
        **more,
    }


def steps_text(n: int = 30, samples: int = 64, step_s: float = 0.5, data_s: float = 0.1) -> str:
    return "".join(
        json.dumps({"step": i, "samples": samples, "step_s": step_s, "data_s": data_s}) + "\n"
        for i in range(n)
    )


def test_a_socket_log_on_an_ib_partition_is_a_fallback_recorded_on_the_node(tmp_path):
    local = job_dir(tmp_path, "71", {"nccl.n1.11.log": SOCKET, "nccl.n1.12.log": SOCKET})
    part, notes = jobfiles.node_part(str(local), "71", "n1", epilog_env(tmp_path), now=1e9)
    assert notes == []
    verdict = comm.decode(part["comm"])
    assert verdict is not None and verdict.status == "fallback"
    held, _ = state.read(str(tmp_path / "health"))
    ((job, at, status, why, uid),) = held["comm_jobs"]
    assert (job, at, status, uid) == ("71", 1e9, "fallback", 0) and "Socket" in why


def test_ib_with_gdr_passes_and_steps_are_summarised(tmp_path):
    local = job_dir(tmp_path, "72", {"nccl.n1.11.log": IB_GDR}, steps=steps_text())
    part, _ = jobfiles.node_part(str(local), "72", "n1", epilog_env(tmp_path))
    assert comm.decode(part["comm"]).status == "ok"
    assert part["steps"].startswith("sps=128/") and part["steps_n"] == 30


def test_a_multi_node_job_without_an_nccl_log_is_not_judged_and_not_recorded(tmp_path):
    local = job_dir(tmp_path, "73", {})
    part, _ = jobfiles.node_part(str(local), "73", "n1", epilog_env(tmp_path))
    assert comm.decode(part["comm"]).status == "not_judged"
    assert "comm_jobs" not in state.read(str(tmp_path / "health"))[0]
    # a one-node job without a log has no transport verdict at all
    part, _ = jobfiles.node_part(str(local), "73", "n1", epilog_env(tmp_path, SLURM_JOB_NODELIST="n1"))
    assert "comm" not in part
    # what each release gives the epilog: the count, or 22.05's SLURM_NODELIST
    assert jobfiles.job_nodes({"SLURM_JOB_NUM_NODES": "4"}) == 4
    assert jobfiles.job_nodes({"SLURM_NODELIST": "n[2-3]"}) == 2 and jobfiles.job_nodes({}) == 1


def test_no_uid_no_profile_no_directory(tmp_path):
    local = job_dir(tmp_path, "74", {"nccl.n1.1.log": SOCKET})
    env = epilog_env(tmp_path)
    del env["SLURM_JOB_UID"]
    assert jobfiles.node_part(str(local), "74", "n1", env)[0] == {}
    part, notes = jobfiles.node_part(
        str(local), "74", "n1", epilog_env(tmp_path, SLURM_JOB_PARTITION="nosuch")
    )
    assert "comm" not in part and any("transport not judged" in n for n in notes)
    assert jobfiles.node_part(str(local), "99", "n1", epilog_env(tmp_path)) == ({}, [])


def node_summary(node: str, **extra) -> dict:
    return {"v": 1, "job": "80", "node": node, "start": 0.0, "end": 100.0, "gpus": [], **extra}


def test_the_job_line_carries_the_steps_of_rank_0s_node_and_every_nodes_verdict(tmp_path):
    socket = comm.judge([comm.parse((FIXTURES / SOCKET).read_bytes())], comm.Expectation("ib"))
    good = comm.judge([comm.parse((FIXTURES / IB_GDR).read_bytes())], comm.Expectation("ib"))
    stats_line = "sps=128/128/128/128 dwait=20.0/20.0 steps=20/10/0/1 warm=5.0/128.0"
    nodes = [
        node_summary("n1", comm=good.encode(), steps=stats_line, steps_n=30),
        node_summary(
            "n2", comm=socket.encode(), steps="sps=1/1/1/1 dwait=-/- steps=1/0/0/1 warm=-/-", steps_n=1
        ),
        node_summary("n3", comm="garbage;;"),
    ]
    tokens = jobfiles.job_tokens(nodes)
    line = summary.encode(summary.merge(nodes)) + " " + tokens
    assert summary.parse(line) is not None  # the usage line still reads
    fields = admin_fields(line)
    assert fields["sps"] == "128/128/128/128" and fields["commn"] == "2/1/0"
    verdict, counts = jobfiles.parse_comm(fields)
    assert counts == (2, 1, 0) and verdict.status == "fallback"
    assert any("ranks on n2 used NET/Socket" in m for m in verdict.messages)
    assert fields["comm"].startswith("n2@")  # the nodes with findings first


def test_the_node_epilog_adds_the_jobs_part_and_removes_its_directory(tmp_path):
    local = job_dir(tmp_path, "75", {"nccl.n1.1.log": SOCKET}, steps=steps_text())
    (local / "jobs").mkdir()
    (local / "jobs" / "75").write_text("0\n")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    outcome = spool.node_epilog(
        str(local), str(spool_dir), "75", "n1", None, now=50.0, environ=epilog_env(tmp_path)
    )
    assert outcome.startswith("wrote")
    doc = json.loads((spool_dir / "75" / "n1.json").read_text())
    assert comm.decode(doc["comm"]).status == "fallback" and doc["steps"].startswith("sps=")
    assert not (local / "run" / "75").exists()


def test_a_cpu_jobs_directory_is_removed_with_nothing_written(tmp_path):
    local = job_dir(tmp_path, "76", {"nccl.n1.1.log": SOCKET})
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    outcome = spool.node_epilog(str(local), str(spool_dir), "76", "n1", None, environ=epilog_env(tmp_path))
    assert outcome == "no GPUs on this node" and not (local / "run" / "76").exists()
    assert list(spool_dir.iterdir()) == []


def test_garbled_comm_tokens_read_as_none():
    for text in ("", "comm=", "comm=@@@|||", "comm=n1@c9;ok", "comm=n1"):
        assert jobfiles.parse_comm(admin_fields("stune1 held=1 " + text)) == (None, None)
