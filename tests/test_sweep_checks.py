"""`stune-sweep checks`: the catalogue, a partition's own checks, --json, and a partition that runs none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_active_cli import REPO, sweep_cli


def with_active(tmp_path: Path, active: str) -> Path:
    directory = tmp_path / "partitions"
    shutil.copytree(REPO / "partitions", directory)
    with open(directory / "vpc.yaml", "a", encoding="utf-8") as fh:
        fh.write(active)
    return directory


def test_a_partition_without_active_checks_says_so():
    out = sweep_cli("checks", "-p", "hdr", env={"STUNE_PARTITIONS": str(REPO / "partitions")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("partition hdr runs no active checks: its profile has no active.checks")
    assert out.stdout.count("\n") == 1


def test_checks_json_lists_the_partitions_checks_and_where_their_tools_are(tmp_path):
    tool = tmp_path / "iperf3"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    directory = with_active(
        tmp_path,
        "active:\n  checks:\n    iperf3: {time_limit: 2m}\n"
        "    nccl_allreduce: {command: 'all_reduce_perf -g {gpus} -b 8G'}\n"
        f"  tools:\n    iperf3: {tool}\n    all_reduce_perf: /nonexistent/arp\n",
    )
    out = sweep_cli("checks", "-p", "vpc", "--json", env={"STUNE_PARTITIONS": str(directory)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["partition"] == "vpc"
    by_name = {c["name"]: c for c in doc["checks"]}
    assert sorted(by_name) == ["iperf3", "nccl_allreduce"]
    assert by_name["iperf3"]["tool_path"] == str(tool) and by_name["iperf3"]["time_limit_s"] == 120
    arp = by_name["nccl_allreduce"]
    assert arp["command"] == "all_reduce_perf -g {gpus} -b 8G" and arp["tool_path"] is None
    assert "active.tools.all_reduce_perf is /nonexistent/arp" in arp["problem"]
    text = sweep_cli("checks", "-p", "vpc", env={"STUNE_PARTITIONS": str(directory)}).stdout
    assert f"tool here: {tool}" in text and "tool here: not available (active.tools.all_reduce_perf" in text
    everything = json.loads(sweep_cli("checks", "--json", env={"PATH": "/nonexistent"}).stdout)
    assert everything["partition"] is None and len(everything["checks"]) == 10  # with hccl and rccl


def test_a_misspelt_option_gets_the_subcommands_usage_and_the_right_spelling():
    out = sweep_cli("checks", "--jsn")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: stune-sweep checks")
    assert out.stderr.rstrip().endswith("unrecognized arguments: --jsn (did you mean --json?)")
