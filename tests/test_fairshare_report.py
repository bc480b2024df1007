"""What users read from the accountant: `stune-fairshare report` at any scale and terminal width, `explain` in
plain words with what to do, `job` naming an exemption, one-line errors for a bad job id."""

from __future__ import annotations

import json

import pytest
from test_fairshare_accountant import EQUAL, HEADER, RowsSlurm, _cli, pending_job, row, summary, write_config

from slurm_tune.fairshare import accountant, explain, jobdoc, jobview
from slurm_tune.text import counted

NOW = 1_800_000_000
# the demo's scale: 2 GPUs for 20 s each; bob's idle, alice's busy; carol's debug-QOS job idle but exempt
DEMO = [
    row(1, "stune-alice", NOW - 9000, 20, comment=summary(40, 38, 40)),
    row(2, "stune-bob", NOW - 9000, 20, comment=summary(40, 0, 40)),
    row(3, "stune-bob", NOW - 5000, 20, gpus=1, comment=summary(20, 1, 20), qos="debug"),
]
EXEMPT_DEBUG = "  alpha_by:\n    qos: {debug: 0}\n"


def report_cli(tmp_path, *extra, columns="80"):
    dump = tmp_path / "dump.txt"
    dump.write_text("\n".join([HEADER, *DEMO]) + "\n")
    cfg = tmp_path / "fs.yaml"
    cfg.write_text("accountant:\n" + EXEMPT_DEBUG)
    proc = _cli(
        ["report", "--sacct-file", str(dump), "--config", str(cfg), *extra],
        env_extra={"COLUMNS": columns},
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_report_at_demo_scale_fits_a_terminal_and_no_cell_of_real_use_reads_zero(tmp_path):
    text = report_cli(tmp_path)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    assert "in GPU-minutes" in text and " 0.0 " not in text
    bob = next(line for line in lines if line.strip().startswith("stune-bob"))
    assert bob.split()[1:5] == ["2", "1.00", "0.02", "(2%)"], (
        bob
    )  # 2 GPU jobs, 40 + 20 GPU-s held = 1 GPU-minute
    alice = next(line for line in lines if line.strip().startswith("stune-alice"))
    assert "0.63 (95%)" in alice
    # every column named in words under the table
    words = " ".join(text.split())
    assert "fair share, 0 to 1 (higher runs sooner): Slurm's own factor (Slurm FS)" in words
    assert "stune's (stune FS), the same with idle GPU time charged x(1 + 1 x idle share)" in words
    assert "SiteFactor: the priority points stune gives the user's pending jobs" in words
    assert "not measured: held with no trustworthy usage record" in words
    # the exempt job is idle but not charged: the jobs table says so
    job3 = next(line for line in lines if line.startswith("3 "))
    assert job3.split()[-1] == "exempt"


def test_the_wide_report_has_every_column_and_explains_sshare(tmp_path):
    text = report_cli(tmp_path, "--wide", columns="200")
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if "sshare" in line)
    header = [line.split() for line in lines[top : top + 2]]
    assert header[0][-4:] == ["sshare", "Slurm", "stune", "Site"] and header[1][-4:] == [
        "FS",
        "FS",
        "FS",
        "Factor",
    ]
    alice = next(line for line in text.splitlines() if line.strip().startswith("stune-alice")).split()
    (mine,) = [u for u in json.loads(report_cli(tmp_path, "--json"))["users"] if u["user"] == "stune-alice"]
    # no sshare offline; Slurm's factor, then stune's, then SiteFactor
    assert alice[-4:] == [
        "-",
        f"{mine['fairshare_slurm']:.3f}",
        f"{mine['fairshare_stune']:.3f}",
        str(mine["site_factor"]),
    ]
    assert "sshare FS: the FairShare Slurm shows now (`sshare`)" in " ".join(text.split())


def test_gpu_time_is_shown_in_a_unit_that_keeps_three_digits():
    from slurm_tune.fairshare.report_render import amount, time_unit

    assert time_unit([0.011, 0.005]) == ("GPU-minutes", 60.0)
    assert time_unit([0.0001]) == ("GPU-seconds", 3600.0)
    assert time_unit([2.5, 0.01]) == ("GPU-hours", 1.0)
    assert [amount(v) for v in (0, 0.004, 0.0111, 1.234, 12.34, 1234.5, None)] == [
        "0",
        "<0.01",
        "0.01",
        "1.23",
        "12.3",
        "1,234",
        "-",
    ]


