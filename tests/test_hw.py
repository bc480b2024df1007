"""The hardware layer: sysfs reads under a relocatable root, NVML through pynvml, deadlines, snapshots."""

from __future__ import annotations

import json
import math
import os
import time

import fakenvml
import hwtrees
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw import snapshot, sysfs
from slurm_tune.hw.deadline import run_probe
from slurm_tune.hw.nvml import SnapshotGpuSource, open_gpu_source, read_gpus
from slurm_tune.hw.sysfs import Sysfs


def test_reads_a_dgx_a100_ib_tree_in_raw_form(tmp_path):
    hwtrees.dgx_a100_ib(tmp_path)
    fs = Sysfs(str(tmp_path))
    assert fs.ib_devices() == [f"mlx5_{i}" for i in range(9)]
    dev = fs.ib_device("mlx5_0")
    assert (
        dev["fw_ver"] == "20.31.1014" and dev["board_id"] == "MT_0000000223" and dev["hca_type"] == "MT4123"
    )
    assert dev["pci"] == "0000:0c:00.0" and dev["netdevs"] == ["ib0"]
    port = dev["ports"]["1"]
    assert (port["state"], port["phys_state"], port["rate"], port["link_layer"]) == (
        "4: ACTIVE",
        "5: LinkUp",
        "200 Gb/sec (4X HDR)",
        "InfiniBand",
    )
    assert port["counters"]["symbol_error"] == "0" and port["counters"]["port_xmit_data"] == "81920512"
    assert fs.nvidia_gpus() == hwtrees.DGX_GPU_PCI
    gpu = fs.pci_device("0000:47:00.0")
    assert (
        gpu["numa_node"] == "0" and gpu["local_cpulist"] == "0-31,64-95" and gpu["current_link_width"] == "16"
    )
    assert fs.numa_nodes() == [0, 1] and fs.numa_cpulist(1) == "32-63,96-127"


def test_a_relocated_root_never_reads_the_real_sys(tmp_path):
    fs = Sysfs(str(tmp_path))  # empty tree: nothing leaks in from this machine's /sys
    assert fs.ib_devices() == [] and fs.nvidia_gpus() == [] and fs.netdevs() == []
    assert fs.ib_port("mlx5_0", 1) == {"present": False}


def test_roce_gid_table_keeps_index_type_and_netdev(tmp_path):
    hwtrees.h100_roce(tmp_path)
    table = Sysfs(str(tmp_path)).gid_table("mlx5_0", 1)
    assert [(g["index"], g["type"], g["ndev"]) for g in table] == [
        (0, "IB/RoCE v1", "eth1"),
        (1, "RoCE v2", "eth1"),
        (2, "IB/RoCE v1", "eth1"),
        (3, "RoCE v2", "eth1"),
    ]
    assert table[3]["gid"] == "0000:0000:0000:0000:0000:ffff:0a00:0005"
    assert sysfs.gid_ipv4(sysfs.parse_gid(table[3]["gid"])) == "10.0.0.5"
    assert sysfs.gid_is_link_local(sysfs.parse_gid(table[1]["gid"]))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("3: Disabled", (3, "Disabled")),
        ("2: INIT", (2, "INIT")),
        ("7: Phy Test", (7, "Phy Test")),
        ("7: Phy  Test", None),
        ("ACTIVE", None),
        (": x", None),
        ("", None),
        ("4:", None),
    ],
)
def test_parse_port_state(text, expected):
    assert sysfs.parse_port_state(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("200 Gb/sec (4X HDR)", 200.0),
        ("100 Gb/sec (2X HDR)", 100.0),
        ("400 Gb/sec (4X NDR)", 400.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("fast", None),
        ("200 Mb/sec", None),
        ("nan Gb/sec", None),
        ("-5 Gb/sec", None),
        ("", None),
    ],
)
def test_parse_rate(text, expected):
    assert sysfs.parse_rate_gbps(text) == expected


def test_netdev_up_rules(tmp_path):
    hwtrees.netdev(tmp_path, "eth0")
    hwtrees.netdev(tmp_path, "eth1", operstate="down", flags="0x1002", carrier="0")
    hwtrees.netdev(tmp_path, "tun0", operstate="unknown", flags="0x1091")
    fs = Sysfs(str(tmp_path))
    assert sysfs.netdev_is_up(fs.netdev("eth0"))
    assert not sysfs.netdev_is_up(fs.netdev("eth1"))
    assert sysfs.netdev_is_up(fs.netdev("tun0"))  # virtual NICs report unknown with IFF_UP
    assert not sysfs.netdev_is_up(fs.netdev("eth9"))


