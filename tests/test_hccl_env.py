"""Communication settings of Ascend (HCCL) and AMD (RCCL) partitions, from the one rule table: what the dry run
plans and explains, what each node sets (HCCL_IF_IP, ASCEND_RT_VISIBLE_DEVICES from Slurm's answer, the rank
table from the nodes' published device maps), the user's values kept; and the rank table's format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import hwtrees
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sbatch_plan import plan_for, setting

from slurm_tune.hw.sysfs import Sysfs
from slurm_tune.nodeenv import ascendenv, ranktable
from slurm_tune.nodeenv.envrules import NODE_NAMES, RULES
from slurm_tune.nodeenv.taskenv import node_exports
from slurm_tune.profiles import load_profile
from slurm_tune.thisnode import job_context
from slurm_tune.usage.jobdir import RUN_DIR

GRES = Path(__file__).parent / "fixtures" / "slurm-gres"
CAPTURE = Path(
    "/work/shared/hardware-outputs/accel/hccn-tool-net-health-fault-and-ranktable-mindspore-doc.txt"
)
FIXTURE_TABLE = Path(__file__).parent / "fixtures" / "accel" / "ascend"


# ---- the dry run: the rows per vendor ---------------------------------------------------------------------
def test_an_ascend_partition_gets_hccls_variables_and_no_nccl_ones():
    plan, _ = plan_for(["-p", "ascend", "-N2"])
    assert not [name for name in plan.env if name.startswith("NCCL_")], plan.env
    assert plan.env["HCCL_SOCKET_IFNAME"] == "eth0" and plan.env["HCCL_CONNECT_TIMEOUT"] == "600"
    assert "HCCL_EXEC_TIMEOUT" not in plan.env and "HCCL_BUFFSIZE" not in plan.env  # HCCL's own defaults
    source = setting(plan, "HCCL_SOCKET_IFNAME").source
    assert (
        source.startswith("rule: hccl.socket_ifname, else fabric.socket_ifname @ ")
        and "ascend.yaml" in source
    )
    assert setting(plan, "HCCL_CONNECT_TIMEOUT").source.startswith("hccl.connect_timeout @ ")


def test_the_users_hccl_value_wins_at_submission():
    plan, _ = plan_for(["-p", "ascend"], environ={"HCCL_CONNECT_TIMEOUT": "1200"})
    timeout = setting(plan, "HCCL_CONNECT_TIMEOUT")
    assert not timeout.applied and "HCCL_CONNECT_TIMEOUT" not in plan.env
    assert (
        "kept your HCCL_CONNECT_TIMEOUT=1200 (your environment)" in timeout.note
        and "would set 600" in timeout.note
    )


def test_an_amd_partition_keeps_the_nccl_rows_for_rccl_and_adds_rocms():
    plan, _ = plan_for(["-p", "amd", "-N2"])
    assert plan.env["NCCL_IB_TIMEOUT"] == "22" and plan.env["NCCL_IB_TC"] == "106"
    assert plan.env["HSA_FORCE_FINE_GRAIN_PCIE"] == "1"  # amd.yaml expects GPUDirect RDMA (net_gdr_level SYS)
    assert setting(plan, "HSA_FORCE_FINE_GRAIN_PCIE").source.startswith(
        "rccl.fine_grain_pcie @ built-in default"
    )
    assert not [name for name in plan.env if name.startswith("HCCL_")]


def test_an_nvidia_partition_gets_no_hccl_or_rocm_variable():
    plan, _ = plan_for(["-p", "roce", "-N2"])
    assert not [n for n in plan.env if n.startswith(("HCCL_", "HSA_", "ASCEND_", "RANK_TABLE"))]


def test_every_new_row_applies_to_its_vendor_only():
    asc, amd, nv = (load_profile(name) for name in ("ascend", "amd", "roce"))
    names = {r.name: r for r in RULES}
    for name in (
        "HCCL_SOCKET_IFNAME",
        "HCCL_IF_IP",
        "ASCEND_RT_VISIBLE_DEVICES",
        "RANK_TABLE_FILE",
        "hccl.env",
    ):
        assert names[name].when(asc) and not names[name].when(amd) and not names[name].when(nv), name
    assert names["HSA_FORCE_FINE_GRAIN_PCIE"].when(amd) and not names["HSA_FORCE_FINE_GRAIN_PCIE"].when(nv)
    assert not names["NCCL_SOCKET_IFNAME"].when(asc) and names["NCCL_SOCKET_IFNAME"].when(amd)


# ---- the node side ---------------------------------------------------------------------------------------
class Adapter:
    """The one Slurm adapter's run_full, answering `scontrol show job -d` from a capture; counts the calls."""

    def __init__(self, text: str, rc: int = 0):
        self.text, self.rc, self.calls = text, rc, []

    def run_full(self, argv, timeout=None, env=None, input=None):
        self.calls.append(argv)
        return self.rc, self.text if self.rc == 0 else "", "" if self.rc == 0 else "slurm_load_jobs error"


