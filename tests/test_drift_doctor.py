"""stune-admin doctor's tuning-drift table, without a cluster: from captures (`--facts DIR`) and from the
hardware-less mode's per-node trees, one row per setting with the nodes that differ and what they have."""

from __future__ import annotations

import json
from pathlib import Path

import drifttrees as dt
import healthkit as kit
from test_admin_doctor import node

from slurm_tune.admin import doctor
from slurm_tune.admin.install import Layout
from slurm_tune.health import collect
from slurm_tune.hw import snapshot


def captures(tmp: Path, drifts: dict[str, dict]) -> Path:
    """DIR/<node>.json as `stune-health capture -o` writes them, each node's tree drifted by drifttrees.host(**kw)."""
    facts = tmp / "facts"
    facts.mkdir()
    gpus = kit.gpu_file(tmp / "gpus.json")
    for name, kw in drifts.items():
        root = kit.tree(tmp / name, "hdr")
        if kw:
            dt.host(root, **kw)
        snap = collect.full(str(root), None, name, str(gpus), gids=True)
        collect.add_drift(snap, str(root), None, 5.0)
        snapshot.save(snap, str(facts / f"{name}.json"))
    return facts


def profiles():
    return {"hdr": kit.profile("hdr")}


def test_the_table_has_a_row_per_setting_with_the_nodes_that_differ(tmp_path):
    facts = captures(
        tmp_path,
        {
            "g1": {"gdr_module": False},
            "g2": {"governor": "powersave"},
            "g3": {"governor": "powersave", "memlock": ("65536", "65536")},
            "g4": {},
        },
    )
    (facts / "g4.json").write_text(
        json.dumps(
            {**json.loads((facts / "g4.json").read_text()), "drift": {"answered": False, "error": "x"}}
        )
    )
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), str(facts))
    nodes = [node(n, ["hdr"]) for n in ("g1", "g2", "g3", "g4", "g5")]
    doc.check_drift(profiles(), nodes)
    rows = {r["setting"]: r for r in doc.drift["hdr"]["rows"]}
    assert rows["gdr_module"]["differs"] == ["g1"] and rows["gdr_module"]["have"].startswith("g1: not loaded")
    assert rows["cpu_governor"]["differs"] == ["g2", "g3"]
    assert rows["cpu_governor"]["have"].startswith("g[2-3]: powersave")
    assert rows["slurmd_memlock"]["have"].startswith("g3: 64 KiB (hard 64 KiB)")
    assert rows["thp"]["differs"] == [] and rows["thp"]["have"] == "as expected on 3; ? on g4 (not read: x)"
    lines = [f.line() for f in doc.findings]
    assert any(
        line.startswith(
            "warning drift hdr: cpu_governor differs on 2 node(s): g[2-3]: powersave; expected performance"
        )
        and "-> on g2: cpupower frequency-set -g performance" in line
        for line in lines
    ), lines
    assert any(line.startswith("warning drift hdr: no host settings recorded for g5") for line in lines), (
        lines
    )
    table = doc.drift_tables()
    head, columns, *body = table.splitlines()
    assert head == "tuning drift, partition hdr (4 node(s) judged; - : none differs):"
    assert columns.split() == ["setting", "expected", "differs", "on", "have"]
    by_setting = {line.split()[0]: line for line in body}
    assert by_setting["gdr_module"].split("  ")[0] == "gdr_module"
    assert " g1 " in by_setting["gdr_module"] and " - " in by_setting["thp"]
    assert "g[2-3]" in by_setting["cpu_governor"]
    assert json.loads(doctor.as_json(doc))["drift"]["hdr"]["rows"][0]["setting"] == "gdr_module"


def test_a_partition_without_drift_says_so_in_one_ok(tmp_path):
    facts = captures(tmp_path, {"g1": {}, "g2": {}})
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), str(facts))
    doc.check_drift(profiles(), [node("g1", ["hdr"]), node("g2", ["hdr"])])
    assert [f.line() for f in doc.findings] == ["ok      drift hdr: no tuning drift on 2 node(s)"]


def test_hardware_less_nodes_are_read_from_their_trees_with_the_profiles_sysctls(tmp_path):
    profiles_dir = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("cache:\n", "drift:\n  sysctls: {kernel.pid_max: 4194304}\ncache:\n")]}
    )
    for name, pid_max in (("n1", "4194304"), ("n2", "32768")):
        root = kit.tree(tmp_path / "nodes" / name / "sysfs", "hdr")
        dt.put(root, "proc/sys/kernel/pid_max", pid_max)
        kit.gpu_file(tmp_path / "nodes" / name / "gpus.json")
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.env = {
        "STUNE_SYSFS_ROOT": f"{tmp_path}/nodes/%n/sysfs",
        "STUNE_GPU_SNAPSHOT": f"{tmp_path}/nodes/%n/gpus.json",
    }
    profile = kit.profile("hdr", profiles_dir)
    doc.drift_sysctls = list(profile.drift.sysctls)
    nodes = [node("n1", ["hdr"]), node("n2", ["hdr"])]
    doc.check_nodes(nodes)
    doc.check_drift({"hdr": profile}, nodes)
    row = {r["setting"]: r for r in doc.drift["hdr"]["rows"]}["sysctl kernel.pid_max"]
    assert (row["differs"], row["have"], row["fix"]) == (
        ["n2"],
        "n2: 32768",
        "on n2: sysctl -w kernel.pid_max=4194304",
    )
    assert doc.matrix["n1"]["driver"] == "535.104.05"  # the same reading serves the version matrix
