"""Parsers of the benchmark tools' real outputs (tests/fixtures/active: captured here for dd, fio and iperf3;
built from published captures for nccl-tests, perftest, nvbandwidth and dcgmi), and their garbage behaviour."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.active import parse, parse_io
from slurm_tune.active.reading import FAIL, MAX_VALUE, OK, UNAVAILABLE, UNKNOWN, number

FIX = Path(__file__).parent / "fixtures" / "active"


def fixture(name: str) -> bytes:
    return (FIX / name).read_bytes()


def test_nccl_two_nodes_takes_largest_size_busbw_and_rank_count():
    r = parse.nccl_tests(fixture("nccl-allreduce-2node.txt"))
    assert r.status == OK and r.value == 338.82 and r.unit == "GB/s"
    assert r.extra["ranks"] == 16 and r.extra["avg_busbw"] == 70.742 and r.extra["size"] == 8589934592


def test_nccl_single_node_reads_library_version():
    r = parse.nccl_tests(fixture("nccl-allreduce-1node.txt"))
    assert (r.status, r.value, r.extra["nccl"]) == (OK, 235.91, "2.19.3")


def test_nccl_wrong_results_fail():
    r = parse.nccl_tests(fixture("nccl-allreduce-wrong.txt"))
    assert r.status == FAIL and "1024 wrong" in r.detail and r.value is None


@pytest.mark.parametrize(
    "name,why",
    [("nccl-allreduce-truncated.txt", "truncated"), ("nccl-allreduce-error.txt", "Test NCCL failure")],
)
def test_nccl_truncated_or_failed_is_unknown(name, why):
    r = parse.nccl_tests(fixture(name))
    assert r.status == UNKNOWN and why in r.detail and r.value is None


def test_nccl_cut_after_some_rows_is_unknown_not_slow():
    text = fixture("nccl-allreduce-1node.txt").decode()
    cut = text[: text.index("# Out of bounds")]
    r = parse.nccl_tests(cut)
    assert r.status == UNKNOWN and "truncated" in r.detail


def test_perftest_gbit_table_with_interleaved_warning():
    r = parse_io.perftest_bw(fixture("ib_write_bw-hdr.txt"))
    assert (r.status, r.value, r.unit) == (OK, 196.79, "Gb/s")


def test_perftest_mbsec_all_sizes_takes_last_and_converts():
    r = parse_io.perftest_bw(fixture("ib_write_bw-mbsec-all.txt"))
    assert r.status == OK and r.value == pytest.approx(23451.98 * 1048576 * 8 / 1e9, rel=1e-4)


@pytest.mark.parametrize(
    "name,why",
    [("ib_write_bw-refused.txt", "Couldn't connect"), ("ib_write_bw-truncated.txt", "no readable row")],
)
def test_perftest_errors_are_unknown(name, why):
    r = parse_io.perftest_bw(fixture(name))
    assert r.status == UNKNOWN and why in r.detail


def test_perftest_table_without_closing_line_is_unknown():
    text = fixture("ib_write_bw-hdr.txt").decode().rstrip().rsplit("\n", 1)[0]
    assert parse_io.perftest_bw(text).status == UNKNOWN


def test_fio_real_capture():
    r = parse_io.fio_json(fixture("fio-read.json"))
    assert r.status == OK and r.value == pytest.approx(1766022736 / 1e9) and r.extra["fio"] == "fio-3.33"


def test_fio_error_line_before_json_and_job_error_is_unknown():
    r = parse_io.fio_json(fixture("fio-error.json"))
    assert r.status == UNKNOWN and "error 1" in r.detail


def test_fio_truncated_json_is_unknown():
    assert parse_io.fio_json(fixture("fio-read.json")[:900]).status == UNKNOWN


def test_dd_real_capture_uses_exact_bytes_over_seconds():
    r = parse_io.dd(fixture("dd-read.txt"))
    assert r.status == OK and r.value == pytest.approx(67108864 / 0.0578272 / 1e9, rel=1e-6)


def test_dd_progress_lines_and_old_format():
    text = (
        "1048576000 bytes (1.0 GB, 1000 MiB) copied, 1 s, 1.0 GB/s\r2097152000 bytes (2.1 GB, 2.0 GiB) copied,"
        " 2 s, 1.0 GB/s\n2000+0 records in\n2000+0 records out\n2097152000 bytes (2.1 GB) copied, 2.5 s, 839 MB/s\n"
    )
    assert parse_io.dd(text).value == pytest.approx(2097152000 / 2.5 / 1e9)


def test_dd_error_is_unknown():
    r = parse_io.dd(fixture("dd-error.txt"))
    assert r.status == UNKNOWN and "failed to open" in r.detail


def test_iperf3_real_capture_and_refused():
    r = parse_io.iperf3_json(fixture("iperf3-client.json"))
    assert r.status == OK and r.value > 0 and r.unit == "Gb/s" and r.extra["iperf3"].startswith("iperf 3")
    bad = parse_io.iperf3_json(fixture("iperf3-refused.json"))
    assert bad.status == UNKNOWN and "Connection refused" in bad.detail


def test_nvbandwidth_sum_and_slowest_gpu():
    r = parse.nvbandwidth(fixture("nvbandwidth-h2d.txt"))
    assert r.status == OK and r.value == 428.53 and r.extra["slowest"] == 41.02
    assert r.extra["slowest_at"] == "0->6" and r.extra["cuda"] == "13.3"
    assert parse.nvbandwidth(fixture("nvbandwidth-h2d.txt"), "device_to_host_memcpy_ce").value == 441.72
    old = parse.nvbandwidth(fixture("nvbandwidth-v05.txt"))
    assert old.value == 25.17 and old.extra["cuda"] == "12.4" and old.extra["driver"] == "550.54.15"


def test_nvbandwidth_waived_or_missing_is_unknown():
    assert "waived" in parse.nvbandwidth(fixture("nvbandwidth-waived.txt")).detail
    assert parse.nvbandwidth(fixture("nvbandwidth-h2d.txt"), "device_local_copy").status == UNKNOWN


def test_dcgmi_pass_fail_and_error():
    ok = parse.dcgmi_diag(fixture("dcgmi-diag-r2-pass.txt"))
    assert ok.status == OK and ok.extra["tests"] == 12 and ok.extra["driver"] == "535.104.12"
    v4 = parse.dcgmi_diag(fixture("dcgmi-diag-r2-fail-v4.txt"))
    assert v4.status == FAIL and "pcie" in v4.detail and "link width" in v4.detail
    legacy = parse.dcgmi_diag(fixture("dcgmi-diag-legacy-fail.txt"))
    assert legacy.status == FAIL and "GPU Memory" in legacy.detail and "cudaMalloc" in legacy.detail
    err = parse.dcgmi_diag(fixture("dcgmi-diag-error.txt"))
    assert err.status == UNKNOWN and "Host engine" in err.detail


def test_dcgmi_keeps_the_error_row_and_joins_rows_cut_mid_word():
    """DCGM 3.x (the published 3.1.8 capture's layout): an `Error` row under the failing test, its text cut
    into 45-character pieces in the middle of words ("disab|led", "currently |  disabled")."""
    r = parse.dcgmi_diag(fixture("dcgmi-diag-r1-error-wrapped.txt"))
    assert r.status == FAIL and r.extra["failed"] == ["Persistence Mode"]
    assert r.detail.startswith(
        "dcgmi diag Persistence Mode: Persistence mode for GPU 0 is currently disabled. "
        "The DCGM diagnostic requires peristence mode to be enabled. Enable persistence "
        "mode by running"
    ), r.detail


def _dcgm_table(test: str, label: str, message: str) -> str:
    """A dcgmi diag table with `message` under a failing `test`, cut the way DCGM 3.x cuts it."""
    pieces = [message[i : i + 45] for i in range(0, len(message), 45)]
    rows = [f"| {label if i == 0 else '':<25} | {piece:<45}  |" for i, piece in enumerate(pieces)]
    return "\n".join(
        [
            "+---------------------------+------------------------------------------------+",
            f"| {'Diagnostic':<25} | {'Result':<46} |",
            "+===========================+================================================+",
            f"| {test:<25} | {'Fail':<46} |",
            *rows,
            f"| {'Inforom':<25} | {'Pass':<46} |",
            "+---------------------------+------------------------------------------------+",
            "",
        ]
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyzGPU0123456789.,<>-", min_size=1, max_size=14),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from(["Error", "Warning", "Info"]),
)
def test_dcgmi_message_cut_anywhere_comes_back_whole(words, label):
    message = " ".join(words)
    r = parse.dcgmi_diag(_dcgm_table("Persistence Mode", label, message))
    assert r.status == FAIL and r.detail == f"dcgmi diag Persistence Mode: {message[:160]}"


def test_dcgmi_failure_words_are_never_split():
    message = (
        "Persistence mode check failed on GPU 2: the GPU did not respond; check DCGM and system logs "
        "for errors"
    )
    r = parse.dcgmi_diag(_dcgm_table("Persistence Mode", "Error", message))
    assert r.detail == f"dcgmi diag Persistence Mode: {message}"


def test_dcgmi_truncated_table_is_unknown():
    text = fixture("dcgmi-diag-r2-pass.txt").decode().rstrip().rsplit("\n", 1)[0]
    assert parse.dcgmi_diag(text).status == UNKNOWN


ALL = [
    (parse.nccl_tests, "nccl-allreduce-1node.txt"),
    (parse_io.perftest_bw, "ib_write_bw-hdr.txt"),
    (parse_io.fio_json, "fio-read.json"),
    (parse_io.dd, "dd-read.txt"),
    (parse_io.iperf3_json, "iperf3-client.json"),
    (parse.nvbandwidth, "nvbandwidth-h2d.txt"),
    (parse.dcgmi_diag, "dcgmi-diag-r2-pass.txt"),
    (parse.numeric, "numeric-8gpu.txt"),
]


def _sane(r):
    assert r.status in (OK, FAIL, UNKNOWN)
    if r.status == UNKNOWN:
        assert r.value is None
    if r.value is not None:
        assert isinstance(r.value, float) and 0 <= r.value <= MAX_VALUE * 10 and r.value == r.value
    assert isinstance(r.detail, str) and "\n" not in r.detail


@pytest.mark.parametrize("parser,name", ALL)
def test_every_truncation_is_never_a_different_number(parser, name):
    """Cutting a real output anywhere gives unknown (or, cut inside trailing notes, the full result)."""
    data = fixture(name)
    full = parser(data)
    for cut in range(0, len(data), max(1, len(data) // 300)):
        r = parser(data[:cut])
        _sane(r)
        assert r.status == UNKNOWN or r.value == full.value, (cut, r)


def mutate(data, whole: bytes) -> bytes:
    """`whole` with up to 8 byte-level changes drawn from hypothesis' `data`: flips, inserts, deletions, and
    a huge number."""
    base = bytearray(whole)
    for _ in range(data.draw(st.integers(0, 8))):
        pos = data.draw(st.integers(0, max(0, len(base) - 1)))
        choice = data.draw(st.sampled_from(["flip", "insert", "delete", "huge"]))
        if not base:
            break
        if choice == "flip":
            base[pos] = data.draw(st.integers(0, 255))
        elif choice == "insert":
            base[pos:pos] = data.draw(st.binary(max_size=16))
        elif choice == "delete":
            del base[pos : pos + data.draw(st.integers(1, 64))]
        else:
            base[pos:pos] = b"9" * 400 + b".5"
    return bytes(base)


@pytest.mark.parametrize("parser,name", ALL)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_byte_level_fuzz_never_raises(parser, name, data):
    _sane(parser(mutate(data, fixture(name))))


@pytest.mark.parametrize("parser,name", ALL)
@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=2048))
def test_random_bytes_are_unknown(parser, name, blob):
    r = parser(blob)
    _sane(r)
    assert r.status == UNKNOWN


@pytest.mark.parametrize(
    "token", ["nan", "inf", "1e999", "1_000", "-5", "+5", "٣", "1.2.3", "", " 5", "9" * 30]
)
def test_number_rejects_foreign_notations(token):
    assert number(token) is None


def test_numeric_consistency_agree_differ_and_unavailable():
    text = fixture("numeric-8gpu.txt").decode()
    assert parse.numeric(text).status == OK and parse.numeric(text).extra["devices"] == 8
    bad = text.replace(
        "device 5 NVIDIA H100 80GB HBM3 sha256 "
        + text.split("device 5 NVIDIA H100 80GB HBM3 sha256 ")[1][:64],
        "device 5 NVIDIA H100 80GB HBM3 sha256 " + "0" * 64,
    )
    r = parse.numeric(bad)
    assert r.status == FAIL and r.extra["gpus"] == [5] and "silent data corruption" in r.detail
    assert parse.numeric(text.replace("stune-numeric done 8\n", "")).status == UNKNOWN
    gone = parse.numeric("stune-numeric unavailable: neither PyTorch nor CuPy is installed for this Python\n")
    assert gone.status == UNAVAILABLE and "install PyTorch or CuPy" in gone.detail  # a missing tool
    blind = parse.numeric(
        "stune-numeric unknown: PyTorch sees no CUDA GPU\n"
    )  # installed, no GPU: the node's
    assert blind.status == UNKNOWN and "PyTorch sees no CUDA GPU" in blind.detail


def test_numeric_agent_without_torch_or_cupy_is_not_available_never_fail(tmp_path):
    """This Python has neither (a `python` that hides them stands in where they are installed): the run
    is stored as `unavailable`, which the sweep summarizes as "not available", like a missing tool."""
    import json
    import os
    import sys

    from slurm_tune.active import agent

    python = sys.executable
    if any(importlib.util.find_spec(m) for m in ("torch", "cupy")):
        hide = tmp_path / "hide"
        hide.mkdir()
        for m in ("torch", "cupy"):
            (hide / f"{m}.py").write_text("raise ImportError('hidden')\n")
        python = tmp_path / "python"
        python.write_text(f'#!/bin/sh\nPYTHONPATH={hide} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
    lines = []
    agent.run_spec(
        {
            "check": "numeric",
            "subject": "n1",
            "nodes": ["n1"],
            "runs": 1,
            "run_timeout": 60,
            "tools": {"python": str(python)},
        },
        lines.append,
        dict(os.environ),
    )
    (r,) = [json.loads(x[len(agent.MARK) :]) for x in lines]
    assert r["status"] == "unavailable" and r["value"] is None, r
    assert "neither PyTorch nor CuPy" in r["detail"] and "install PyTorch or CuPy" in r["detail"]
