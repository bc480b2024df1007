"""The reliability report (reliability/history.py, events.py, causes.py, report.py, render.py): real sacct
and sacctmgr outputs read as they are, each cause from its evidence, the numbers of a small history worked out
by hand, the Llama 3 paper's 54-day run as stune's table, and every output format."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest
from reliability_history import ERRORS, OK, Site, generate

from slurm_tune.cli.health import main as health_main
from slurm_tune.reliability import causes, events, history, render, report
from slurm_tune.usage.jobfiles import job_tokens

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reliability"
HEADER = "|".join(history.FIELDS)


def local(*ymd_hms) -> int:
    y, mo, d, h = (*ymd_hms, 0)[:4]
    return int(time.mktime((y, mo, d, h, 0, 0, 0, 0, -1)))


# ---- reading ---------------------------------------------------------------------------------------------------
def test_the_dev_clusters_node_fail_and_its_requeue():
    """A 2-node job whose node n2 was set DOWN with stune's reason: sacct -D shows the NODE_FAIL run and the
    requeued run (pending, then cancelled: never ran); the event names n2 and Xid 79."""
    runs = history.read_file(str(FIXTURES / "sacct_node_fail_requeue_22.05.8.txt"))
    assert runs.n == 1 and runs.state_name(0) == "NODE_FAIL" and runs.hosts(0) == ("n1", "n2")
    assert (runs.nodes[0], runs.elapsed[0], runs.partition_name(0)) == (2, 4, "hdr") and runs.skipped == 0
    evs = events.read_file(str(FIXTURES / "sacctmgr_show_event_22.05.8.txt"))
    assert [(e.node, e.kind, e.xid, e.code) for v in evs.by_node.values() for e in v] == [
        ("n1", "admin", None, "admin | bios update"),  # a '|' in a reason stays in it
        ("n2", "health", 79, "xid79"),
        ("n3", "health", 48, "xid48"),
    ]
    found = causes.classify(runs, evs)
    assert found.name(0) == "hardware" and found.code[0] == "xid79" and found.suspects[0] == ("n2",)
    assert found.caught == {0}
    alone = causes.classify(runs)
    assert alone.name(0) == "node_failure" and not alone.suspects and not alone.with_events


def test_columns_in_any_order_iso_times_and_bad_rows():
    start = local(2026, 3, 2, 10)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))
    fields = ["NodeList", "State", "JobIDRaw", "NNodes", "Start", "End", "ElapsedRaw", "Partition"]
    rows = [
        f"n[1-2]|COMPLETED|7|2|{iso}|{start + 60}|60|p",
        "n1|COMPLETED|7.batch|1|1|2|1|p",  # a step row: passed over
        "None assigned|PENDING|8|1|Unknown|Unknown|0|p",  # never ran: passed over
        "n3|FAILED|9|1|yesterday|Unknown|5|p",  # unreadable Start: skipped, counted
        "n4|FAILED|10|0|100|200|100|p",  # NNodes 0: skipped, counted
        "n5|RUNNING|11|1",  # a cut line
        "n5|RUNNING|12|1|100|Unknown|50|p",
    ]
    runs = history.parse("|".join(fields) + "\n" + "\n".join(rows) + "\n")
    assert runs.job_id == ["7", "12"] and runs.start.tolist() == [start, 100] and runs.end.tolist()[1] == -1
    assert runs.skipped == 3 and len(runs.skip_reasons) == 3 and "sacct:7: 4 fields" in runs.skip_reasons[0]
    assert runs.as_of == start + 60
    with pytest.raises(history.HistoryFormatError, match="header lacks NNodes, NodeList"):
        history.parse("JobIDRaw|Partition|State|Start|End|ElapsedRaw\n1|p|COMPLETED|1|2|1\n")
    with pytest.raises(history.HistoryFormatError, match="AdminComment must be the last"):
        history.parse(HEADER.replace("|AdminComment", "").replace("JobIDRaw", "AdminComment|JobIDRaw") + "\n")
    with pytest.raises(history.HistoryFormatError, match="empty"):
        history.parse("\n\n")
    with pytest.raises(history.HistoryFormatError, match="nope: cannot read"):
        history.read_file("nope")


def test_overlapping_exports_count_each_run_once():
    row = "5|5|u|p|{state}|100|{end}|{el}|2|node=2|n[1-2]|"
    text = "\n".join(
        [HEADER, row.format(state="RUNNING", end="Unknown", el=50), "6|6|u|p|COMPLETED|1|2|1|1||n1|"]
    )
    again = "\n".join([HEADER, row.format(state="NODE_FAIL", end=300, el=200)])
    runs = history.parse(text + "\n" + again.split("\n", 1)[1] + "\n")
    assert runs.job_id == ["6", "5"] and runs.state_name(1) == "NODE_FAIL" and runs.duplicates == 1


def test_event_lines_that_are_not_events():
    text = "\n".join(
        [
            "NodeName|TimeStart|TimeEnd|State|Reason",  # a header (a dump made without -n): passed over
            "n1|100|Unknown|DOWN|Not responding",
            "n2|100|200|IDLE+POWERED_DOWN|Powered down by power save",  # not out of service
            "n3|later|200|DRAIN|stune: gpu1 Xid 48",  # unreadable
            "n4|100",  # cut
            "n5|100|200|DOWN+DRAIN|stune: xXid 79 and Xid 9999999 then NHC",  # no Xid word: no code
            "n6|100|200|DRAIN|NHC: check_hw_ib: mlx5_0 port 1 down",
            "n7|100|200|DRAIN|Kill task failed",
        ]
    )
    evs = events.parse(text)
    kinds = {e.node: (e.kind, e.xid) for v in evs.by_node.values() for e in v}
    assert kinds == {
        "n1": ("slurm", None),
        "n5": ("health", None),
        "n6": ("health", None),
        "n7": ("slurm", None),
    }
    assert evs.skipped == 2 and "2 unreadable node event line(s)" in evs.warnings()[0]
    assert events.classify("stune: gpu3 Xid 79 (+1 more)") == ("health", 79)
    # the incident engine's drain for repair (issue 25 §1) names the code the same way
    assert events.classify("stune: repair: gpu2 Xid 48 x3 after reset 05-12 12:05") == ("health", 48)
    assert events.classify("bad PSU, ticket 17") == ("admin", None)


# ---- causes ----------------------------------------------------------------------------------------------------
def test_each_state_and_each_piece_of_evidence():
    t = 1_800_000_000
    comm_one = job_tokens([{"node": "a1", "comm": ERRORS}, {"node": "a2", "comm": OK}])
    comm_all = job_tokens([{"node": "a1", "comm": ERRORS}, {"node": "a2", "comm": ERRORS}])
    summary = "stune1 held=1.0 used=1.0 cov=1.0 busy=0.0 busy_w=- gpus=16 nodes=2/2 per_gpu= "
    cases = [
        ("COMPLETED", "", ""),
        ("RUNNING", "", ""),
        ("NODE_FAIL", "", "node_failure"),
        ("BOOT_FAIL", "", "node_failure"),
        ("FAILED", "", "user"),
        ("OUT_OF_MEMORY", "", "user"),
        ("TIMEOUT", "", "timeout"),
        ("CANCELLED by 0", "", "cancelled"),
        ("PREEMPTED", "", "preempted"),
        ("REQUEUED", "", "requeued"),
        ("FAILED", summary + comm_one, "nccl"),
        ("TIMEOUT", summary + comm_all, "nccl"),
        ("NODE_FAIL", summary + comm_one, "node_failure"),  # the survivors' errors: no evidence
        ("FAILED", "stune1 comm=garbage@c9;x commn=1/0/0", "user"),
        ("SOMETHING_NEW", "", "other"),
    ]
    rows = [HEADER] + [
        f"{i}|{i}|u|p|{state}|{t}|{t + 100}|100|2|node=2|a[1-2]|{comment}"
        for i, (state, comment, _) in enumerate(cases, 1)
    ]
    runs = history.parse("\n".join(rows) + "\n")
    found = causes.classify(runs)
    assert [found.name(i) for i in range(runs.n)] == [c for _, _, c in cases]
    assert found.suspects == {10: ("a1",)} and found.code[10] == "errors on a1" and found.code[11] == "errors"


def test_events_refine_causes_only_near_the_end_and_on_the_runs_nodes():
    t = 1_800_000_000
    rows = [HEADER]
    for i, state in enumerate(("NODE_FAIL", "NODE_FAIL", "FAILED", "FAILED", "NODE_FAIL", "CANCELLED"), 1):
        rows.append(f"{i}|{i}|u|p|{state}|{t}|{t + 1000 * i}|{1000 * i}|2|node=2|n[{2 * i}-{2 * i + 1}]|")
    ev = "\n".join(
        [
            f"n2|{t + 1000}|Unknown|DOWN|Not responding",  # run 1: Slurm's reason, n2 named
            f"n4|{t + 2000}|Unknown|DOWN|reboot for firmware",  # run 2: an operator's: admin
            f"n7|{t + 3000 + 600}|Unknown|DRAIN|stune: gpu3 Xid 79",  # run 3: a drain 10 min after: hardware
            f"n8|{t + 4000 + 3600}|Unknown|DRAIN|stune: gpu3 Xid 79",  # run 4: an hour later: not its
            f"n99|{t + 5000}|Unknown|DOWN|Not responding",  # run 5: not its node
            f"n12|{t + 6000}|Unknown|DOWN|stune: gpu3 Xid 79",  # run 6 was cancelled: stays so
        ]
    )
    found = causes.classify(history.parse("\n".join(rows) + "\n"), events.parse(ev))
    assert [found.name(i) for i in range(6)] == [
        "node_failure",
        "admin",
        "hardware",
        "user",
        "node_failure",
        "cancelled",
    ]
    assert found.suspects == {0: ("n2",), 1: ("n4",), 2: ("n7",)}
    assert found.code == {0: "Not responding", 1: "reboot for firmware", 2: "xid79"} and found.caught == {2}


# ---- the numbers of a small history ------------------------------------------------------------------------------
def _small():
    T = local(2026, 3, 1)
    d = 86400
    rows = [HEADER]

    def row(job, part, state, nodes, hosts, start, end, comment=""):
        elapsed = (end if end != "Unknown" else T + 10 * d) - start
        rows.append(
            f"{job}|{job}|u|{part}|{state}|{start}|{end}|{elapsed}|{nodes}|node={nodes}|{hosts}|{comment}"
        )

    comm_one = job_tokens([{"node": "y1", "comm": ERRORS}, {"node": "y2", "comm": OK}])
    row(1, "a", "COMPLETED", 4, "w[1-4]", T, T + d)
    row(2, "a", "NODE_FAIL", 2, "x[1-2]", T + d, T + d + d // 2)
    row(2, "a", "COMPLETED", 2, "x[1-2]", T + 2 * d, T + 3 * d)
    row(3, "a", "FAILED", 1, "z1", T + 3 * d, T + 3 * d + d // 4)
    row(4, "a", "CANCELLED by 0", 8, "v[1-8]", T + 4 * d, T + 4 * d + d // 2)
    row(5, "b", "FAILED", 2, "y[1-2]", T, T + 2 * d, "stune1 held=0.0 " + comm_one)
    row(6, "b", "RUNNING", 2, "u[1-2]", T + 5 * d, "Unknown")
    ev = f"x1|{T + d + d // 2 + 60}|Unknown|DOWN|stune: gpu3 Xid 79\n"
    runs = history.parse("\n".join(rows) + "\n")
    found = causes.classify(runs, events.parse(ev))
    settings = report.Settings(checkpoint_interval_s=7200, restart_overhead_s=1800)
    return report.build(runs, found, T, T + 10 * d, settings, events=1), T


def test_the_reports_numbers_on_a_known_history():
    """Node-days: a 4 + 1 + 2 + 0.25 + 4 = 11.25, b 4 + 10 (the running job until the window's end) = 14.
    Interruptions: a hardware (the NODE_FAIL its node's Xid drain explains), user, cancelled; b nccl.
    Hours run 246, infrastructure failures 2 (hardware, nccl): MTTF 123 h; unexpected 3: 82 h.
    ETTR, a checkpoint every 2 h (1 h lost per kill) and 30 min to restart: lost 2 + 1 + 2 node-hours,
    restart 1, the requeue's wait 12 h x 2 nodes = 24: (606 - 6) / (606 + 24)."""
    r, _ = _small()
    assert r.node_days == pytest.approx(25.25) and r.runs == 7
    assert (r.interruptions, r.unexpected, r.planned) == (4, 3, 1)
    assert r.per_1000_node_days == pytest.approx(4000 / 25.25)
    assert r.mttf_h == pytest.approx(123.0) and r.mttf_unexpected_h == pytest.approx(82.0)
    assert r.ettr == pytest.approx(600 / 630)
    a, b = r.rows
    assert (a.partition, a.month, a.node_days, a.interruptions) == ("a", "2026-03", pytest.approx(11.25), 3)
    assert a.by_cause == {"hardware": 1, "user": 1, "cancelled": 1} and a.unexpected == 2
    assert a.per_1000_node_days == pytest.approx(3000 / 11.25) and a.ettr == pytest.approx(266 / 294)
    assert (b.node_days, b.by_cause, b.ettr) == (pytest.approx(14.0), {"nccl": 1}, pytest.approx(334 / 336))
    sizes = {s.size: s for s in r.sizes}
    assert list(sizes) == ["1", "2", "3-4", "5-8"]
    two = sizes["2"]
    assert (two.runs, two.hours, two.failures, two.mttf_h) == (4, pytest.approx(204), 2, pytest.approx(102))
    assert two.projected_mttf_h == pytest.approx(606 / (2 * 2))  # 2 failures in 606 node-hours, 2 nodes
    assert sizes["1"].mttf_h is None and sizes["1"].failures == 0
    assert [(c.cause, c.code, c.count) for c in r.causes] == [
        ("hardware", "xid79", 1),
        ("nccl", "errors on some nodes", 1),
        ("user", "", 1),
        ("cancelled", "", 1),
    ]
    assert all(c.share == 0.25 for c in r.causes)


def test_a_run_over_a_month_boundary_is_split_and_counted_where_it_ends():
    start, end = local(2026, 3, 31), local(2026, 4, 2)
    text = f"{HEADER}\n1|1|u|p|FAILED|{start}|{end}|{end - start}|2|node=2|n[1-2]|\n"
    runs = history.parse(text)
    r = report.build(runs, causes.classify(runs), local(2026, 3, 1), local(2026, 5, 1))
    assert r.months == ["2026-03", "2026-04"]
    march, april = r.rows
    assert (march.node_days, march.interruptions) == (pytest.approx(2.0), 0)
    assert (april.node_days, april.interruptions, april.by_cause) == (pytest.approx(2.0), 1, {"user": 1})


# ---- the anchor: the Llama 3 paper's 54-day run ------------------------------------------------------------------
# Table 5 of "The Llama 3 Herd of Models" (2024): 466 interruptions of the 54-day pre-training run on 16,384
# GPUs (2,048 nodes of 8), 47 planned and 419 unexpected; the unexpected ones by root cause, and how each
# shows in a Slurm site's records (the sacct state, and the evidence stune stores or Slurm keeps).
LLAMA3 = [
    ("Faulty GPU", 148, "FAILED", "stune: gpu3 Xid 79", "hardware", "xid79"),
    ("GPU HBM3 memory", 72, "FAILED", "stune: gpu1 Xid 48", "hardware", "xid48"),
    ("Software bug", 54, "FAILED", None, "user", ""),
    ("Network switch/cable", 35, "FAILED", "nccl", "nccl", "errors"),
    ("Host maintenance", 32, "NODE_FAIL", "host maintenance", "admin", "host maintenance"),
    ("GPU SRAM memory", 19, "FAILED", "stune: gpu2 Xid 94", "hardware", "xid94"),
    ("GPU system processor", 17, "FAILED", "stune: gpu6 Xid 119", "hardware", "xid119"),
    ("NIC", 7, "FAILED", "stune: mlx5_3/1 state DOWN", "hardware", "mlx5_3/1 state DOWN"),
    ("NCCL watchdog timeouts", 7, "FAILED", "nccl", "nccl", "errors"),
    ("Silent data corruption", 6, "FAILED", None, "user", ""),
    (
        "GPU thermal interface + sensor",
        6,
        "FAILED",
        "stune: gpu5 temperature 92 C",
        "hardware",
        "gpu5 temperature 92 C",
    ),
    ("SSD", 3, "NODE_FAIL", "Not responding", "node_failure", "Not responding"),
    ("Power supply", 3, "NODE_FAIL", "Not responding", "node_failure", "Not responding"),
    ("Server chassis", 2, "NODE_FAIL", "Not responding", "node_failure", "Not responding"),
    ("IO expansion board", 2, "NODE_FAIL", "Not responding", "node_failure", "Not responding"),
    ("Dependency", 2, "FAILED", None, "user", ""),
    ("CPU", 2, "NODE_FAIL", "Kill task failed", "node_failure", "Kill task failed"),
    ("System memory", 2, "NODE_FAIL", "Not responding", "node_failure", "Not responding"),
    ("Planned (maintenance, configuration, dataset updates)", 47, "REQUEUED", None, "requeued", ""),
]


def _llama3(tmp_path: Path) -> tuple[Path, Path, int]:
    """One job id on 2,048 nodes for 54 days: 467 runs back to back, each but the last ended by one of the
    466 interruptions, in a shuffled order."""
    import random

    rng = random.Random(54)
    hosts = "node[0001-2048]"
    nccl = "stune1 held=0.0 " + job_tokens([{"node": f"node{i:04d}", "comm": ERRORS} for i in range(1, 2049)])
    ends = [(state, evidence) for _, n, state, evidence, _, _ in LLAMA3 for _ in range(n)]
    rng.shuffle(ends)
    start = local(2024, 3, 1)
    span = 54 * 86400
    edges = [start + span * k // (len(ends) + 1) for k in range(len(ends) + 2)]
    rows, lines = [HEADER], []
    for k, (state, evidence) in enumerate([*ends, ("COMPLETED", None)]):
        a, b = edges[k], edges[k + 1]
        comment = nccl if evidence == "nccl" else ""
        rows.append(
            f"77|77|meta|llama|{state}|{a}|{b}|{b - a}|2048|billing=16384,gres/gpu=16384,node=2048|{hosts}|{comment}"
        )
        if evidence and evidence != "nccl":
            lines.append(f"node{rng.randrange(1, 2049):04d}|{b + 30}|{b + 3600}|DOWN|{evidence}\n")
    (tmp_path / "sacct").write_text("\n".join(rows) + "\n")
    (tmp_path / "events").write_text("".join(lines))
    return tmp_path / "sacct", tmp_path / "events", start


def test_the_llama3_runs_466_interruptions_come_out_by_cause(tmp_path):
    sacct, event_file, start = _llama3(tmp_path)
    runs = history.read_file(str(sacct))
    r = report.build(
        runs, causes.classify(runs, events.read_file(str(event_file))), start, start + 54 * 86400
    )
    assert (r.interruptions, r.unexpected, r.planned) == (466, 419, 47)
    counted = {(c.cause, c.code): c.count for c in r.causes}
    expected: dict = {}
    for _, n, _, _, cause, code in LLAMA3:
        expected[(cause, code)] = expected.get((cause, code), 0) + n
    assert counted == expected
    by_cause = {}
    for c in r.causes:
        by_cause[c.cause] = by_cause.get(c.cause, 0) + c.count
    assert by_cause == {
        "hardware": 269,
        "nccl": 42,
        "user": 62,
        "admin": 32,
        "node_failure": 14,
        "requeued": 47,
    }
    assert r.node_days == pytest.approx(2048 * 54)
    assert r.per_1000_node_days == pytest.approx(466 / (2048 * 54) * 1000)  # 4.21
    assert r.mttf_unexpected_h == pytest.approx(54 * 24 / 419)  # "a failure every 3 hours"
    assert r.mttf_h == pytest.approx(54 * 24 / (269 + 42 + 14))
    (size,) = r.sizes
    assert (size.size, size.gpus_median, size.failures) == ("1025-2048", 16384.0, 325)
    text = render.reliability_text(r)
    assert "466 interruptions (419 unexpected, 47 planned), 4.21 per 1,000 node-days" in text
    assert "unexpected  hardware      xid79" in text and "planned     requeued" in text


# ---- the outputs -------------------------------------------------------------------------------------------------
def test_csv_json_and_png_say_the_same_numbers(tmp_path):
    r, _ = _small()
    months = list(csv.DictReader(io.StringIO(render.reliability_csv(r, "months"))))
    assert [(m["partition"], m["month"]) for m in months] == [("a", "2026-03"), ("b", "2026-03")]
    assert float(months[0]["node_days"]) == pytest.approx(11.25) and months[0]["hardware_count"] == "1"
    assert float(months[1]["nccl_per_1000_node_days"]) == pytest.approx(1000 / 14, rel=1e-5)
    sizes = list(csv.DictReader(io.StringIO(render.reliability_csv(r, "sizes"))))
    assert [s["size"] for s in sizes] == ["1", "2", "3-4", "5-8"] and sizes[0]["mttf_h"] == ""
    causes_csv = list(csv.DictReader(io.StringIO(render.reliability_csv(r, "causes"))))
    assert causes_csv[0] == {
        "category": "unexpected",
        "cause": "hardware",
        "code": "xid79",
        "count": "1",
        "share": "0.25",
        "per_1000_node_days": f"{1000 / 25.25:.6g}",
    }
    doc = json.loads(render.reliability_json(r))
    assert doc["interruptions"] == 4 and doc["rows"][0]["by_cause"] == {
        "cancelled": 1,
        "hardware": 1,
        "user": 1,
    }
    assert doc["settings"] == {"checkpoint_interval_s": 7200, "restart_overhead_s": 1800}
    pytest.importorskip("matplotlib")
    render.reliability_png(r, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_on_a_dump(tmp_path, capsys):
    site = Site(seed=8, days=60)
    text, event_text = generate(site)
    (tmp_path / "dump").write_text(text)
    (tmp_path / "events").write_text(event_text)
    base = ["reliability", "--sacct-file", str(tmp_path / "dump"), "--since", "60d"]
    assert health_main([*base, "--events-file", str(tmp_path / "events")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Reliability ") and "Interruptions by cause" in out and "By job size" in out
    assert "node event(s)" in out and "hardware" in out
    assert health_main([*base, "--no-events", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["with_events"] is False and not any(c["cause"] == "hardware" for c in doc["causes"])
    assert "counts as `user`" in " ".join(doc["notes"])
    assert health_main([*base, "--format", "csv", "--table", "sizes", "-o", str(tmp_path / "s.csv")]) == 0
    assert (tmp_path / "s.csv").read_text().startswith("size,runs,hours")
    assert health_main([*base, "--format", "none", "--checkpoint-interval", "2x"]) == 1
    assert "--checkpoint-interval" in capsys.readouterr().err
    assert health_main(["reliability", "--sacct-file", str(tmp_path / "nope")]) == 1