def detail(name: str, release: str = "26.05.5") -> str:
    return (GRES / release / f"scontrol_show_job_d_{name}.txt").read_text()


@pytest.fixture
def node(tmp_path):
    """An Ascend node n2 of job 6 (2 nodes, n[2-3], one NPU each: the captures): its sysfs tree with eth0,
    its usage dir with the job's directory (the prolog makes it), the shared spool with n2's and n3's maps."""
    root = tmp_path / "root"
    hwtrees.netdev(root, "eth0")
    usage = tmp_path / "usage"
    (usage / RUN_DIR / "6").mkdir(parents=True)
    spool = tmp_path / "spool"
    for name, octet in (("n2", 2), ("n3", 3)):
        section = {"ports": {str(i): {"ip": f"192.168.{octet}.{10 + i}"} for i in range(4)}}
        assert ranktable.publish(str(spool), name, section, host_ip=f"10.0.0.{octet}")
    environ = {
        "SLURM_JOB_ID": "6",
        "SLURM_JOB_PARTITION": "ascend",
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_NODELIST": "n[2-3]",
        "SLURM_JOB_NUM_NODES": "2",
        "STUNE_USAGE_DIR": str(usage),
        "STUNE_USAGE_SPOOL": str(spool),
    }
    return {"root": root, "usage": usage, "spool": spool, "environ": environ}


def exports_for(node, adapter, **env):
    environ = dict(node["environ"], **env)
    job = job_context(environ, profile=load_profile("ascend"))
    return node_exports(job, Sysfs(str(node["root"])), address_of=lambda ifname: "10.0.0.2", slurm=adapter)


def test_an_ascend_task_gets_its_npus_hccl_if_ip_and_the_rank_table(node):
    adapter = Adapter(detail("N2_npu1"))
    out, messages = exports_for(node, adapter)
    assert out["HCCL_IF_IP"] == "10.0.0.2" and out["ASCEND_RT_VISIBLE_DEVICES"] == "0"
    assert not [n for n in out if n.startswith("NCCL_")] and messages == []
    assert set(out) <= set(NODE_NAMES)  # only the table's node rows
    table = json.loads(Path(out["RANK_TABLE_FILE"]).read_text())
    assert ranktable.problems(table) == []
    assert table["server_count"] == "2" and [s["server_id"] for s in table["server_list"]] == [
        "10.0.0.2",
        "10.0.0.3",
    ]
    assert table["server_list"][1]["device"] == [
        {"device_id": "0", "device_ip": "192.168.3.10", "rank_id": "1"}
    ]
    assert oct(os.stat(out["RANK_TABLE_FILE"]).st_mode & 0o777) == "0o600"
    # the job's next task on the node reads what the first one asked: Slurm is asked once per job and node
    again, _ = exports_for(node, adapter)
    assert again["RANK_TABLE_FILE"] == out["RANK_TABLE_FILE"] and len(adapter.calls) == 1


def test_the_users_visible_devices_and_rank_table_are_kept(node):
    adapter = Adapter(detail("N2_npu1"))
    mine = {"ASCEND_RT_VISIBLE_DEVICES": "3", "RANK_TABLE_FILE": "/home/u/rt.json", "HCCL_IF_IP": "10.9.9.9"}
    out, _ = exports_for(node, adapter, **mine)
    assert not set(mine) & set(out)


def test_a_node_that_published_nothing_gets_no_rank_table_and_is_named(node):
    (node["spool"] / ranktable.DEVICES_DIR / "n3.json").unlink()
    out, messages = exports_for(node, Adapter(detail("N2_npu1")))
    assert "RANK_TABLE_FILE" not in out and out["ASCEND_RT_VISIBLE_DEVICES"] == "0"
    assert messages == [
        f"RANK_TABLE_FILE not set: no device map published for n3 ({node['spool']}/devices/n3.json:"
        " the periodic health run writes it)"
    ]


