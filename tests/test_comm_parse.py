"""The parser on forms the captures do not show and on bytes as the epilog hands them: newer channel and
completion forms (as NCCL's format strings print them: transport/net.cc `[send] via NET/%s/%d(%d)%s%s%s`,
net_ib.cc `with status=%d opcode=%d len=%d vendor err %d (%s)`), NCCL 2.26's timestamped WARN lines, CR line
ends, cut and damaged lines, head + tail joins, the cap, and inputs that are not bytes at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_tune.comm import Expectation, judge, parse
from slurm_tune.comm.cap import CUT_MARKER, LINE_MAX, NODE_CAP, capped, join_head_tail, split_lines
from slurm_tune.comm.channels import transport_of
from slurm_tune.comm.expect import ifname_matches
from slurm_tune.profiles import load_profile

FIX = Path(__file__).parent / "fixtures" / "comm"
P = "n1:100:200 [0] NCCL INFO "
GDR_LINE = P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"


def lines(*msgs: str) -> bytes:
    return "".join(P + m + "\n" for m in msgs).encode()


@pytest.mark.parametrize(
    "path,expected",
    [
        ("NET/IB/5/GDRDMA", ("NET/IB", True)),
        ("NET/IB/0(8)/GDRDMA", ("NET/IB", True)),  # proxied through rank 8 (PXN)
        ("NET/IB/0/GDRDMA(PCI)/Shared", ("NET/IB", True)),
        ("NET/IB/3/Shared", ("NET/IB", False)),
        ("NET/IBext_v8/1", ("NET/IBext_v8", False)),
        ("NET/AWS Libfabric/0", ("NET/AWS Libfabric", False)),
        ("NET/Socket/0", ("NET/Socket", False)),
        ("P2P/IPC/read", ("P2P/IPC", False)),
        ("P2P/CUMEM/read", ("P2P/CUMEM", False)),
        ("P2P/direct pointer", ("P2P/direct pointer", False)),
        ("SHM/direct/direct", ("SHM", False)),
        ("NET/IB/0/GDRD", None),  # cut short: not a channel without GDR
        ("NET/IB/0/GDRDMA junk", None),
        ("NET/IB//GDRDMA", None),
        ("NET/IB/99999999999999999999/GDRDMA", None),
        ("COLLNET/x", None),
    ],
)
def test_channel_paths(path, expected):
    assert transport_of(path) == expected


def test_net_lines_need_their_direction_and_p2p_lines_have_none():
    log = parse(
        lines("Channel 00/0 : 0[0] -> 1[0] via NET/IB/0", "Channel 00/0 : 0[0] -> 1[1] [send] via P2P/IPC")
    )
    assert log.channels == () and log.nccl_lines == 2


def test_newer_completion_forms_give_the_status():
    log = parse(
        (
            P.replace("INFO", "WARN")
            + "NET/IB : Got completion from peer 10.0.0.2<4242> with status=12 opcode=0 len=0 vendor err 129 (Send)\n"
            "[2025-02-18 12:54:00] n2:1:2 [3] transport/net_ib/p2p.cc:500 NCCL WARN NET/IB: Got completion from peer "
            "10.0.0.3<1> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) vendor_err=129 hca mlx5_0\n"
        ).encode()
    )
    assert [(c.code, c.count) for c in log.completions] == [("12", 2)]
    assert log.hosts == ("n1", "n2") and log.peers == ("10.0.0.2", "10.0.0.3") and log.vendor_errors == (129,)
    v = judge([log], Expectation("ib"))
    assert v.status == "errors" and v.completions == ((12, 2),)


def test_gdr_disabled_reason_is_kept_as_the_hint():
    log = parse(
        lines(
            "NET/IB : GPU Direct RDMA Disabled for GPU 1b000 / HCA 0 (distance 5 > 3)",
            "Using network IB",
            "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0",
            "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0",
        )
    )
    assert (log.gdr_disabled, log.gdr_distance) == (1, "distance 5 > 3")
    from slurm_tune.comm import messages

    text = messages(judge([log], Expectation("ib", gdr=True, gdr_level="PIX")))[0]
    assert "for send and receive" in text and "(distance 5 > 3)" in text and "further apart" in text


def test_cr_line_ends_read_like_lf():
    data = (FIX / "nccl-ib-gdr-a100-nccl707.txt").read_bytes()
    for ends in (b"\r\n", b"\r"):
        assert parse(data.replace(b"\n", ends)).channels == parse(data).channels


def test_a_partial_last_line_is_not_read():
    cut = GDR_LINE.encode()[: -len("/GDRDMA\n")]  # `... [send] via NET/IB/0`, no line end
    log = parse(cut)
    assert log.partial and log.channels == () and log.lines == 0
    assert parse(cut + b"\n").channels[0].gdr is False  # a whole line that says so is read as it is


def test_damaged_and_over_long_lines_are_skipped():
    log = parse(
        GDR_LINE.replace("/GDRDMA", "\x00").encode()
        + b"x" * (LINE_MAX + 1)
        + b"\n"
        + b"\xff\xfe"
        + GDR_LINE.encode()
    )
    assert log.damaged == 3 and log.channels == ()


def test_join_head_tail_keeps_whole_lines_and_marks_the_cut():
    data = (FIX / "nccl-ib-gdr-p2pipc-tpgds.txt").read_bytes()
    for a in range(0, len(data), 37):
        for b in range(a, len(data), 53):
            joined = join_head_tail(data[:a], data[b:])
            assert CUT_MARKER.encode() in joined
            log = parse(joined)
            assert log.cut and all(c.gdr for c in log.channels if c.net)  # no cut line passes for GDR-less


def test_parse_caps_itself_at_the_node_cap():
    data = GDR_LINE.encode() * (2 * NODE_CAP // len(GDR_LINE) + 10)
    log = parse(data)
    assert log.cut and log.bytes_skipped == len(data) - NODE_CAP and log.bytes_read == NODE_CAP
    assert log.lines < len(data) // len(GDR_LINE) and all(c.gdr for c in log.channels)
    assert capped(b"abc") == (b"abc", 0)


def test_split_lines():
    assert split_lines(b"a\r\nb\rc\n") == (["a", "b", "c"], False)
    assert split_lines(b"a\nb") == (["a"], True)
    assert split_lines(b"") == ([], False)


def test_gigantic_numbers_are_no_numbers():
    assert (
        parse(f"{P}Channel {'9' * 5000}/0 : 0[0] -> 1[0] [send] via NET/IB/0\n").damaged == 1
    )  # over LINE_MAX
    big = "9" * 1000
    log = parse(
        lines(
            f"Channel {big}/0 : 0[0] -> 1[0] [send] via NET/IB/0",
            f"NCCL version {big}.1.1",
            f"NET/IB : Using [{big}]mlx5_0:{big}/IB ; OOB eth0:1.2.3.4<0>",
        )
        + f"n1:1:1 [0] x.cc:1 NCCL WARN NET/IB : Got completion with error {big}, opcode 0\n".encode()
        + f"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)={big})\n".encode()
        + f"EI0006: rank {big}\n".encode()
    )
    assert log.error == "" and log.channels == () and log.version == "" and log.nics == ()
    assert log.completions == () and log.warns[0].kind == "completion" and log.watchdog_timeout_ms == 0


@pytest.mark.parametrize(
    "data",
    [
        None,
        "",
        "Using network Socket\n",
        "\ud800 lone surrogate\n",
        bytearray(GDR_LINE.encode()),
        memoryview(b"x\n"),
        42,
    ],
)
def test_anything_given_is_parsed_without_raising(data):
    log = parse(data)
    assert log.error == ""


def test_str_input_is_read_as_its_utf8():
    assert parse(GDR_LINE).channels == parse(GDR_LINE.encode()).channels


def test_bare_lines_need_a_specific_start():
    log = parse(b"Using the GPU now\nChannel surfing\nRing 00 : nothing\nInitialized everything\n")
    assert log.nccl_lines == 0 and log.library == "unknown" and log.channels == ()
    assert judge([log], Expectation("ib")).status == "unknown"


def test_a_plugin_that_works_is_no_failure_and_an_unused_one_is():
    works = parse(lines("NET/Plugin: Loaded net plugin AWS Libfabric (v6)", "Using network AWS Libfabric"))
    assert works.plugins_failed == () and judge([works], Expectation("ib")).status == "ok"
    unused = judge(
        [parse(lines("NET/Plugin: Loaded net plugin AWS Libfabric (v6)", "Using network IB"))],
        Expectation("ib"),
    )
    assert (unused.status, unused.plugin, unused.plugin_trace, unused.own) == (
        "plugin_failed",
        "AWS Libfabric",
        "",
        "IB",
    )
    # a failure trace with no plugin loaded before it (nccl1053's net.cc:79 -> 3) is none either
    assert parse(lines("net.cc:79 -> 3", "transport/net.cc:1117 -> 6")).plugins_failed == ()


def test_a_plugin_failing_into_socket_is_a_fallback_too():
    log = parse(
        lines(
            "NET/Plugin: Loaded net plugin AWS Libfabric (v6)",
            "plugin/net.cc:118 -> 2",
            "NET/IB : No device found.",
            "NET/Socket : Using [0]eth0:10.0.0.1<0>",
            "Using network Socket",
        )
    )
    v = judge([log], Expectation("ib"))
    assert v.findings == ("fallback", "plugin_failed") and (v.own, v.own_how) == ("Socket", "network")


def test_expectation_from_the_shipped_profiles():
    hdr = Expectation.from_profile(load_profile("hdr"))
    assert hdr == Expectation("ib", gdr=True, gdr_level="PHB", socket_ifname="ib0")
    assert Expectation.from_profile(load_profile("roce")).gdr_level == "SYS"
    vpc = Expectation.from_profile(load_profile("vpc"))
    assert (vpc.fabric, vpc.gdr, vpc.socket_ifname) == ("tcp", False, "ens5")


def test_gdr_level_loc_or_unset_expects_no_gdr():
    class Ns:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    for level in (None, "LOC"):
        profile = Ns(fabric=Ns(type="ib", socket_ifname=None), nccl=Ns(net_gdr_level=level))
        assert Expectation.from_profile(profile).gdr is False


@pytest.mark.parametrize(
    "spec,name,admitted",
    [
        ("eth", "eth0", True),
        ("eth", "ens3", False),
        ("=eth0", "eth0", True),
        ("=eth0", "eth01", False),
        ("^docker,lo", "lo", False),
        ("^docker,lo", "eth0", True),
        ("^=docker0", "docker01", True),
        ("ib,eth", "eth2", True),
        ("", "anything", True),
    ],
)
def test_socket_ifname_matching_as_nccl_does(spec, name, admitted):
    assert ifname_matches(spec, name) is admitted


def test_a_marker_at_the_line_start_and_a_glued_line():
    log = parse(b"NCCL INFO Using network Socket\n[0]  8192  2048  float  sum  -1[0] " + GDR_LINE.encode())
    assert (
        log.networks == ("Socket",) and log.channels[0].gdr and log.hosts == ("n1",) and log.nccl_lines == 2
    )


def test_mixed_networks_are_a_fallback_for_the_socket_part():
    from slurm_tune.comm import messages

    log = parse(
        lines("Using network IB", "Using network Socket", "NET/Socket : Using [0]eth0:10.0.0.1<0>")
        + GDR_LINE.encode()
    )
    v = judge([log], Expectation("ib"))
    assert v.status == "fallback"
    assert messages(v)[0] == "IB partition, but NCCL used NET/Socket over eth0; other connections used IB"


def test_share_splits_the_node_cap_among_files():
    from slurm_tune.comm.cap import FILE_MIN, share

    assert share(1) == NODE_CAP and share(8) == NODE_CAP // 8 and share(10_000) == FILE_MIN
    assert share(0) == NODE_CAP
