"""The verdict's wire form (encode / decode) and the job's verdict (merge) with its messages."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.comm import Expectation, NodeVerdict, decode, judge, merge, messages, parse
from slurm_tune.comm.verdict import _FIELDS, FINDINGS, NOTES, STATUSES, NetUse

FIX = Path(__file__).parent / "fixtures" / "comm"
IB_GDR = Expectation("ib", gdr=True, gdr_level="PHB")


def verdict_of(*names: str, expect: Expectation = IB_GDR) -> NodeVerdict:
    return judge([parse((FIX / n).read_bytes()) for n in names], expect)


def test_every_field_travels():
    assert {a for _, a, _ in _FIELDS} == {f.name for f in fields(NodeVerdict)} - {"status"}
    assert len({k for k, _, _ in _FIELDS}) == len(_FIELDS)


def test_a_full_verdict_round_trips_and_keeps_to_its_characters():
    v = NodeVerdict(
        "fallback",
        findings=("fallback", "no_gdr", "plugin_failed", "errors"),
        notes=("cut", "ib_no_device"),
        fabric="ib",
        gdr=True,
        gdr_level="PHB",
        socket_ifname="^docker,lo",
        library="nccl",
        version="2.27.5",
        networks=("Socket", "AWS Libfabric"),
        socket_ifs=("eth0", "bond0.526"),
        net=(NetUse("IB", 4, 2, 4, 4), NetUse("AWS Libfabric", 1, 0, 0, 0)),
        plugin="AWS Libfabric",
        plugin_trace="plugin/net.cc:118 -> 2",
        own="IB",
        own_how="channels",
        errors=(("completion", 4), ("watchdog", 2)),
        completions=((5, 4), (12, 1)),
        vendor_errors=(249, 81),
        hccl_codes=(("EI0006", 1),),
        hccl_returns=((9, 2),),
        benign=1,
        gdr_reason="distance 4 > 2",
        logs=8,
        lines=12345,
        nccl_lines=12000,
        not_understood=3,
    )
    token = v.encode()
    assert decode(token) == v
    assert not set(token) & set(" =\t\n") and token.startswith("c1;fallback;")
    for part in token.split(";")[2:]:
        key, _, value = part.partition(":")
        assert key.isalpha() and value and ":" not in value and ";" not in value


def test_defaults_encode_short():
    assert NodeVerdict("not_judged").encode() == "c1;not_judged"
    assert decode("c1;not_judged") == NodeVerdict("not_judged")
    ok = verdict_of("nccl-ib-gdr-a100-nccl707.txt")
    assert len(ok.encode()) < 80, ok.encode()


@pytest.mark.parametrize(
    "token",
    [
        "",
        "c1",
        "c2;ok",
        "c1;great",
        "c1;ok;f:bogus",
        "c1;ok;ln:12a",
        "c1;ok;ln:" + "9" * 20,
        "c1;ok;t:IB~1~2",
        "c1;ok;t:IB~1~2~3~x",
        "c1;ok;x:%ZZ",
        "c1;ok;x:a b",
        "c1;ok;x:%FF",
        "c1;ok;k:1;k:2",
        "c1;ok;k",
        "c1;ok;k:",
        "c1;ok;c:x~1",
        "c1;ok;g:yes",
        "c1;ok;" + "x:ib;" * 2000,
    ],
)
def test_decode_refuses_what_encode_does_not_make(token):
    assert decode(token) is None


def test_decode_ignores_keys_and_notes_it_does_not_know():
    assert decode("c1;ok;zz:whatever;n:cut,future_note") == NodeVerdict("ok", notes=("cut",))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_decode_never_raises(text):
    v = decode(text)
    assert v is None or v.status in STATUSES


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(p.name for p in FIX.glob("*.txt"))), st.integers(0, 400), st.characters())
def test_decode_of_a_damaged_token_is_none_or_a_verdict(name, at, char):
    token = verdict_of(name).encode()
    damaged = token[:at] + char + token[at + 1 :]
    v = decode(damaged)
    assert v is None or (
        v.status in STATUSES and set(v.findings) <= set(FINDINGS) and set(v.notes) <= set(NOTES)
    )


def test_judge_with_no_logs_is_not_judged_and_says_why():
    v = judge([], IB_GDR)
    assert v.status == "not_judged" and "gloo" in messages(v)[0]


def test_judge_never_raises_even_on_a_broken_expectation():
    class Broken:
        fabric = "ib"

        @property
        def gdr(self):
            raise RuntimeError("boom")

    log = parse((FIX / "nccl-socket-lo-nccl1053.txt").read_bytes())
    assert judge([log], Broken()).status == "unknown"  # type: ignore[arg-type]
    assert judge([log], Expectation("efa")).notes[-1:] == ("fabric_unknown",)
    assert judge([log], Expectation("efa")).status == "ok"


def test_merge_says_each_thing_once_for_its_nodes():
    socket = verdict_of("nccl-socket-lo-nccl1053.txt")
    nogdr = verdict_of("nccl-ib-nogdr-nccl1657.txt")
    ok = verdict_of("nccl-ib-gdr-a100-nccl707.txt")
    job = merge({"n3": socket, "n4": socket, "n5": nogdr, "n1": ok, "n2": ok, "n9": judge([], IB_GDR)})
    assert job.status == "fallback"
    assert job.messages[0].startswith("IB partition, but ranks on n[3-4] used NET/Socket over lo")
    assert job.messages[1] == (
        "GPUDirect RDMA expected (profile nccl.net_gdr_level PHB) but not used on n5 for send: "
        "is nvidia-peermem loaded?"
    )
    assert "ranks on n[1-2] used NET/IB with GPUDirect RDMA in both directions" in job.messages
    assert job.messages[-1].startswith("not judged on n9")
    assert job.nodes_with("fallback") == ("n3", "n4") and job.nodes_with("not_judged") == ("n9",)


def test_merge_counts_errors_and_ranks_unknown_above_ok():
    errs = verdict_of("nccl-warn-wcerr5-gdr-nccl1737.txt")
    table = verdict_of("nccltests-table-v264-nccl340.txt")
    ok = verdict_of("nccl-ib-gdr-a100-nccl707.txt")
    assert merge({"a": ok, "b": table}).status == "unknown"
    assert merge({"a": ok, "b": judge([], IB_GDR)}).status == "ok"
    job = merge({"n1": errs, "n2": errs, "n3": ok})
    assert job.status == "errors" and job.errors == 8
    assert job.messages[0].startswith("NCCL warnings on n[1-2]: IB completion errors (status 5 WR_FLUSH_ERR")
    assert job.messages[-1] == "errors counted: 8 (n1: 4, n2: 4)"


def test_merge_of_nothing_and_of_decoded_verdicts():
    assert merge({}).status == "not_judged"
    v = verdict_of("nccl-ofi-plugin-fallback-tpgds.txt")
    again = decode(v.encode())
    assert again is not None
    assert merge({"n1": again}).messages == merge({"n1": v}).messages
    assert merge({"n1": again}).messages[0].startswith("net plugin AWS Libfabric failed on n1")


def test_the_node_names_itself_only_when_given():
    v = verdict_of("nccl-socket-ncclTests179.txt")
    assert messages(v)[0].startswith("IB partition, but NCCL used NET/Socket over eno1, enp1s0")
    assert messages(v, node="n7")[0].startswith("IB partition, but ranks on n7 used")


def test_findings_are_worst_first_and_the_status_is_the_worst():
    v = verdict_of("nccl-ofi-libfabric-old-awsofi24.txt")
    assert v.findings == ("no_gdr", "errors") and v.status == "no_gdr"