def _demo_result(tmp_path):
    slurm = RowsSlurm(DEMO, pending=[pending_job(9, "stune-bob")], assocs=EQUAL)
    config = write_config(tmp_path, EXEMPT_DEBUG)
    return slurm, config, accountant.run(config, slurm, now=NOW, use_ledger=False)


def test_explain_keeps_an_exempt_job_out_of_the_costly_ones_and_says_what_to_do(tmp_path):
    slurm, config, result = _demo_result(tmp_path)
    doc = explain.explain(result, config, "stune-bob", slurm.sprio())
    (bio,) = doc["associations"]
    assert [j["job_id"] for j in bio["top_idle_jobs"]] == ["2"]
    assert [(j["job_id"], j["rule"]) for j in bio["exempt_jobs"]] == [
        ("3", "QOS debug, accountant.alpha_by.qos.debug = 0")
    ]
    text = explain.explain_text(doc)
    assert "job 2: 2 GPUs, 0.67 held, 0% used, 0.67 idle: charged x2.00" in text
    assert "job 3: 0.32 idle GPU-minutes, not charged: exempt from idle charges (QOS debug" in text
    assert "a GPU held but idle is charged 2x its time, a fully used one 1x" in text
    assert "what you can do:" in text and "stune-fairshare job JOBID" in text
    assert "use QOS debug: never charged for idle GPUs" in text
    assert "Slurm counts usage half after 1w (PriorityDecayHalfLife)" in text
    assert "alpha " not in text.replace("accountant.alpha", "")  # no bare jargon


def test_job_names_the_exemption_and_counts_gpus_in_words(tmp_path):
    _slurm, config, _result = _demo_result(tmp_path)

    class Sacct:
        def sacct(self, fields, job_ids=None, **_):
            line = next(r for r in DEMO if r.startswith(f"{job_ids[0]}|"))
            return [dict(zip(fields, line.split("|", len(fields) - 1)))]

    doc = jobview.job_view(Sacct(), config, "3")
    assert doc["exempt"] and doc["charged_x"] == 1.0
    text = jobdoc.job_text(doc)
    assert text.startswith("job 3 (stune-bob/biology, hdr): COMPLETED, 1 GPU for 0:00:20\n")
    assert (
        "exempt from idle charges (QOS debug, accountant.alpha_by.qos.debug = 0): charged as Slurm charges, "
        "x1.00" in text
    )
    charged = jobdoc.job_text(jobview.job_view(Sacct(), config, "2"))
    assert "2 GPUs for" in charged and "x (1 + 1 x 1.00) = x2.00" in charged and "exempt" not in charged


@pytest.mark.parametrize("bad", ["abc", "12a", "../1", "12_", "_3", "1;2"])
def test_a_bad_job_id_is_refused_in_one_line_before_sacct(tmp_path, bad):
    cfg = tmp_path / "fs.yaml"
    cfg.write_text("")
    proc = _cli(["job", bad, "--config", str(cfg)], tmp_path=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        proc.stderr == f"stune-fairshare: job {bad!r}: not a Slurm job id (a number like 12345, or 12345_7 "
        "for an array task)\n"
    )
    assert jobview.check_job_id("12345_7") == "12345_7"


def test_counts_say_1_gpu_and_2_gpus():
    assert [counted(n, "GPU") for n in (1, 2, 0.5, 1.0)] == ["1 GPU", "2 GPUs", "0.5 GPUs", "1 GPU"]


def test_report_json_keeps_gpu_hours_and_the_exemption(tmp_path):
    doc = json.loads(report_cli(tmp_path, "--json"))
    top = {j["job_id"]: j for j in doc["top_idle"]}
    assert top["3"]["exempt"] and top["3"]["charged_x"] == 1.0 and not top["2"]["exempt"]
    assert top["2"]["held_gpu_h"] == pytest.approx(40 / 3600)
