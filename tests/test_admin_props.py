"""Byte-level fuzzing of the admin tooling's parsers: garbage gives a clear error or a '?', never a crash.

slurm.conf and the env file are root's files, but doctor reads whatever is there (a half-written file, a
binary dropped by mistake); ibnetdiscover dumps and node name maps come from other machines."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.admin import doctor, doctor_nodes
from slurm_tune.admin.slurmconf import SlurmConf, gpu_partitions, partition_needs, requirements, seconds
from slurm_tune.admin.topology import build_topology, parse_ibnetdiscover, parse_node_name_map
from slurm_tune.errors import ConfigError

PATHS = {
    "prolog_dir": "/etc/slurm/prolog.d",
    "epilog_dir": "/etc/slurm/epilog.d",
    "health_run": "/etc/slurm/stune-health-run",
    "task_prolog": "/etc/slurm/stune-task-prolog",
    "epilog_slurmctld": "/etc/slurm/stune-usage-slurmctld",
}
SLURM_WORDS = [
    "PrologFlags=",
    "Prolog=",
    "HealthCheckInterval=",
    "PriorityCalcPeriod=",
    "NodeName=",
    "Gres=gpu:",
    "PartitionName=",
    "Nodes=",
    "TRESBillingWeights=",
    "Include ",
    "#",
    "\n",
    "=",
    ",",
    "[",
    "]",
    "-",
    "*",
    '"',
    "ALL",
    "1-0",
    "00:05:00",
    "99999999999999999999",
]
GARBAGE = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(SLURM_WORDS) | st.text(max_size=6), max_size=40)
    .map("".join)
    .map(lambda t: t.encode("utf-8", "surrogatepass")),
)
FILE_SETTINGS = settings(
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FILE_SETTINGS
@given(GARBAGE)
def test_slurm_conf_garbage_never_crashes_the_checks(tmp_path, data):
    conf = tmp_path / "slurm.conf"
    conf.write_bytes(data)
    parsed = SlurmConf(str(conf))
    needs = requirements(parsed, PATHS) + partition_needs(parsed, gpu_partitions(parsed))
    assert all(isinstance(n.ok, bool) and n.line for n in needs)


@FILE_SETTINGS
@given(GARBAGE)
def test_env_file_garbage_reads_as_some_settings(tmp_path, data):
    env = tmp_path / "stune"
    env.write_bytes(data)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in doctor.read_env_file(str(env)).items())


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=30))
def test_durations_are_a_number_or_none(text):
    value = seconds(text)
    assert value is None or value >= 0 or text.strip().startswith("-")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "gpus",
                    "ib",
                    "devices",
                    "name",
                    "driver_version",
                    "fw_ver",
                    "hca_type",
                    "answered",
                    "kernel",
                    "release",
                    "cuda_driver_version",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=1500, deadline=None)
@given(JSON)
def test_facts_from_any_json_are_strings(snap):
    if isinstance(snap, dict):
        facts = doctor_nodes.facts_from_snapshot(snap)
        assert set(facts) == {*doctor_nodes.FACT_KEYS, *doctor_nodes.ACCEL_FACT_KEYS} and all(
            isinstance(v, str) and v for v in facts.values()
        )


IB_WORDS = [
    'Switch\t36 "S-0002c902004b0818"\t\t# "MF0;sw1:X/U1" base port 0 lid 2 lmc 0\n',
    'Ca\t2 "H-0002c9030009e4f0"\t\t# "cn101 HCA-1"\n',
    '[1]\t"H-0002c9030009e4f0"[1](2c9030009e4f1) \t\t# "cn101 HCA-1" lid 11 4xQDR\n',
    '[1](2c9030009e4f1) \t"S-0002c902004b0818"[1]\t\t# lid 11 lmc 0 "sw1" lid 2 4xQDR\n',
    "Non-Chassis Nodes\n",
    "Chassis 1 (guid 0x2c902004b0818)\n",
    "ibwarn: [1] mad_rpc: failed\n",
    "src/query_smp.c:199; umad bad status 110\n",
    "vendid=0x2c9\n",
    "[ext 3]",
    "\n",
    '"',
    "#",
]


@settings(max_examples=1500, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")),
        st.lists(st.sampled_from(IB_WORDS) | st.text(max_size=5), max_size=30).map("".join),
    )
)
def test_ibnetdiscover_garbage_is_a_config_error_or_a_fabric(text):
    try:
        fabric = parse_ibnetdiscover(text, "dump")
    except ConfigError as exc:
        assert str(exc).startswith("dump")
        return
    build_topology(fabric)


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")))
def test_node_name_map_garbage_is_a_config_error_or_a_map(text):
    try:
        names = parse_node_name_map(text, "map")
    except ConfigError as exc:
        assert str(exc).startswith("map:")
        return
    assert all(isinstance(k, int) for k in names)


def test_a_garbled_capture_in_facts_dir_is_a_missing_fact(tmp_path):
    from slurm_tune.admin.install import Layout

    (tmp_path / "n1.json").write_bytes(b"\xff\xfe{not json")
    (tmp_path / "n2.json").write_text(json.dumps([1, 2]))
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), str(tmp_path))
    assert doc.node_facts("n1") is None and doc.node_facts("n2") is None


def test_include_with_a_nul_byte_is_a_problem_not_a_crash(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_bytes(b"ClusterName=x\nInclude /etc/slurm/a\x00b.conf\n")
    parsed = SlurmConf(str(conf))
    assert parsed.get("ClusterName") == "x"
    assert any("NUL byte" in p for p in parsed.problems)
