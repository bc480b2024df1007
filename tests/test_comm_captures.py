"""Every capture of tests/fixtures/comm (copied from hardware-outputs/comm; origins in its SOURCES.md) with its
expected parse facts and its verdict under the expectations it is judged by, written down here.

Expectations: IB_GDR (ib, nccl.net_gdr_level PHB), IB (ib, net_gdr_level unset: GDR not expected), ROCE_GDR
(roce, SYS), TCP (tcp, no socket interface in the profile). A Socket capture is a fallback on ib / roce and ok
on tcp; GDR-less channels are no_gdr only where GDR is expected. Benchmark tables alone are unknown (they say
how fast a test ran, not how a job's NCCL connected); a capture with a table and NCCL lines is judged on its
NCCL lines (ncclTests24: errors; ncclperf-interleaved: unknown, its INFO lines are tuning lines only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_tune.comm import Expectation, decode, judge, messages, parse
from slurm_tune.comm.model import CommLog

FIX = Path(__file__).parent / "fixtures" / "comm"
IB_GDR = Expectation("ib", gdr=True, gdr_level="PHB", socket_ifname="ib0")
IB = Expectation("ib")
ROCE_GDR = Expectation("roce", gdr=True, gdr_level="SYS")
TCP = Expectation("tcp")
EXPECTS = {"IB_GDR": IB_GDR, "IB": IB, "ROCE_GDR": ROCE_GDR, "TCP": TCP}


def log_of(name: str) -> CommLog:
    log = parse((FIX / name).read_bytes())
    assert log.error == "", log.error
    return log


def channels(log: CommLog) -> dict:
    """{transport: (send, send with GDR, receive, receive with GDR)} for NET, {transport: lines} otherwise."""
    out: dict = {}
    for c in log.channels:
        if c.net:
            s, sg, r, rg = out.get(c.transport, (0, 0, 0, 0))
            if c.direction == "send":
                s, sg = s + c.count, sg + c.count * c.gdr
            else:
                r, rg = r + c.count, rg + c.count * c.gdr
            out[c.transport] = (s, sg, r, rg)
        else:
            out[c.transport] = out.get(c.transport, 0) + c.count
    return out


def facts(log: CommLog) -> dict:
    return {
        "library": log.library,
        "version": log.version,
        "networks": log.networks,
        "channels": channels(log),
        "nics": tuple(
            f"{n.device}:{n.port}/{n.link}" + (f"@{n.group}" if n.group >= 0 else "") for n in log.nics
        ),
        "socket_ifs": log.socket_ifs,
        "plugins": log.net_plugins,
        "plugins_failed": log.plugins_failed,
        "warns": {w.kind: w.count for w in log.warns},
        "completions": {c.code: c.count for c in log.completions},
        "watchdog": log.watchdog_timeouts,
        "hccl_codes": {c.code: c.count for c in log.hccl_codes},
        "hccl_returns": {c.code: c.count for c in log.hccl_returns},
        "test_failures": log.test_failures,
        "hosts": len(log.hosts),
        "tables": log.table_lines > 0,
    }


NONE: dict = {
    "version": "",
    "networks": (),
    "channels": {},
    "nics": (),
    "socket_ifs": (),
    "plugins": (),
    "plugins_failed": (),
    "warns": {},
    "completions": {},
    "watchdog": 0,
    "hccl_codes": {},
    "hccl_returns": {},
    "test_failures": 0,
    "tables": False,
}
SHARP8 = tuple(f"mlx5_{i}:1/IB/SHARP" for i in range(8))

# capture: (parse facts that differ from NONE, {expectation: (status, findings)})
OKS = {"IB_GDR": ("ok", ()), "IB": ("ok", ()), "ROCE_GDR": ("ok", ()), "TCP": ("ok", ())}
SOCKET = {
    "IB_GDR": ("fallback", ("fallback",)),
    "IB": ("fallback", ("fallback",)),
    "ROCE_GDR": ("fallback", ("fallback",)),
    "TCP": ("ok", ()),
}
UNKNOWN = dict.fromkeys(EXPECTS, ("unknown", ()))
ERRORS = dict.fromkeys(EXPECTS, ("errors", ("errors",)))
NO_GDR_WHERE_EXPECTED = {
    "IB_GDR": ("no_gdr", ("no_gdr",)),
    "IB": ("ok", ()),
    "ROCE_GDR": ("no_gdr", ("no_gdr",)),
    "TCP": ("ok", ()),
}
CAPTURES = {
    # IB with GPUDirect RDMA both ways: passes wherever GDR is expected
    "nccl-ib-gdr-a100-nccl707.txt": (
        {"library": "nccl", "channels": {"NET/IB": (6, 6, 6, 6)}, "hosts": 1},
        OKS,
    ),
    "nccl-ib-gdr-p2pipc-tpgds.txt": (
        {"library": "nccl", "channels": {"NET/IB": (6, 6, 8, 8), "P2P/IPC": 3}, "hosts": 1},
        OKS,
    ),
    "nccl-ib-gdr-p2pipcread-nccl834.txt": (
        {"library": "nccl", "channels": {"P2P/IPC": 11, "NET/IB": (1, 1, 1, 1)}, "hosts": 2},
        OKS,
    ),
    # GDR missing in one or both directions
    "nccl-ib-gdr-readoff-ncclTests36.txt": (
        {"library": "nccl", "channels": {"NET/IB": (1, 0, 2, 2)}, "hosts": 2},
        NO_GDR_WHERE_EXPECTED,
    ),
    "nccl-ib-nogdr-nccl1657.txt": (
        {"library": "nccl", "channels": {"NET/IB": (1, 0, 0, 0)}, "hosts": 1},
        NO_GDR_WHERE_EXPECTED,
    ),
    "nccl-roce-ibext-merged-ncclTests373.txt": (
        {
            "library": "nccl",
            "networks": ("IBext_v8",),
            "plugins": ("IBext_v8",),
            "nics": ("mlx5_2:1/RoCE@0", "mlx5_3:1/RoCE@0", "mlx5_0:1/RoCE@1", "mlx5_1:1/RoCE@1"),
            "channels": {"NET/IBext_v8": (1, 0, 2, 0)},
            "hosts": 1,
        },
        NO_GDR_WHERE_EXPECTED,
    ),
    "nccl-ofi-libfabric-old-awsofi24.txt": (
        {
            "library": "nccl",
            "channels": {"P2P/IPC": 6, "NET/AWS Libfabric": (3, 0, 0, 0)},
            "warns": {"ofi": 1},
            "hosts": 4,
        },
        {
            "IB_GDR": ("no_gdr", ("no_gdr", "errors")),
            "IB": ("errors", ("errors",)),
            "ROCE_GDR": ("no_gdr", ("no_gdr", "errors")),
            "TCP": ("errors", ("errors",)),
        },
    ),
    # IB through the SHARP plugin, no channel line: ok, GDR not shown (note gdr_unshown)
    "nccl-ib-sharp-ibext-nccl988.txt": (
        {
            "library": "nccl",
            "version": "2.12.9",
            "networks": ("IBext",),
            "plugins": ("IBext",),
            "nics": SHARP8,
            "hosts": 1,
        },
        OKS,
    ),
    "nccl-ib-sharp-noprefix-nccl1584.txt": (
        {
            "library": "nccl",
            "version": "2.24.3",
            "networks": ("IBext_v8",),
            "plugins": ("NCCL RDMA Plugin v8",),
            "nics": tuple(f"ibp{i}:1/IB/SHARP" for i in range(8)),
            "hosts": 0,
        },
        OKS,
    ),
    # Socket: a fallback on RDMA partitions, ok on TCP
    "nccl-socket-aws-nccl226.txt": (
        {"library": "nccl", "version": "2.4.7", "socket_ifs": ("ens3",), "hosts": 8},
        SOCKET,
    ),
    "nccl-socket-lo-nccl1053.txt": (
        {"library": "nccl", "networks": ("Socket",), "socket_ifs": ("lo",), "hosts": 1},
        SOCKET,
    ),
    "nccl-socket-ncclTests179.txt": (
        {"library": "nccl", "networks": ("Socket",), "socket_ifs": ("eno1", "enp1s0"), "hosts": 2},
        SOCKET,
    ),
    "rccl-socket-mi50-rcclTests163.txt": (
        {
            "library": "rccl",
            "version": "2.21.5",
            "networks": ("Socket",),
            "socket_ifs": ("eno2np1",),
            "hosts": 1,
            "tables": True,
        },
        SOCKET,
    ),
    # a plugin that loaded, then failed: NCCL went on with its own IB
    "nccl-ofi-plugin-fallback-tpgds.txt": (
        {"library": "nccl", "plugins": ("AWS Libfabric",), "plugins_failed": ("AWS Libfabric",), "hosts": 1},
        dict.fromkeys(EXPECTS, ("plugin_failed", ("plugin_failed",))),
    ),
    # warnings and errors
    "nccl-warn-createqp-ibext-nccl562.txt": (
        {
            "library": "nccl",
            "version": "2.8.3",
            "networks": ("IBext",),
            "warns": {"create_qp": 3},
            "hosts": 1,
        },
        ERRORS,
    ),
    "nccl-warn-wcerr4-v24-ncclTests24.txt": (
        {"library": "nccl", "warns": {"completion": 1}, "completions": {"4": 1}, "hosts": 2, "tables": True},
        ERRORS,
    ),
    "nccl-warn-wcerr5-gdr-nccl1737.txt": (
        {"library": "nccl", "warns": {"completion": 4}, "completions": {"5": 4}, "hosts": 1},
        ERRORS,
    ),
    "torch-watchdog-timeout-nccl1610.txt": ({"library": "nccl", "watchdog": 2, "hosts": 1}, ERRORS),
    "hccl-EI0006-torchnpu-vllmascend486.txt": (
        {"library": "hccl", "hccl_codes": {"EI0006": 1}, "hccl_returns": {"6": 1}, "hosts": 0},
        ERRORS,
    ),
    "hccl-EI9999-exectimeout-ascendpytorch54.txt": (
        {"library": "hccl", "hccl_codes": {"EI9999": 2}, "hosts": 0},
        ERRORS,
    ),
    "hccl-linkerror-table-vllmascend9447.txt": (
        {"library": "hccl", "hccl_returns": {"9": 2}, "hosts": 0},
        ERRORS,
    ),
    "nccltests-fail-multinode-ncclTests322.txt": (
        {"library": "unknown", "test_failures": 6, "hosts": 0},
        ERRORS,
    ),
    "nccltests-fail-nccl1-ncclTests5.txt": (
        {"library": "unknown", "test_failures": 1, "hosts": 0, "tables": True},
        ERRORS,
    ),
    # NCCL lines without any transport: unknown (RCCL's MSCCL++ warning is counted, and harmless)
    "nccl-nvls-mpiprefix-nccl1453.txt": ({"library": "nccl", "hosts": 1}, UNKNOWN),
    "ncclperf-interleaved-nccl1453.txt": ({"library": "nccl", "hosts": 1, "tables": True}, UNKNOWN),
    "rccl-init-msccl-warn-rcclTests163.txt": (
        {"library": "rccl", "warns": {"msccl": 1}, "hosts": 1, "tables": True},
        UNKNOWN,
    ),
    # benchmark tables alone: unknown
    "nccltests-2node-h100-a3mega-ztan.txt": ({"library": "unknown", "hosts": 0, "tables": True}, UNKNOWN),
    "nccltests-table-v264-nccl340.txt": ({"library": "unknown", "hosts": 0, "tables": True}, UNKNOWN),
    "rccltests-allgather-srunlabel-rccl1490.txt": (
        {"library": "unknown", "hosts": 0, "tables": True},
        UNKNOWN,
    ),
    "rccltests-table-mi250x-rccl929.txt": ({"library": "unknown", "hosts": 0, "tables": True}, UNKNOWN),
    "hcclTest-allreduce-docexample.txt": ({"library": "unknown", "hosts": 0, "tables": True}, UNKNOWN),
}


def test_the_table_names_every_capture_once():
    on_disk = {p.name for p in FIX.glob("*.txt")}
    assert len(on_disk) == 31 and on_disk == set(CAPTURES)
    assert {p.name for p in FIX.glob("*.md")} == {"README.md", "SOURCES.md"}


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_parse_facts(name):
    expected, _ = CAPTURES[name]
    assert facts(log_of(name)) == {**NONE, **expected}


@pytest.mark.parametrize("name", sorted(CAPTURES))
@pytest.mark.parametrize("expect", sorted(EXPECTS))
def test_verdict(name, expect):
    _, verdicts = CAPTURES[name]
    v = judge([log_of(name)], EXPECTS[expect])
    assert (v.status, v.findings) == verdicts[expect]
    assert decode(v.encode()) == v and " " not in v.encode() and "=" not in v.encode()
    assert messages(v) and all(messages(v))


# ---- what each kind of capture says, in words -----------------------------------------------------------
SOCKETS = {
    "nccl-socket-aws-nccl226.txt": "ens3",
    "nccl-socket-lo-nccl1053.txt": "lo",
    "nccl-socket-ncclTests179.txt": "eno1, enp1s0",
    "rccl-socket-mi50-rcclTests163.txt": "eno2np1",
}


@pytest.mark.parametrize("name", sorted(SOCKETS))
def test_socket_captures_are_a_fallback_on_rdma_and_ok_on_tcp_with_their_interface(name):
    log = log_of(name)
    assert messages(judge([log], IB), node="n3")[0].startswith(
        f"IB partition, but ranks on n3 used NET/Socket over {SOCKETS[name]}"
    )
    assert messages(judge([log], ROCE_GDR))[0].startswith("RoCE partition, but NCCL used NET/Socket")
    first = SOCKETS[name].split(",")[0]
    assert (
        judge([log], Expectation("tcp", socket_ifname=first[:2])).status == "ok"
    )  # NCCL_SOCKET_IFNAME prefix
    wrong = judge([log], Expectation("tcp", socket_ifname="=ib0"))
    assert wrong.status == "fallback" and "should use =ib0" in messages(wrong)[0]


def test_socket_fallback_causes_are_named():
    assert "found no device" in messages(judge([log_of("nccl-socket-aws-nccl226.txt")], IB))[0]
    assert "NCCL_IB_DISABLE=1" in messages(judge([log_of("nccl-socket-lo-nccl1053.txt")], IB))[0]
    assert "libibverbs" in messages(judge([log_of("rccl-socket-mi50-rcclTests163.txt")], IB))[0]
    v = judge([log_of("nccl-socket-aws-nccl226.txt")], IB)
    assert "socket_inferred" in v.notes  # NCCL 2.4 printed no `Using network`


@pytest.mark.parametrize(
    "name,direction",
    [
        ("nccl-ib-gdr-readoff-ncclTests36.txt", "for send ("),
        ("nccl-ib-nogdr-nccl1657.txt", "for send ("),
        ("nccl-roce-ibext-merged-ncclTests373.txt", "for send and receive ("),
        ("nccl-ofi-libfabric-old-awsofi24.txt", "for send ("),
    ],
)
def test_gdr_missing_says_the_direction(name, direction):
    text = messages(judge([log_of(name)], IB_GDR), node="n5")[0]
    assert text.startswith(
        "GPUDirect RDMA expected (profile nccl.net_gdr_level PHB) but not used on n5 " + direction
    )
    assert text.endswith("?") or "NCCL_NET_GDR_READ" in text


def test_gdr_one_direction_counts_and_the_read_hint():
    text = messages(judge([log_of("nccl-ib-gdr-readoff-ncclTests36.txt")], IB_GDR))[0]
    assert "send: 0 of 1 NET/IB channel lines with /GDRDMA; receive: 2 of 2" in text
    assert "read 0" in text and "NCCL_NET_GDR_READ=1" in text
    assert messages(judge([log_of("nccl-ib-nogdr-nccl1657.txt")], IB_GDR))[0].endswith(
        "is nvidia-peermem loaded?"
    )


@pytest.mark.parametrize("name", ["nccl-ib-sharp-ibext-nccl988.txt", "nccl-ib-sharp-noprefix-nccl1584.txt"])
def test_rdma_without_channel_lines_is_ok_but_gdr_not_shown(name):
    v = judge([log_of(name)], IB_GDR)
    assert v.status == "ok" and "gdr_unshown" in v.notes
    assert any("no NET channel line shows whether it was used" in m for m in messages(v))
    assert "gdr_unshown" not in judge([log_of(name)], IB).notes


def test_plugin_failure_says_the_plugin_failed_and_nccl_used_its_own_ib():
    alone = judge([log_of("nccl-ofi-plugin-fallback-tpgds.txt")], IB_GDR)
    assert (alone.plugin, alone.own, alone.own_how) == ("AWS Libfabric", "IB", "init")
    assert messages(alone, node="n1")[0].startswith(
        "net plugin AWS Libfabric failed on n1 (plugin/net.cc:118 -> 2), NCCL used its own IB"
    )
    # the same run's later lines (the other capture of the file): NCCL's own NET/IB, with GDR both ways
    both = judge(
        [log_of("nccl-ofi-plugin-fallback-tpgds.txt"), log_of("nccl-ib-gdr-p2pipc-tpgds.txt")], IB_GDR
    )
    assert (both.status, both.findings, both.own, both.own_how) == (
        "plugin_failed",
        ("plugin_failed",),
        "IB",
        "channels",
    )
    assert (
        messages(both)[0] == "net plugin AWS Libfabric failed (plugin/net.cc:118 -> 2), NCCL used its own IB"
    )


def test_version_probes_and_absent_plugins_are_no_failure():
    for name in (
        "nccl-ib-sharp-ibext-nccl988.txt",
        "nccl-ib-sharp-noprefix-nccl1584.txt",
        "rccl-socket-mi50-rcclTests163.txt",
    ):
        assert "plugin_failed" not in judge([log_of(name)], IB).findings
    assert (
        log_of("rccl-socket-mi50-rcclTests163.txt").no_plugin
        and log_of("nccl-socket-aws-nccl226.txt").no_plugin
    )


@pytest.mark.parametrize(
    "name,words",
    [
        ("nccl-warn-wcerr5-gdr-nccl1737.txt", "NCCL warnings: 4 IB completion errors (status 5 WR_FLUSH_ERR"),
        (
            "nccl-warn-wcerr4-v24-ncclTests24.txt",
            "NCCL warnings: 1 IB completion error (status 4 LOC_PROT_ERR",
        ),
        ("nccl-warn-createqp-ibext-nccl562.txt", "NCCL warnings: 3 ibv_create_qp failures"),
        ("nccl-ofi-libfabric-old-awsofi24.txt", "NCCL warnings: 1 libfabric (aws-ofi-nccl) error"),
        ("torch-watchdog-timeout-nccl1610.txt", "PyTorch watchdog: 2 collectives timed out"),
        (
            "hccl-EI0006-torchnpu-vllmascend486.txt",
            "HCCL errors: EI0006 x1 (getting a socket timed out), return code 6 HCCL_E_NOT_FOUND x1",
        ),
        ("hccl-EI9999-exectimeout-ascendpytorch54.txt", "HCCL errors: EI9999 x2 (inner error)"),
        (
            "hccl-linkerror-table-vllmascend9447.txt",
            "HCCL errors: return code 9 HCCL_E_TIMEOUT x2, 7 error lines, 1 link timed out",
        ),
        ("nccltests-fail-multinode-ncclTests322.txt", "nccl-tests: 6 NCCL failures"),
    ],
)
def test_errors_are_counted_and_named(name, words):
    assert any(m.startswith(words) for m in messages(judge([log_of(name)], IB))), messages(
        judge([log_of(name)], IB)
    )


def test_completion_errors_keep_vendor_codes_and_peer():
    log = log_of("nccl-warn-wcerr5-gdr-nccl1737.txt")
    assert (log.vendor_errors, log.peers) == ((249,), ("10.1.32.3",))
    assert log_of("torch-watchdog-timeout-nccl1610.txt").watchdog_ops == ("ALLTOALL_BASE", "ALLREDUCE")
    assert log_of("torch-watchdog-timeout-nccl1610.txt").watchdog_timeout_ms == 600000


def test_rccl_is_told_from_nccl_though_it_prints_nccl_info():
    for name in ("rccl-socket-mi50-rcclTests163.txt", "rccl-init-msccl-warn-rcclTests163.txt"):
        log = log_of(name)
        assert log.library == "rccl" and log.nccl_lines > 0
    msccl = judge([log_of("rccl-init-msccl-warn-rcclTests163.txt")], IB)
    assert msccl.benign == 1 and msccl.status == "unknown" and "errors" not in msccl.findings


def test_versions_as_printed():
    assert (log_of("nccl-warn-createqp-ibext-nccl562.txt").build) == "cudaCUDA_MAJOR.CUDA_MINOR"
    assert (log_of("nccl-socket-aws-nccl226.txt").version, log_of("nccl-socket-aws-nccl226.txt").build) == (
        "2.4.7",
        "cuda9.2",
    )
    assert log_of("rccl-socket-mi50-rcclTests163.txt").build == "HEAD:9a0e6a1"


def test_tables_alone_are_unknown_and_say_why():
    for name in (
        "nccltests-2node-h100-a3mega-ztan.txt",
        "hcclTest-allreduce-docexample.txt",
        "rccltests-allgather-srunlabel-rccl1490.txt",
    ):
        log = log_of(name)
        assert log.not_understood == 0 and log.nccl_lines == 0 and log.table_lines == log.lines
        v = judge([log], IB)
        assert v.notes == ("tables_only",) and "benchmark table" in messages(v)[0]


def test_setup_only_logs_are_unknown_and_say_why():
    v = judge([log_of("nccl-nvls-mpiprefix-nccl1453.txt")], IB)
    assert v.notes == ("setup_only",)
    assert "no network choice nor channel line" in messages(v)[0]


def test_prefixes_of_launchers_and_collectors_give_the_hosts():
    assert log_of("nccl-nvls-mpiprefix-nccl1453.txt").hosts == ("h100clust-worker-1",)  # mpirun `[0] `
    assert log_of("nccl-ofi-libfabric-old-awsofi24.txt").hosts[0] == "ip-172-32-36-209"  # `[1,26]<stdout>:`
    assert log_of("torch-watchdog-timeout-nccl1610.txt").hosts == ("ncivki7qpk7pmo1btv0h0",)  # timestamps
    assert log_of("nccl-ib-sharp-noprefix-nccl1584.txt").formats == ("nccl-bare",)