PARSERS = [
    sysfs.parse_port_state,
    sysfs.parse_rate_gbps,
    sysfs.parse_counter,
    sysfs.parse_gid,
    sysfs.parse_cpulist,
    sysfs.parse_int,
    sysfs.pci_address,
]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=60),
        st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
        st.none(),
        st.integers(),
        st.floats(),
        st.lists(st.integers(), max_size=3),
    )
)
def test_parsers_never_raise_on_garbage(value):
    """Garbage is None (unknown) or a value of the parser's type and range, never an exception."""
    results = {parse.__name__: parse(value) for parse in PARSERS}
    if not isinstance(value, str):
        assert results == dict.fromkeys(results)
        return
    state = results["parse_port_state"]
    if state is not None:
        num, name = state
        assert isinstance(num, int) and num >= 0 and isinstance(name, str)
        assert sysfs.parse_port_state(f"{num}: {name}") == state  # what it read is a state it reads back
    rate = results["parse_rate_gbps"]
    assert rate is None or (isinstance(rate, float) and math.isfinite(rate) and rate >= 0)
    counter = results["parse_counter"]
    assert counter is None or (
        type(counter) is int and 0 <= counter <= sysfs.COUNTER_MAX and counter == int(value.strip())
    )
    gid = results["parse_gid"]
    assert gid is None or (type(gid) is int and 0 <= gid < 1 << 128)
    cpus = results["parse_cpulist"]
    assert cpus is None or (isinstance(cpus, frozenset) and all(type(c) is int and c >= 0 for c in cpus))
    number = results["parse_int"]
    assert number is None or type(number) is int
    pci = results["pci_address"]
    if pci is not None:
        domain, _, rest = pci.partition(":")
        assert pci == pci.lower() and len(domain) >= 4 and int(domain, 16) >= 0
        assert rest == value.strip().lower().partition(":")[2]


