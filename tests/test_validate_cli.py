"""stune-validate's command: `run` end to end through a stand-in Slurm that runs each job's script at once
(the real jobs: tests/test_validate_cluster.py), `report` (layer 3, the user's verdict) and `show`, and the
one-line errors of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_tune.active import store
from slurm_tune.cli import validate as cli
from slurm_tune.profiles import load_profile
from slurm_tune.validate import run as runner
from slurm_tune.validate.records import valid_record

REPO = Path(__file__).resolve().parent.parent
PERTURBED = REPO / "tests" / "validate_standins" / "python-perturbed"


class JobsAtOnce:
    """Slurm as far as `run` needs it: idle nodes, and sbatch that runs the job script here, now."""

    def __init__(self, spool: Path, nodes=("a1", "a2"), partitions=("plain", "perturbed")):
        self.spool, self.next_id, self.submitted = spool, 100, []
        self._nodes = [
            SimpleNamespace(name=n, partitions=list(partitions), state="idle", drain=False) for n in nodes
        ]

    def nodes(self, names=None):
        return self._nodes

    def submit(self, args, script):
        self.next_id += 1
        node = args[args.index("--nodelist") + 1]
        self.submitted.append(args)
        env = dict(os.environ, SLURMD_NODENAME=node, SLURM_JOB_ID=str(self.next_id))
        out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, env=env, timeout=300)
        Path(args[args.index("--output") + 1].replace("%j", str(self.next_id))).write_bytes(
            out.stdout + out.stderr
        )
        return self.next_id

    def jobs(self, job_ids=None):
        return []

    def cancel(self, ids):
        raise AssertionError("nothing to cancel")


def profiles(tmp_path: Path, band: float = 0.005, steps: int = 40) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    text = (REPO / "partitions" / "vpc.yaml").read_text()
    common = f"  seed: 11\n  steps: {steps}\n  cold_steps: 5\n  band: {band}\n  time_limit: 5m\n"
    (d / "plain.yaml").write_text(
        text.replace("partition: vpc", "partition: plain")
        + f"validate:\n  python: {sys.executable}\n"
        + common
    )
    (d / "perturbed.yaml").write_text(
        text.replace("partition: vpc", "partition: perturbed")
        + f"validate:\n  python: {PERTURBED}\n  reference: plain\n"
        + common
    )
    return d


def run(tmp_path, partition, **kw):
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    slurm = JobsAtOnce(spool)
    opts = runner.Options(partition, str(tmp_path / "store"), spool=str(spool), **kw)
    log: list[str] = []
    records = runner.run(slurm, load_profile(partition, profiles_dir(tmp_path)), opts, log=log.append)
    return records, slurm, log


def profiles_dir(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    return d if d.exists() else profiles(tmp_path)


def test_run_judges_and_stores_the_reference_then_the_perturbed_platform_fails(tmp_path):
    records, slurm, log = run(tmp_path, "plain")
    assert log == ["validating plain (ops, converge) on a1"]
    assert [(r["layer"], r["node"], r["status"]) for r in records] == [
        ("ops", "a1", "pass"),
        ("converge", "a1", "pass"),
    ]
    assert records[1]["detail"] == "reference recorded" and records[0]["job"] == "101"
    args = slurm.submitted[0]
    for part in ("--exclusive", "--no-requeue", "--nice=10000", "--gres=gpu:4", "--time=5"):
        assert part in args, args
    stored = store.load(str(tmp_path / "store"), "plain", kind="validate", accept=valid_record)
    assert [r["layer"] for r in stored] == ["ops", "converge"]

    bad, _, _ = run(tmp_path, "perturbed", nodes=["a2"])
    ops, conv = bad
    assert (ops["node"], ops["status"], conv["status"]) == ("a2", "fail", "fail")
    assert [f"{e['op']}/{e['dtype']}" for e in ops["ops"] if e["status"] != "pass"] == ["layer_norm/fp32"]
    assert all(e["ref"]["status"] == "pass" for e in ops["ops"] if e["op"] != "layer_norm")
    assert conv["reference"]["against"] == "plain" and conv["detail"].startswith("loss over steps")


def test_the_command_exits_3_on_a_failed_layer_and_prints_the_table_with_the_version_matrix(
    tmp_path, capsys, monkeypatch
):
    run(tmp_path, "plain", layers=("ops",))
    spool = tmp_path / "spool"
    monkeypatch.setattr(cli.Slurm, "from_env", staticmethod(lambda: JobsAtOnce(spool)))
    argv = ["--store", str(tmp_path / "store"), "--partitions-dir", str(profiles_dir(tmp_path))]
    code = cli.main(["run", "-p", "perturbed", "--layers", "ops", "--nodes", "a[2]", *argv])
    out = capsys.readouterr().out
    assert code == 3
    assert "layer_norm/fp32  fail" in out and "matmul/bf16      pass" in out
    assert "version matrix: torch 2." in out and "ops: fail: layer_norm/fp32: max abs err" in out
    assert cli.main(["run", "-p", "plain", "--layers", "ops", "--json", *argv]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in doc["records"]] == ["pass"]


def test_against_previous_compares_with_the_partitions_own_last_pass(tmp_path):
    run(tmp_path, "plain", layers=("converge",))
    again, _, _ = run(tmp_path, "plain", layers=("converge",), against_previous=True)
    assert again[0]["status"] == "pass" and again[0]["max_dev"] == 0.0
    assert again[0]["reference"]["against"] == "plain (previous run)"


def test_dry_run_submits_and_stores_nothing(tmp_path):
    records, slurm, log = run(tmp_path, "perturbed", dry_run=True)
    assert records == [] and slurm.submitted == [] and not (tmp_path / "store" / "validate").exists()
    assert log[1].startswith("would submit on a1: sbatch --partition perturbed")
    assert '"reference"' not in log[2] and f'"python":"{PERTURBED}"' in log[2]


def test_a_job_that_left_nothing_is_unknown_per_layer(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    records = runner.collect(
        str(spool),
        {7: "a1"},
        runner.spec(load_profile("plain", profiles(tmp_path)), runner.Options("plain", str(tmp_path))),
    )
    assert [(r["layer"], r["status"], r["job"]) for r in records] == [
        ("ops", "unknown", "7"),
        ("converge", "unknown", "7"),
    ]
    assert all(valid_record(r, raw=True) for r in records) and "left no result" in records[0]["detail"]


def test_report_records_the_users_verdict_and_show_lists_the_latest_per_layer_and_node(tmp_path, capsys):
    run(tmp_path, "plain")
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps({"eval_loss": 1.93, "name": "llama", "metrics": {"mmlu": 0.61}, "ok": True})
    )
    argv = ["--store", str(tmp_path / "store"), "--partitions-dir", str(profiles_dir(tmp_path))]
    code = cli.main(
        [
            "report",
            "-p",
            "plain",
            "--verdict",
            "pass",
            "--metric",
            "tokens_per_s=3100",
            "--note",
            "7B, 2k steps",
            "--file",
            str(results),
            *argv,
        ]
    )
    assert code == 0 and "verdict pass recorded by" in capsys.readouterr().out
    assert cli.main(["show", "-p", "plain", "--json", *argv]) == 0
    doc = json.loads(capsys.readouterr().out)
    layers = {r["layer"]: r for r in doc["records"]}
    assert set(layers) == {"ops", "converge", "training"}
    t = layers["training"]
    assert t["metrics"] == {"eval_loss": 1.93, "mmlu": 0.61, "tokens_per_s": 3100.0}
    assert (t["verdict"], t["status"], t["note"]) == ("pass", "pass", "7B, 2k steps") and t["by"]
    assert t["fingerprint"]["backend"] == "cpu"  # the stack as last validated
    assert cli.main(["show", "-p", "plain", *argv]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == [
        "LAYER",
        "NODE",
        "WHEN",
        "STATUS",
        "TORCH",
        "BACKEND",
        "DEVICE",
        "DETAIL",
    ]
    assert "verdict pass by" in text


def test_show_names_what_changed_since_the_previous_record(tmp_path, capsys):
    records, _, _ = run(tmp_path, "plain", layers=("ops",))
    later = dict(
        records[0], at=records[0]["at"] + 60, fingerprint=dict(records[0]["fingerprint"], driver="550.1")
    )
    later["ops"] = [dict(e, max_rel=0.02) if e["op"] == "layer_norm" else e for e in later["ops"]]
    store.append(str(tmp_path / "store"), "plain", [later], kind="validate")
    assert cli.main(["show", "-p", "plain", "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "a1 ops: versions changed since" in out and "driver ? -> 550.1" in out
    assert "layer_norm/fp32 max rel" in out and "-> 0.02" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "-p", "plain", "--layers", "ops,bogus"], "--layers 'ops,bogus': choose from ops, converge"),
        (
            ["report", "-p", "plain", "--verdict", "pass", "--metric", "loss"],
            "--metric 'loss': give name=number",
        ),
        (["report", "-p", "plain", "--verdict", "pass", "--metric", "loss=nan"], "give name=number"),
        (["report", "-p", "plain", "--verdict", "fail", "--file", "{missing}"], "cannot read"),
        (["report", "-p", "plain", "--verdict", "fail", "--file", "{bad}"], "line 2: not JSON"),
        (["report", "-p", "plain", "--verdict", "fail", "--file", "{list}"], "not a JSON object"),
        (["agent", "--spec", "{nope"], "--spec is not JSON"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "bad.json").write_text('{"a": 1,\n oops}')
    (tmp_path / "list.json").write_text("[1, 2]")
    files = {
        "{missing}": str(tmp_path / "missing.json"),
        "{bad}": str(tmp_path / "bad.json"),
        "{list}": str(tmp_path / "list.json"),
    }
    argv = [files.get(a, a) for a in argv]
    extra = (
        []
        if argv[0] == "agent"
        else ["--store", str(tmp_path / "s"), "--partitions-dir", str(profiles_dir(tmp_path))]
    )
    assert cli.main(argv + extra) == 1
    err = capsys.readouterr().err
    assert err.startswith("stune-validate: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "s" / "validate").exists()
