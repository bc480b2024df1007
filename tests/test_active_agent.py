"""The sweep job's agent on this machine: tools missing, hung or failing, the disk check with fio and with its
dd fallback, the fingerprint from the relocatable root; and the profile's `active` section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_tune.active import agent
from slurm_tune.active.agent import MARK
from slurm_tune.errors import ConfigError
from slurm_tune.profiles import load_profile

STANDINS = Path(__file__).parent / "active_standins"


def run(spec, **env):
    lines = []
    environ = dict(os.environ, **env)
    agent.run_spec(
        dict({"subject": "n1", "nodes": ["n1"], "runs": 1, "run_timeout": 10}, **spec), lines.append, environ
    )
    return [json.loads(line[len(MARK) :]) for line in lines]


def test_missing_tool_is_unavailable_with_what_to_install():
    (r,) = run({"check": "dcgm_diag", "tools": {"dcgmi": "/nonexistent/dcgmi"}})
    assert r["status"] == "unavailable" and "datacenter-gpu-manager" in r["detail"] and r["value"] is None


def test_a_configured_tool_that_cannot_run_is_unavailable_and_says_which_setting(tmp_path):
    """A directory, or a file without execute permission, at active.tools.<tool>: unavailable, naming it."""
    plain = tmp_path / "dcgmi"
    plain.write_text("#!/bin/sh\necho hi\n")
    for path in (plain, tmp_path):
        (r,) = run({"check": "dcgm_diag", "tools": {"dcgmi": str(path)}})
        assert r["status"] == "unavailable", r
        assert r["detail"].startswith(
            f"{path} (active.tools.dcgmi) is not an executable file: install DCGM"
        ), r


def test_a_hung_tool_is_killed_at_the_run_deadline_and_is_unknown(tmp_path):
    tool = tmp_path / "all_reduce_perf"
    tool.write_text(
        "#!/bin/sh\necho '# nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903'\nsleep 60\n"
    )
    tool.chmod(0o755)
    (r,) = run({"check": "nccl_allreduce", "tools": {"all_reduce_perf": str(tool)}, "run_timeout": 1})
    assert r["status"] == "unknown" and r["value"] is None


def test_stand_in_runs_each_measured_with_fingerprint(tmp_path):
    values = tmp_path / "v.json"
    values.write_text(json.dumps({"all_reduce_perf": {"n1": [70, 100]}}))
    root = tmp_path / "root"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:30 UTC 2024\n"
    )
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("5.15.0-105-generic\n")
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (root / "sys/class/infiniband/mlx5_0/fw_ver").write_text("20.31.1014\n")
    rs = run(
        {
            "check": "nccl_allreduce",
            "runs": 2,
            "tools": {"all_reduce_perf": str(STANDINS / "all_reduce_perf")},
        },
        STUNE_STANDIN_VALUES=str(values),
        STUNE_STANDIN_STATE=str(tmp_path),
        SLURM_JOB_NODELIST="n1",
        STUNE_SYSFS_ROOT=str(root),
    )
    assert [r["value"] for r in rs] == [70.0, 100.0]
    assert rs[0]["fingerprint"] == {
        "driver": "550.54.15",
        "cuda": "",
        "nccl": "2.19.3",
        "hca_fw": "20.31.1014",
        "kernel": "5.15.0-105-generic",
    }


def test_disk_read_with_fio_and_with_dd_when_fio_is_missing(tmp_path):
    spec = {"check": "disk_read", "path": str(tmp_path), "size": 8 << 20, "run_timeout": 30}
    (fio,) = run(spec)
    (dd,) = run(dict(spec, tools={"fio": "/nonexistent/fio"}))
    assert fio["status"] == "ok" and fio["tool"] == "fio" and fio["value"] > 0
    assert dd["status"] == "ok" and dd["tool"] == "dd" and dd["value"] > 0
    assert list(tmp_path.iterdir()) == []  # the test file is removed


def test_disk_read_never_writes_through_a_planted_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / ".stune-active-read.77").symlink_to(target)
    (r,) = run({"check": "disk_read", "path": str(tmp_path), "size": 1 << 20}, SLURM_JOB_ID="77")
    assert r["status"] == "unknown" and "cannot create" in r["detail"] and target.read_text() == "keep"


def profile_with(tmp_path, active: str):
    repo = Path(__file__).parent.parent / "partitions"
    for f in repo.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "hdr.yaml").write_text((repo / "hdr.yaml").read_text() + active)
    return load_profile("hdr", tmp_path)


def test_profile_active_section_defaults_and_errors(tmp_path):
    p = profile_with(tmp_path, "active:\n  checks:\n    nccl_allreduce: {floor: 200, time_limit: 5m}\n")
    assert p.active.checks.nccl_allreduce.floor == 200.0 and p.active.checks.nccl_allreduce.time_limit == 300
    assert (p.active.k, p.active.n, p.active.drain) == (2, 3, False)
    (tmp_path / "x").mkdir()
    with pytest.raises(ConfigError, match=r"hdr.yaml:\d+: active.k: k \(4\) cannot exceed n \(3\)"):
        profile_with(tmp_path / "x", "active:\n  k: 4\n")
    (tmp_path / "y").mkdir()
    with pytest.raises(ConfigError, match=r"active\.checks"):
        profile_with(tmp_path / "y", "active:\n  checks:\n    nccl_allredcue: {}\n")
