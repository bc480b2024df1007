"""The active checks of AMD and Ascend partitions (issue 26): HCCL Test's and rccl-tests' outputs read from the
real captures (tests/fixtures/comm: hcclTest-*, hccl-*, rccl*), every truncation and byte-level garbage; the
vendor's fingerprint, baselines kept apart from NVIDIA's, results stored before the vendor keys still judged as
before; the checks a partition of each vendor runs, and their jobs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_active_cli import sweep_cli
from test_active_parse import _sane, mutate

from slurm_tune.active import agent, checks, jobs, judge, parse, parse_accel, report, store, sweep
from slurm_tune.active.agent import MARK
from slurm_tune.active.reading import FAIL, OK, UNKNOWN
from slurm_tune.profiles import load_profile

COMM = Path(__file__).parent / "fixtures" / "comm"
STANDINS = Path(__file__).parent / "active_standins"
HCCL_DOC = "hcclTest-allreduce-docexample.txt"
# The two rccl-tests captures are excerpts cut before nccl-tests' closing lines (SOURCES.md): the closing lines
# every complete run prints, added where a test needs a whole run (with srun's label for rccl1490).
CLOSING = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.0312\n"


def comm(name: str) -> str:
    return (COMM / name).read_text()


# ---- HCCL Test ----------------------------------------------------------------------------------------------
def test_hccl_test_reads_the_algorithm_bandwidth_at_the_largest_size():
    r = parse_accel.hccl_test((COMM / HCCL_DOC).read_bytes())
    assert (r.status, r.value, r.unit) == (OK, 23.76245, "GB/s")
    assert r.extra == {"rows": 14, "size": 67108864}
    assert r.detail == "algbw 23.7625 GB/s at 67108864 B"


def test_hccl_test_as_the_binary_spells_it_and_behind_mpiruns_tags():
    text = comm(HCCL_DOC).replace("avg_time(us):", "aveg_time(us):")
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in text.splitlines())
    for variant in (text, tagged):
        r = parse_accel.hccl_test(variant)
        assert (r.status, r.value) == (OK, 23.76245), r


def test_hccl_test_unchecked_results_pass_and_say_so():
    text = comm(HCCL_DOC).replace("| success", "| NULL")
    text = "Warning: The calculation result overflows, No verification is performed.\n" + text
    r = parse_accel.hccl_test(text)
    assert r.status == OK and r.value == 23.76245 and r.detail.endswith("results not checked (NULL)")


def test_hccl_test_a_failed_result_check_fails_naming_the_size_and_rank():
    lines = comm(HCCL_DOC).splitlines()
    lines[-1] = lines[-1].replace("success", "failed")
    r = parse_accel.hccl_test("\n".join([*lines[:2], "rank id 5, check result failed", *lines[2:]]) + "\n")
    assert r.status == FAIL and r.value is None
    assert (
        r.detail == "hccl_test: result check failed at 67108864 B on rank 5 (wrong results on a collective)"
    )


@pytest.mark.parametrize(
    "text,why",
    [
        (  # the documented "retcode: 7" failure: a stale hccl_test elsewhere in the cluster
            "the minbytes is 8192, maxbytes is 2147483648, iters is 20, warmup_iters is 5\n"
            "hccl interface return err ./common/src/hccl_test_common.cc:538, retcode: 7 \n"
            "This is an error in init_hcclComm.\n",
            "hccl_test error: hccl interface return err ./common/src/hccl_test_common.cc:538, retcode: 7",
        ),
        (
            "".join(comm(HCCL_DOC).splitlines(True)[:-3]),
            "truncated hccl_test output (11 rows, none at maxbytes",
        ),
        (
            "".join(comm(HCCL_DOC).splitlines(True)[1:]),
            "hccl_test output without its `the minbytes is ...` line",
        ),
        (comm(HCCL_DOC).splitlines(True)[0], "no result rows in the hccl_test output"),
    ],
)
def test_hccl_test_errors_and_cut_runs_are_unknown(text, why):
    r = parse_accel.hccl_test(text)
    assert r.status == UNKNOWN and r.value is None and r.detail.startswith(why), r


def test_hccl_test_complete_when_its_own_sequence_would_pass_maxbytes():
    """-b 8K -e 100K -f 2: the last size is 65536 and the next (131072) would pass maxbytes."""
    head = "the minbytes is 8192, maxbytes is 102400, iters is 20, warmup_iters is 5\n"
    rows = "".join(line for line in comm(HCCL_DOC).splitlines(True)[1:6])
    assert parse_accel.hccl_test(head + rows).value == 0.06782
    assert parse_accel.hccl_test(head + rows.rsplit("65536", 1)[0]).status == UNKNOWN  # cut at 32768


@pytest.mark.parametrize("name", sorted(p.name for p in COMM.glob("hccl-*.txt")))
def test_every_hccl_error_capture_is_an_unknown_hccl_test_naming_the_error(name):
    r = parse_accel.hccl_test((COMM / name).read_bytes())
    assert r.status == UNKNOWN and r.value is None and r.detail.startswith("hccl_test error: "), r


# ---- rccl-tests through the nccl-tests parser ---------------------------------------------------------------
def test_rccl_old_layout_with_error_column_is_read_and_needs_its_closing_lines():
    text = comm("rccltests-table-mi250x-rccl929.txt")
    cut = parse.nccl_tests(text)  # the capture: cut at 1024 B, before the closing lines
    assert (
        cut.status == UNKNOWN
        and cut.detail == "truncated nccl-tests output (8 rows, no closing average line)"
    )
    r = parse.nccl_tests(text + CLOSING)
    assert (r.status, r.value, r.extra["size"], r.extra["avg_busbw"]) == (OK, 0.11, 1024, 0.0312)


def test_rccl_old_layout_out_of_bounds_count_fails():
    r = parse.nccl_tests(comm("rccltests-table-mi250x-rccl929.txt") + CLOSING.replace(": 0 OK", ": 3 FAILED"))
    assert r.status == FAIL and r.detail.startswith("3 out-of-bounds values")


def test_rccl_rows_behind_srun_labels_are_read():
    text = comm("rccltests-allgather-srunlabel-rccl1490.txt")
    assert parse.nccl_tests(text).detail == "truncated nccl-tests output (5 rows, no closing average line)"
    r = parse.nccl_tests(text + "".join(f" 0: {line}\n" for line in CLOSING.splitlines()))
    assert (r.status, r.value, r.extra["size"]) == (OK, 0.78, 1048576)


def test_rccl_banner_gives_rccl_and_rocm_versions_and_its_msccl_warning_is_no_error():
    r = parse.nccl_tests(comm("rccl-socket-mi50-rcclTests163.txt"))
    assert (
        r.status == UNKNOWN
        and r.extra["nccl"] == r.extra["rccl"] == "2.21.5"
        and r.extra["rocm"] == "6.3.3.0"
    )
    warned = parse.nccl_tests(comm("rccl-init-msccl-warn-rcclTests163.txt"))
    assert warned.detail == "no result rows in the nccl-tests output"  # not "nccl-tests error: ... MSCCL++"
    whole = (
        comm("rccl-init-msccl-warn-rcclTests163.txt") + comm("rccltests-table-mi250x-rccl929.txt") + CLOSING
    )
    assert parse.nccl_tests(whole).value == 0.11


def test_rccl_version_line_of_nccl_debug_version():
    r = parse.nccl_tests("RCCL version 2.18.3+hip6.0 HEAD:abc\n" + comm("rccltests-table-mi250x-rccl929.txt"))
    assert (r.extra["nccl"], r.extra["hip"]) == ("2.18.3", "6.0")


# ---- garbage ------------------------------------------------------------------------------------------------
WHOLE = {
    "hccl": (parse_accel.hccl_test, comm(HCCL_DOC).encode()),
    "rccl-srun": (
        parse.nccl_tests,
        (
            comm("rccltests-allgather-srunlabel-rccl1490.txt")
            + "".join(f" 0: {line}\n" for line in CLOSING.splitlines())
        ).encode(),
    ),
    "rccl-old": (parse.nccl_tests, (comm("rccltests-table-mi250x-rccl929.txt") + CLOSING).encode()),
}


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_every_truncation_is_unknown_or_the_whole_result(name):
    parser, data = WHOLE[name]
    whole = parser(data)
    assert whole.status == OK
    for cut in range(len(data)):
        r = parser(data[:cut])
        _sane(r)
        assert r.status == UNKNOWN or r.value == whole.value, (cut, r)


@pytest.mark.parametrize("name", sorted(WHOLE))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_byte_level_fuzz_never_raises(name, data):
    parser, whole = WHOLE[name]
    _sane(parser(mutate(data, whole)))


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=2048))
def test_random_bytes_are_unknown_to_hccl_test(blob):
    r = parse_accel.hccl_test(blob)
    _sane(r)
    assert r.status == UNKNOWN


# ---- fingerprints and baselines -----------------------------------------------------------------------------
def node_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    files = {
        "proc/sys/kernel/osrelease": "5.10.0-182.0.0.95.oe2203sp3.aarch64\n",
        "usr/local/Ascend/driver/version.info": "Version=24.1.rc2\nascendhal_version=7.35.19\n",
        "usr/local/Ascend/firmware/version.info": "Version=7.5.0.1.129\nfirmware_version=1.0\n",
        "usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info": (
            "package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C18SPC001B220\narch=aarch64\n"
        ),
        "opt/rocm/.info/version": "6.2.0-66\n",
        "sys/module/amdgpu/version": "6.8.5\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_fingerprint_names_the_vendor_and_its_versions(tmp_path):
    env = {"STUNE_SYSFS_ROOT": str(node_root(tmp_path))}
    base = {
        "driver": "",
        "cuda": "",
        "nccl": "",
        "hca_fw": "",
        "kernel": "5.10.0-182.0.0.95.oe2203sp3.aarch64",
    }
    assert agent.fingerprint(env) == base  # NVIDIA: the five parts it always had, no vendor
    assert agent.fingerprint(env, "ascend") == dict(
        base, vendor="ascend", npu_driver="24.1.rc2", npu_firmware="7.5.0.1.129", cann="8.0.RC2"
    )
    assert agent.fingerprint(env, "amd") == dict(base, vendor="amd", rocm="6.2.0-66", amdgpu_driver="6.8.5")


def test_hccl_allreduce_job_runs_hccl_test_and_fingerprints_ascend(tmp_path):
    values = tmp_path / "v.json"
    values.write_text(json.dumps({"all_reduce_test": {"n1": [21.5, "wrong"]}}))
    lines: list[str] = []
    spec = {
        "check": "hccl_allreduce",
        "subject": "n1",
        "nodes": ["n1"],
        "runs": 2,
        "run_timeout": 10,
        "accelerator": "ascend",
        "command": "all_reduce_test -b 8K -e 64M -f 2 -d fp32 -o sum -p {gpus}",  # no mpirun here
        "tools": {"all_reduce_test": str(STANDINS / "all_reduce_test")},
    }
    environ = dict(
        os.environ,
        STUNE_STANDIN_VALUES=str(values),
        STUNE_STANDIN_STATE=str(tmp_path),
        SLURM_JOB_NODELIST="n1",
        STUNE_SYSFS_ROOT=str(node_root(tmp_path)),
    )
    agent.run_spec(spec, lines.append, environ)
    first, second = (json.loads(line[len(MARK) :]) for line in lines)
    assert (first["status"], first["value"], first["unit"], first["tool"]) == (
        "ok",
        21.5,
        "GB/s",
        "all_reduce_test",
    )
    assert second["status"] == "fail" and "result check failed" in second["detail"]
    assert first["fingerprint"]["vendor"] == "ascend" and first["fingerprint"]["cann"] == "8.0.RC2"
    assert store.valid(first) and store.valid(second)


FP = {"driver": "535.104.05", "cuda": "12.2", "nccl": "2.19.3", "hca_fw": "20.31.1014", "kernel": "5.15.0"}
SETTINGS = judge.Settings(k=2, n=3, mad_factor=3.0, min_drop=0.10, min_peers=3, floors={})


def results(nodes, value, fp, check="ib_write_bw", at=1000.0, slow=()):
    return [
        {
            "at": at + i * 3 + r,
            "sweep": "s1",
            "partition": "p",
            "check": check,
            "subject": node,
            "nodes": [node],
            "hca": None,
            "run": r,
            "status": "ok",
            "value": value * (0.6 if node in slow and r != 1 else 1.0),
            "unit": "Gb/s",
            "detail": "",
            "fingerprint": dict(fp),
            "job": "1",
        }
        for i, node in enumerate(nodes)
        for r in range(3)
    ]


def test_the_fingerprint_key_of_an_nvidia_result_is_what_it_always_was():
    old = "driver=535.104.05 cuda=12.2 nccl=2.19.3 hca_fw=20.31.1014 kernel=5.15.0"
    assert store.fingerprint_key(FP) == old
    assert store.fingerprint_key(dict(FP, vendor="nvidia")) == old
    ascend = dict(FP, vendor="ascend", npu_driver="24.1.rc2", npu_firmware="7.5.0.1.129", cann="8.0.RC2")
    assert (
        store.fingerprint_key(ascend)
        == f"{old} vendor=ascend npu_driver=24.1.rc2 npu_firmware=7.5.0.1.129 cann=8.0.RC2"
    )
    assert (
        store.fingerprint_key(dict(FP, vendor="amd", rocm="6.2.0"))
        == f"{old} vendor=amd rocm=6.2.0 amdgpu_driver=?"
    )


def test_results_stored_before_the_vendor_keys_load_and_share_a_baseline_with_new_ones(tmp_path):
    """Lines as stune wrote them before issue 26 (a five-part fingerprint), then new NVIDIA results: one
    baseline, and the slow node judged against all of them."""
    directory = tmp_path / "store" / "results" / "p"
    directory.mkdir(parents=True)
    now = time.time() - 3600
    old = results(["n1", "n2", "n3"], 100.0, FP, at=now)
    (directory / f"{time.strftime('%Y-%m', time.gmtime(now))}.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in old)
    )
    store.append(str(tmp_path / "store"), "p", results(["n4"], 100.0, FP, at=now + 100, slow=("n4",)))
    loaded = store.load(str(tmp_path / "store"), "p", since=now - 10)
    assert len(loaded) == 12 and all(set(r["fingerprint"]) == set(FP) for r in loaded)
    bases, verdicts = judge.judge(loaded, SETTINGS)
    (base,) = bases.values()
    assert base.subjects == 4 and base.fingerprint == store.fingerprint_key(FP)
    by = {v.subject: v for v in verdicts}
    assert by["n4"].status == judge.OUTLIER and "vs partition median 100" in by["n4"].reason


def test_an_ascend_result_never_joins_an_nvidia_baseline():
    """The same check (ib_write_bw) with the same base versions: Ascend nodes get a baseline of their own, and
    a lone Ascend node is not judged against NVIDIA peers."""
    ascend = dict(FP, vendor="ascend", npu_driver="24.1.rc2", npu_firmware="7.5.0.1.129", cann="8.0.RC2")
    nvidia = results(["g1", "g2", "g3"], 196.0, FP)
    bases, verdicts = judge.judge(nvidia + results(["a1"], 90.0, ascend, at=2000.0), SETTINGS)
    assert sorted(b.subjects for b in bases.values()) == [1, 3]
    by = {v.subject: v for v in verdicts}
    assert by["a1"].status == judge.UNKNOWN and by["a1"].reason.startswith("no baseline: 1 subject(s)")
    assert {by[g].status for g in ("g1", "g2", "g3")} == {judge.OK}
    rows = {r["subject"]: r for r in report.rows(nvidia + results(["a1"], 90.0, ascend, at=2000.0), SETTINGS)}
    assert "vendor=ascend" in rows["a1"]["fingerprint"] and "vendor" not in rows["g1"]["fingerprint"]
    assert rows["g1"]["baseline"] == 196.0 and rows["a1"]["baseline"] == 90.0


def test_report_drift_names_a_vendor_change():
    amd = dict(FP, vendor="amd", rocm="6.2.0", amdgpu_driver="6.8.5")
    rows = report.drift(results(["n1"], 100.0, FP) + results(["n1"], 80.0, amd, at=2000.0))
    (row,) = rows
    assert row["changed"] == "vendor nvidia -> amd, rocm ? -> 6.2.0, amdgpu_driver ? -> 6.8.5"
    assert (row["before"], row["after"]) == (100.0, 80.0)


# ---- which checks a partition runs --------------------------------------------------------------------------
ASCEND_PROFILE = """partition: asc
accelerator: ascend
fabric: {type: tcp, socket_ifname: eth0}
gpu: {count: 8}
active:
  checks:
    nccl_allreduce: {}
    hccl_allreduce: {time_limit: 5m}
    iperf3: {}