def test_when_slurm_cannot_say_the_variables_are_left_unset_with_why(node):
    out, messages = exports_for(node, Adapter("", rc=1))
    assert "ASCEND_RT_VISIBLE_DEVICES" not in out and "RANK_TABLE_FILE" not in out
    assert messages[0] == "ASCEND_RT_VISIBLE_DEVICES not set: scontrol show job -d 6: slurm_load_jobs error"


def test_a_single_node_job_on_gres_gpu_asks_slurm_nothing(node):
    adapter = Adapter("")
    environ = dict(node["environ"], SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="n2", SLURM_JOB_GPUS="2,3")
    job = job_context(environ, profile=load_profile("ascend"))
    alloc = ascendenv.Allocation(job, "gpu", adapter)
    assert alloc.on("n2") == [2, 3] and adapter.calls == []


def test_every_captured_allocation_reads_per_node():
    for release in ("22.05.8", "26.05.5"):
        text = detail("N2_npu1", release)
        from slurm_tune.usage.spool import gres_ids_from_detail

        assert gres_ids_from_detail(text, "n2", "npu") == [0] and gres_ids_from_detail(text, "n3", "npu") == [
            0
        ]


# ---- the rank table -------------------------------------------------------------------------------------
def test_the_documented_rank_table_is_valid_and_build_makes_the_same_form():
    doc = CAPTURE.read_text() if CAPTURE.exists() else None
    if doc is not None:
        table = json.loads(doc[doc.index("{") :])
        assert ranktable.problems(table) == []
        ips = {
            s["server_id"]: {int(d["device_id"]): d["device_ip"] for d in s["device"]}
            for s in table["server_list"]
        }
        built = ranktable.build([(sid, sorted(devs), devs) for sid, devs in ips.items()])
        assert built == table


def test_broken_tables_say_what_is_wrong():
    good = ranktable.build([("n1", [0, 1], {0: "192.168.1.10", 1: "192.168.1.11"})])
    assert ranktable.problems(good) == []
    bad = json.loads(json.dumps(good))
    bad["server_list"][0]["device"][1]["rank_id"] = "0"
    bad["server_list"][0]["device"][0]["device_ip"] = "192.168.1.300"
    bad["server_count"] = "3"
    found = ranktable.problems(bad)
    assert any("server_count" in p for p in found) and any("not IPv4" in p for p in found)
    assert any("rank_ids" in p for p in found)
    with pytest.raises(ValueError, match="n1: npu2 has no published address"):
        ranktable.build([("n1", [2], {0: "192.168.1.10"})])


def test_a_map_someone_else_wrote_is_not_read(node, tmp_path):
    path = node["spool"] / ranktable.DEVICES_DIR / "n3.json"
    os.chown(path, 65534, 65534)
    published, why = ranktable.read_published(str(node["spool"]), "n3")
    assert published is None and why.startswith("no device map published for n3")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_published_never_raises_and_never_gives_a_map_with_bad_addresses(tmp_path_factory, data):
    spool = tmp_path_factory.mktemp("spool")
    (spool / ranktable.DEVICES_DIR).mkdir()
    (spool / ranktable.DEVICES_DIR / "n1.json").write_bytes(data)
    published, why = ranktable.read_published(str(spool), "n1")
    if published is None:
        assert why
    else:
        assert all(ranktable.ipv4(ip) for ip in published.devices.values())


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=20,
    )
)
def test_garbage_ports_give_only_real_addresses(ports):
    for device, ip in ranktable.device_map({"ports": ports}).items():
        assert 0 <= device <= 999 and ranktable.ipv4(ip)


def test_publish_writes_only_when_the_map_changes(tmp_path):
    section = {"ports": {"0": {"ip": "192.168.1.10"}, "1": {"ip": None}}}
    assert ranktable.publish(str(tmp_path), "n1", section)
    assert not ranktable.publish(str(tmp_path), "n1", section)  # unchanged: nothing written
    assert not ranktable.publish(str(tmp_path), "n1", {"ports": {}})  # nothing known: nothing written
    published, _ = ranktable.read_published(str(tmp_path), "n1")
    assert published.devices == {0: "192.168.1.10"} and published.server_id == "n1"
    assert not ranktable.publish(str(tmp_path), "../etc", section)