@pytest.mark.parametrize(
    "parse, text, want",
    [
        (sysfs.parse_port_state, "4: ACTIVE", (4, "ACTIVE")),
        (sysfs.parse_port_state, "4 ACTIVE", None),
        (sysfs.parse_rate_gbps, "200 Gb/sec (4X HDR)", 200.0),
        (sysfs.parse_rate_gbps, "-5 Gb/sec", None),
        (sysfs.parse_counter, "81920512\n", 81920512),
        (sysfs.parse_counter, "9" * 21, None),
        (sysfs.parse_gid, "fe80:0000:0000:0000:0000:0000:0000:0001", (0xFE80 << 112) | 1),
        (sysfs.parse_gid, "fe80::1::2", None),
        (sysfs.parse_cpulist, "0-3,8", frozenset({0, 1, 2, 3, 8})),
        (sysfs.parse_cpulist, "3-1", None),
        (sysfs.parse_int, "0x1003", 0x1003),
        (sysfs.parse_int, "-1", -1),
        (sysfs.parse_int, "1" * 5000, None),
        (sysfs.pci_address, "00000000:07:00.0", "0000:07:00.0"),
        (sysfs.pci_address, "07:00", None),
    ],
)
def test_parsers_read_the_real_forms_and_refuse_near_misses(parse, text, want):
    assert parse(text) == want


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "state",
                "phys_state",
                "rate",
                "link_layer",
                "counters/symbol_error",
                "fw_ver",
                "board_id",
                "gids/0",
                "gid_attrs/types/0",
            ]
        ),
        st.binary(max_size=40),
        min_size=1,
    )
)
def test_reading_garbage_files_never_raises(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("garbage")
    hwtrees.hca(root, "mlx5_0", pci="0000:0c:00.0")
    for rel, content in files.items():
        target = (
            root / "sys/class/infiniband/mlx5_0" / ("" if rel in ("fw_ver", "board_id") else "ports/1") / rel
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    dev = Sysfs(str(root)).ib_device("mlx5_0", gids=True)
    assert dev["ports"]["1"]["present"]


def test_a_probe_that_hangs_does_not_answer_within_its_deadline():
    start = time.monotonic()
    result = run_probe("sleepy", lambda partial: time.sleep(30), 0.3)
    assert result.status == "timeout" and not result.answered
    assert result.message == "sleepy did not answer within 0.3s"
    assert time.monotonic() - start < 2


def test_a_probe_that_raises_is_an_error_result_not_an_exception():
    result = run_probe("buggy", lambda partial: 1 / 0, 1)
    assert result.status == "error" and "ZeroDivisionError" in result.message


def test_nvml_reads_an_8_gpu_h100_node():
    fake = fakenvml.FakeNvml([fakenvml.device(i, "h100") for i in range(8)], driver="535.129.03")
    gpus = read_gpus(2, fake)
    assert gpus["answered"] and gpus["count"] == 8
    assert (gpus["driver_version"], gpus["cuda_driver_version"]) == ("535.129.03", "12.2")
    dev = gpus["devices"][3]
    assert dev["name"] == "NVIDIA H100 80GB HBM3" and dev["pci_bus_id"] == "00000000:4E:00.0"
    assert dev["pcie"] == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}
    assert len(dev["nvlinks"]) == 18 and all(link["active"] for link in dev["nvlinks"])
    assert dev["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert dev["power_w"] == pytest.approx(61.23) and dev["errors"] == {}
    assert not fake.initialised  # the session was shut down


def test_nvml_faults_are_read_as_reported():
    devices = [fakenvml.device(0, remapped=(0, 2, 1, 0), nvlink_down=[3], pcie_width=8, ecc_uncorrected=4)]
    dev = read_gpus(2, fakenvml.FakeNvml(devices))["devices"][0]
    assert dev["remapped_rows"]["pending"] and dev["remapped_rows"]["uncorrectable"] == 2
    assert [link["link"] for link in dev["nvlinks"] if not link["active"]] == [3]
    assert dev["pcie"]["width"] == 8 and dev["ecc_uncorrected_volatile"] == 4


def test_a_hung_gpu_yields_did_not_answer_and_keeps_what_was_read():
    fake = fakenvml.FakeNvml([fakenvml.device(i) for i in range(4)], hang_on_index=2)
    start = time.monotonic()
    gpus = read_gpus(0.5, fake)
    assert time.monotonic() - start < 2
    assert not gpus["answered"] and "did not answer within 0.5s" in gpus["error"]
    assert [d["index"] for d in gpus["devices"]] == [0, 1] and gpus["stalled_at"] == 2


def test_a_lost_gpu_is_recorded_per_field():
    dev = read_gpus(2, fakenvml.FakeNvml([fakenvml.device(0)], lost_index=0))["devices"][0]
    assert dev["name"] is None and dev["errors"]["name"] == "GPU is lost"


def test_no_driver_is_a_clear_message():
    gpus = read_gpus(2, fakenvml.FakeNvml([], fail_init=True))
    assert not gpus["answered"] and "libnvidia-ml.so not found" in gpus["error"]


def test_capture_save_load_roundtrip(tmp_path):
    root = hwtrees.dgx_a100_ib(tmp_path / "node")
    hwtrees.kmsg(
        root,
        [
            "6,1201,350123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05",
            "4,1288,9912345678,-;NVRM: Xid (PCI:0000:47:00): 79, pid=2231, name=python, "
            "GPU has fallen off the bus.",
        ],
    )
    fake = fakenvml.FakeNvml([fakenvml.device(i) for i in range(8)])
    snap = snapshot.capture(str(root), nvml_module=fake, node="n17")
    assert snap["format"] == snapshot.FORMAT and snap["node"] == "n17"
    assert snap["ib"]["answered"] and set(snap["ib"]["devices"]) == {f"mlx5_{i}" for i in range(9)}
    assert snap["ib"]["devices"]["mlx5_0"]["ports"]["1"]["gids"][0]["type"] == "IB/RoCE v1"
    assert snap["pci_gpus"]["devices"]["0000:07:00.0"]["numa_node"] == "0"
    assert snap["net"]["devices"]["ib0"]["type"] == "32"
    assert snap["gpus"]["answered"] and len(snap["gpus"]["devices"]) == 8
    assert snap["kernel"]["events"]["xid"] == [
        {
            "seq": 1288,
            "usec": 9912345678,
            "pci": "0000:47:00",
            "xid": 79,
            "text": "NVRM: Xid (PCI:0000:47:00): 79, pid=2231, name=python, GPU has fallen off the bus.",
        }
    ]
    path = tmp_path / "n17.json"
    snapshot.save(snap, str(path))
    assert snapshot.load(str(path)) == json.loads(json.dumps(snap))


@pytest.mark.parametrize(
    "content, message",
    [
        ('{\n  "format": "stune-snapshot/1",\n  "ib": {,\n}', ":3: not JSON"),
        ("[1, 2]", "not a stune snapshot"),
        ('{"format": "other"}', "not a stune snapshot"),
    ],
)
def test_a_garbled_snapshot_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(snapshot.SnapshotError, match=message) as info:
        snapshot.load(str(path))
    assert str(info.value).startswith(str(path))


def test_snapshot_gpu_source_follows_the_file(tmp_path):
    path = tmp_path / "gpus.json"

    def write(util):
        devices = [
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "pci_bus_id": None,
                "utilization": {"gpu": util, "memory": 40},
                "memory": {"used": 1 << 30, "total": 80 << 30},
                "power_w": 300.5,
            }
            for i in range(2)
        ]
        path.write_text(
            json.dumps({"format": snapshot.FORMAT, "gpus": {"answered": True, "devices": devices}})
        )

    write(90)
    source = open_gpu_source(snapshot=str(path))
    assert isinstance(source, SnapshotGpuSource)
    assert [(r.index, r.sm_util, r.mem_util, r.power_w) for r in source.utilization()] == [
        (0, 90, 40, 300.5),
        (1, 90, 40, 300.5),
    ]
    before = path.stat()
    write(10)  # same size, same inode: only the time tells the source that the file changed
    if path.stat().st_mtime_ns == before.st_mtime_ns:  # within one tick of the filesystem's clock
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert [r.sm_util for r in source.utilization()] == [10, 10]


def test_live_gpu_source_samples_through_one_session():
    fake = fakenvml.FakeNvml(
        [fakenvml.device(i, util_gpu=97, util_memory=55, power_mw=650000) for i in range(8)]
    )
    source = open_gpu_source(nvml=fake)
    first = source.utilization()
    assert len(first) == 8 and first[5].sm_util == 97 and first[5].power_w == 650.0
    assert first[5].uuid.startswith("GPU-") and first[5].pci_bus_id == "00000000:90:00.0"
    before = fake.calls
    source.utilization()
    assert fake.calls - before == 8 * 4  # utilization, memory, power, processes per GPU; identity cached
    source.close()
    assert not fake.initialised


@pytest.mark.parametrize("name", ["dgx-a100-ib", "h100-roce", "vpc-a10g"])
def test_committed_snapshot_fixtures_are_current(name):
    """The fixture files are what the capture code writes today (regenerate: tests/fixtures/make_snapshots.py)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    import make_snapshots

    path = Path(__file__).parent / "fixtures" / "snapshots" / f"{name}.json"
    assert snapshot.load(str(path)) == json.loads(json.dumps(make_snapshots.build(name)))


def test_sysfs_root_expands_the_node_name():
    env = {"SLURMD_NODENAME": "n2", "STUNE_SYSFS_ROOT": "/var/tmp/c/nodes/%n/root"}
    assert sysfs.resolve_root(None, env) == "/var/tmp/c/nodes/n2/root"
    assert sysfs.resolve_root("/x/%n", env) == "/x/n2"
    assert sysfs.resolve_root(None, {}) == "/"


def test_a_uuid_maps_to_its_pci_bus_id_under_a_deadline():
    from slurm_tune.hw.nvmluuid import pci_bus_id_of_uuid

    class UuidNvml(fakenvml.FakeNvml):
        def nvmlDeviceGetHandleByUUID(self, uuid):
            for index, dev in enumerate(self.devices):
                if dev["uuid"].encode() == uuid:
                    return self.nvmlDeviceGetHandleByIndex(index)
            raise fakenvml.NVMLError(13, "Not Found")

    devices = [fakenvml.device(i, "h100") for i in range(8)]
    assert pci_bus_id_of_uuid(devices[5]["uuid"], 2, UuidNvml(devices)) == ("00000000:90:00.0", "")
    bus, problem = pci_bus_id_of_uuid("GPU-nope", 2, UuidNvml(devices))
    assert bus is None and "Not Found" in problem
    start = time.monotonic()
    bus, problem = pci_bus_id_of_uuid(devices[2]["uuid"], 0.3, UuidNvml(devices, hang_on_index=2))
    assert bus is None and "did not answer within 0.3s" in problem and time.monotonic() - start < 2