"""


def ascend_profile(tmp_path: Path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "asc.yaml").write_text(ASCEND_PROFILE)
    return load_profile("asc", str(tmp_path / "p"))


def test_an_ascend_partition_runs_its_own_checks_and_says_why_not_nvidias(tmp_path):
    profile = ascend_profile(tmp_path)
    assert [c.name for c, _ in checks.configured(profile)] == ["hccl_allreduce", "iperf3"]
    ((skipped, why),) = checks.skipped(profile)
    assert skipped.name == "nccl_allreduce"
    assert why == (
        "nccl_allreduce is for nvidia partitions; this partition's accelerator is ascend: not run "
        "(hccl_allreduce is its all-reduce check)"
    )
    listing = {c["name"]: c for c in report.checks_listing(profile)}
    assert (
        listing["hccl_allreduce"]["accelerators"] == ["ascend"]
        and listing["hccl_allreduce"]["not_run"] is None
    )
    assert listing["hccl_allreduce"]["command"].startswith("mpirun -n {gpus} all_reduce_test")
    assert listing["nccl_allreduce"]["not_run"] == why
    text = report.checks_text(report.checks_listing(profile))
    assert "hccl_allreduce  node HCCL all-reduce algorithm bandwidth (GB/s) [ascend]" in text
    assert f"\n{'':20}{why}\n" in text


def test_stune_sweep_checks_lists_the_vendors_checks(tmp_path):
    ascend_profile(tmp_path)
    out = sweep_cli("checks", "-p", "asc", "--json", env={"STUNE_PARTITIONS": str(tmp_path / "p")})
    assert out.returncode == 0, out.stderr
    by_name = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert sorted(by_name) == ["hccl_allreduce", "iperf3", "nccl_allreduce"]
    assert by_name["hccl_allreduce"]["time_limit_s"] == 300 and by_name["nccl_allreduce"]["not_run"]
    everything = {c["name"]: c for c in json.loads(sweep_cli("checks", "--json").stdout)["checks"]}
    assert everything["rccl_allreduce"]["accelerators"] == ["amd"]
    assert everything["rccl_allreduce"]["command"] == "all_reduce_perf -b 1G -e 8G -f 2 -g {gpus}"
    assert everything["iperf3"]["accelerators"] == ["nvidia", "amd", "ascend"]


def test_an_ascend_check_job_asks_for_the_npus_and_tells_the_agent_the_vendor(tmp_path):
    profile = ascend_profile(tmp_path)
    (check, setting), _ = checks.configured(profile)
    opts = sweep.Options("asc", str(tmp_path / "store"))
    args = jobs.sbatch_args(profile, opts, check, setting.time_limit, ["a1"], "stune-active:hccl_allreduce")
    assert "--gres=npu:8" in args
    spec = jobs.job_spec(profile, opts, check, setting, "a1", ["a1"], "s1", {})
    assert spec["accelerator"] == "ascend" and spec["gpus"] == 8


def test_a_sweep_says_which_configured_checks_are_another_vendors(tmp_path):
    profile = ascend_profile(tmp_path)
    said: list[str] = []
    slurm = SimpleNamespace(nodes=lambda *a, **k: [])  # no idle node: the sweep stops after saying so
    out = sweep.sweep(
        slurm, profile, sweep.Options("asc", str(tmp_path / "store"), dry_run=True), log=said.append
    )
    assert out["nodes"] == [] and said[0].startswith("nccl_allreduce is for nvidia partitions")
