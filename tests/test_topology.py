"""`stune-admin topology`: ibnetdiscover output (real format, tests/fixtures/ibnetdiscover/) -> topology.conf."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.admin.topology import (
    Device,
    build_topology,
    host_name,
    parse_ibnetdiscover,
    render,
    switch_name,
)
from slurm_tune.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "ibnetdiscover"
ADMIN = os.path.join(os.path.dirname(sys.executable), "stune-admin")


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def load(name: str):
    path = FIXTURES / name
    return parse_ibnetdiscover(path.read_text(), str(path))


def test_fat_tree_leaves_and_spines():
    fabric = load("hdr-fat-tree.txt")
    assert sum(d.kind == "switch" for d in fabric.devices.values()) == 5
    assert sum(d.kind == "ca" for d in fabric.devices.values()) == 9
    topo = build_topology(fabric)
    assert conf_lines(render(topo, "x")) == [
        "SwitchName=leaf01 Nodes=node[01-02]",
        "SwitchName=leaf02 Nodes=node[03-04]",
        "SwitchName=spine01 Switches=leaf[01-02]",
        "SwitchName=spine02 Switches=leaf[01-02]",
    ]
    # node01's storage HCA (mlx5_8) is cabled to the storage leaf: the node stays on its rail-0 leaf
    assert topo.multi_leaf == {"node01": ["leaf01", "stor01"]}
    assert "# node01 reaches leaves leaf01,stor01" in render(topo, "x")


def test_all_rails_lists_a_node_under_every_leaf_and_the_storage_leaf_joins_the_spines():
    lines = conf_lines(render(build_topology(load("hdr-fat-tree.txt"), all_rails=True), "x"))
    assert "SwitchName=stor01 Nodes=node01" in lines
    assert "SwitchName=spine01 Switches=leaf[01-02],stor01" in lines


def test_choosing_the_rail_by_hca_name_and_filtering_nodes():
    topo = build_topology(load("hdr-fat-tree.txt"), hca="mlx5_8")
    assert topo.leaves == {"stor01": ["node01"]}
    assert "skipped node02: no HCA described as 'mlx5_8'" in topo.notes
    topo = build_topology(load("hdr-fat-tree.txt"), keep=lambda n: n in ("node03", "node04"))
    assert conf_lines(render(topo, "x")) == [
        "SwitchName=leaf02 Nodes=node[03-04]",
        "SwitchName=spine01 Switches=leaf02",
        "SwitchName=spine02 Switches=leaf02",
    ]


def test_two_switches_cabled_directly_get_a_virtual_root_and_unnamed_hcas_are_skipped():
    topo = build_topology(load("qdr-two-switches.txt"))
    text = render(topo, "x")
    assert conf_lines(text) == [
        "SwitchName=ib-sw2 Nodes=cn201",
        "SwitchName=ibsw_2c902004b0818 Nodes=cn[101-103]",
        "SwitchName=fabric Switches=ib-sw2,ibsw_2c902004b0818",
    ]
    assert "MT26428 ConnectX VPI Mellanox Technologies' names no host" in text
    assert "fabric is a virtual root" in text


def test_names():
    assert host_name("node01 mlx5_0") == "node01" and host_name("gpu-a17 HCA-1") == "gpu-a17"
    assert host_name("MT4123 ConnectX6   Mellanox Technologies") is None and host_name("") is None
    assert switch_name(Device("S-0c42a10300aa2001", "switch", "MF0;leaf01:MQM8700/U1")) == "leaf01"
    assert switch_name(Device("S-0002c902004b0818", "switch", "ISR9024D Voltaire")) == "ibsw_2c902004b0818"
    assert switch_name(Device("S-0002c902004b0818", "switch", "core-a")) == "core-a"


def test_bad_input_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text('Switch\t36 "S-0002c902004b0818"\t\t# "sw" base port 0 lid 2 lmc 0\n[1]\tgarbage here\n')
    with pytest.raises(ConfigError) as err:
        parse_ibnetdiscover(bad.read_text(), str(bad))
    assert str(err.value) == f"{bad}:2: not ibnetdiscover output: '[1]\\tgarbage here'"
    with pytest.raises(ConfigError, match="port line before any Switch or Ca header"):
        parse_ibnetdiscover('[1]\t"H-0002c9030009e4f0"[1](2c9030009e4f1)\n', "x")
    with pytest.raises(ConfigError, match="no switch found"):
        parse_ibnetdiscover("# just a comment\n", "x")


def test_cli_reads_a_file_or_stdin_and_writes_a_file(tmp_path):
    fixture = FIXTURES / "hdr-fat-tree.txt"
    out = subprocess.run([ADMIN, "topology", str(fixture)], capture_output=True, text=True)
    assert out.returncode == 0 and "SwitchName=leaf01 Nodes=node[01-02]" in out.stdout
    target = tmp_path / "topology.conf"
    out = subprocess.run(
        [ADMIN, "topology", "-", "-o", str(target), "--match", "node0[34]"],
        input=fixture.read_text(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "wrote" in out.stderr
    assert conf_lines(target.read_text())[0] == "SwitchName=leaf02 Nodes=node[03-04]"
    out = subprocess.run(
        [ADMIN, "topology", str(fixture), "--match", "nothing*"], capture_output=True, text=True
    )
    assert (
        out.returncode == 1 and "no node found on any switch" in out.stderr and "Traceback" not in out.stderr
    )


def test_grouped_output_with_warning_lines_is_read_and_the_warnings_counted():
    """`ibnetdiscover -g` (Chassis N / Non-Chassis Nodes headers, [ext N] ports) with ibwarn and
    src/query_smp.c lines a saved dump caught from stderr."""
    grouped = load("qdr-grouped-with-warnings.txt")
    plain = load("qdr-two-switches.txt")
    assert grouped.warnings == 3 and plain.warnings == 0
    assert grouped.devices == plain.devices and grouped.links == plain.links
    text = render(build_topology(grouped), "g.txt")
    assert conf_lines(text) == conf_lines(render(build_topology(plain), "p.txt"))
    assert "# skipped 3 ibnetdiscover warning line(s)" in text


def test_warning_lines_alone_say_the_discovery_failed():
    dump = (
        "ibwarn: [298726] mad_rpc_open_port: client_register for mgmt 1 failed\n"
        "/build/rdma-core/libibnetdisc/ibnetdisc.c:802; can't open MAD port ((null):0)\n"
        "ibnetdiscover: iberror: failed: discover failed\n"
    )
    with pytest.raises(ConfigError, match=r"no switch found.*3 ibnetdiscover warning line\(s\)"):
        parse_ibnetdiscover(dump, "dump.txt")


def test_default_descriptions_explain_the_empty_result_and_a_node_name_map_fixes_it(tmp_path):
    fixture = FIXTURES / "qdr-default-descriptions.txt"
    out = subprocess.run([ADMIN, "topology", str(fixture)], capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "all 5 HCA(s) keep a description that names no host" in out.stderr
    assert "--node-name-map" in out.stderr and "node_desc" in out.stderr
    out = subprocess.run(
        [ADMIN, "topology", str(fixture), "--node-name-map", str(FIXTURES / "qdr-node-name-map.txt")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert conf_lines(out.stdout) == [
        "SwitchName=ib-sw1 Nodes=cn[101-103]",
        "SwitchName=ib-sw2 Nodes=cn[201-202]",
        "SwitchName=fabric Switches=ib-sw[1-2]",
    ]


def test_a_bad_node_name_map_line_is_named(tmp_path):
    bad = tmp_path / "map"
    bad.write_text('0x0002c9030009e4f0 "cn101"\nnot a map line\n')
    out = subprocess.run(
        [ADMIN, "topology", str(FIXTURES / "qdr-two-switches.txt"), "--node-name-map", str(bad)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and f"{bad}:2:" in out.stderr and "Traceback" not in out.stderr
