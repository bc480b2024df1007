"""What an admin and Prometheus see of the incidents: `stune-health incidents` (text and --json), `clear
--xid`, `xids -p`, and the Prometheus textfile's incidents per node and code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import incidentkit as ik
from prometheus_client.parser import text_string_to_metric_families

BIN = Path(sys.executable).parent


def health(*args, env):
    proc = subprocess.run(
        [str(BIN / "stune-health"), *args], capture_output=True, text=True, env=dict(os.environ, **env)
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def samples(prom: Path) -> dict:
    out = {}
    for family in text_string_to_metric_families(prom.read_text()):
        for s in family.samples:
            out[(s.name, s.labels.get("xid") or s.labels.get("probe"))] = s.value
    return out


def test_incidents_and_their_metrics_per_node_and_code(tmp_path, monkeypatch):
    world = ik.World(tmp_path, monkeypatch)
    prom = tmp_path / "health.prom"
    monkeypatch.setenv("STUNE_HEALTH_PROM", str(prom))
    world.run()
    world.xid(13, 40, text="Graphics Exception: ESR 0x404000=0x80000002")
    world.xid(79, 3)
    code, doc = world.run()
    assert (
        code == 0
        and doc["status"] == "fail"
        and doc["incidents"] == {"by_code": {"13": 40, "79": 3}, "held": {"79": 3}}
    )
    got = samples(prom)
    assert (
        got[("stune_health_xid_events_total", "13")] == 40
        and got[("stune_health_xid_events_total", "79")] == 3
    )
    assert got[("stune_health_xid_held", "79")] == 3 and ("stune_health_xid_held", "13") not in got
    env = {**world.env, "STUNE_HEALTH_PROM": str(prom)}
    proc = health("incidents", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "n1 (hdr): 2 incidents kept, 3 Xid events held"
    assert lines[1].split() == ["WHEN", "XID", "GPU", "EVENTS", "LEVEL", "HELD", "WHY", "/", "LINE"]
    row13 = next(line for line in lines if "  13  " in line)
    assert "gpu2 0000:47:00" in row13 and "  40  " in row13 and " count " in row13 and "NVRM: Xid" in row13
    row79 = next(line for line in lines if "  79  " in line)
    assert " drain " in row79 and " held " in row79
    assert "events per code since the state began: Xid 13: 40, Xid 79: 3" in proc.stdout
    doc = json.loads(health("incidents", "--json", env=env).stdout)
    assert [(i["xid"], i["count"], i["level"]) for i in doc["incidents"]] == [
        (13, 40, "count"),
        (79, 3, "drain"),
    ]
    assert doc["held"] == {"79": 3} and doc["by_code"] == {"13": 40, "79": 3}
    assert health("clear", "--xid", env=env).returncode == 0
    after = json.loads(health("incidents", "--json", env=env).stdout)
    assert after["held"] == {} and after["incidents"][1]["released"]["by"] == "clear"
    assert "released (clear " in health("incidents", env=env).stdout
    _code, doc = world.run()
    assert doc["status"] == "ok" and samples(prom).get(("stune_health_xid_held", "79")) is None
    assert samples(prom)[("stune_health_xid_events_total", "79")] == 3  # a counter: it never goes down


def test_the_prolog_writes_the_same_incident_lines(tmp_path, monkeypatch):
    from slurm_tune.health import node as health_node

    world = ik.World(tmp_path, monkeypatch)
    prom = tmp_path / "health.prom"
    monkeypatch.setenv("STUNE_HEALTH_PROM", str(prom))
    world.run()
    world.xid(48)
    world.run()
    _code, doc = health_node.hook("prolog", health_node.settings({}))
    assert doc["status"] == "fail" and doc["reason"].endswith("Xid 48")
    assert samples(prom)[("stune_health_xid_held", "48")] == 1


def test_xids_prints_a_partitions_rules(tmp_path, monkeypatch):
    world = ik.World(tmp_path, monkeypatch, health_yaml='  xid:\n    codes:\n      "92": {burst: 5}\n')
    proc = health("xids", "-p", "hdr", env=world.env)
    assert proc.returncode == 0
    assert "  92  degrade  5/1h   reset   high single-bit ECC error rate [profile]" in proc.stdout
    assert "  94  degrade  3/1h   reset   contained ECC error" in proc.stdout
    bad = health("xids", "-p", "nosuch", env=world.env)
    assert bad.returncode == 1 and "no profile for partition 'nosuch'" in bad.stderr
    helped = health("incidents", "--help", env=world.env)
    assert helped.returncode == 0 and "remediation ladder's steps" in helped.stdout
