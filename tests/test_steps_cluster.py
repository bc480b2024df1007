"""Throughput in the history on the dev cluster: two real jobs submitted through stune-sbatch run
docs/steps.md's snippet (torch on CPU) and write their steps files, the second with a slow data loader; their
summaries go into the jobs' AdminComment as the node epilog will store them (parse the bytes, `sacctmgr
modify job ... AdminComment=`), and `stune-sbatch history` / `history diff` read them back through the real
sacct: the throughput change next to its cause.

Until the integrator's TaskProlog sets STUNE_STEPS_FILE in every job, the test sets it in the submitting
environment (sbatch exports it to the job)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for_state, wait_until
from test_steps_snippet import SETUP, snippet

from slurm_tune.usage import steps, summary

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)


def stune_sbatch(args, env):
    return subprocess.run([os.path.join(BIN, "stune-sbatch"), *args], capture_output=True, text=True, env=env)


def admin_comment(slurm, job_id: int) -> str:
    rows = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job_id)])
    return rows[0]["AdminComment"] if rows else ""


def store(slurm, job_id: int, stats: steps.StepStats) -> None:
    """What the epilog and EpilogSlurmctld will do with the summary: the tokens into the job's AdminComment."""
    text = summary.PREFIX + stats.tokens()

    def stored() -> bool:
        slurm.set_admin_comment(job_id, text)  # the job's record reaches slurmdbd a moment after it ends
        return admin_comment(slurm, job_id) == text

    wait_until(f"job {job_id}'s AdminComment stored", stored, timeout=30, interval=1)


def summary_fields(text: str) -> dict[str, str]:
    return dict(t.split("=", 1) for t in text[len(summary.PREFIX) :].split(" ") if "=" in t)


def test_history_diff_shows_the_throughput_change_between_two_real_jobs_with_its_cause(slurm, shared_tmp):
    script = shared_tmp / "train.py"
    # the loader's delay comes from the job's environment: the one setting the two submissions differ in
    script.write_text(
        SETUP.format(batches=40, loader_s='float(__import__("os").environ["STUNE_TEST_LOADER_S"])')
        + snippet()
    )
    env = dict(os.environ, STUNE_HISTORY=str(shared_tmp / "history.jsonl"))
    for name in [
        n for n in env if n.startswith(("SBATCH_", "STUNE_STAGE", "STUNE_MANAGED", "RANK", "WORLD"))
    ]:
        del env[name]
    jobs, files = [], []
    for k, loader_s in enumerate(("0", "0.05")):
        files.append(shared_tmp / f"steps-{k}.jsonl")
        env.update(STUNE_STEPS_FILE=str(files[-1]), STUNE_TEST_LOADER_S=loader_s)
        out = stune_sbatch(
            [
                "--parsable",
                "-p",
                "hdr",
                "-o",
                str(shared_tmp / "out-%j.txt"),
                "--wrap",
                f"{sys.executable} {script}",
            ],
            env,
        )
        assert out.returncode == 0, out.stderr
        jobs.append(int(out.stdout.strip().split(";")[0]))
    for job, path in zip(jobs, files):
        wait_for_state(slurm, job, ("COMPLETED",), timeout=120)
        stats = steps.parse(Path(path).read_bytes())  # the bytes the epilog reads
        assert stats.bad == 0 and (stats.steps, stats.warmup) == (40 - steps.WARMUP_STEPS, steps.WARMUP_STEPS)
        store(slurm, job, stats)
    fast, slow = (steps.parse(Path(p).read_bytes()) for p in files)
    assert slow.dwait_p50 > 0.5 > fast.dwait_p50 and slow.sps_p50 < fast.sps_p50

    listing = stune_sbatch(["history"], env)
    assert listing.returncode == 0 and listing.stderr == ""
    rows = {ln.split()[2]: ln for ln in listing.stdout.splitlines()[1:]}
    for job, stats in zip(jobs, (fast, slow)):
        assert re.search(r" \d[\d.]* \([\d.]+-[\d.]+\) +\d+ % ", rows[str(job)]), rows[str(job)]
        assert f" {round(100 * stats.dwait_p50)} % " in rows[str(job)]

    out = stune_sbatch(["history", "diff", str(jobs[0]), str(jobs[1])], env)
    assert out.returncode == 0 and out.stderr == ""
    head = out.stdout.splitlines()[1]
    a, b = (steps.parse_tokens(summary_fields(admin_comment(slurm, j))) for j in jobs)  # as stored: rounded
    change = round(100 * (b.sps_p50 - a.sps_p50) / a.sps_p50)
    assert re.fullmatch(
        rf"samples/s [\d.]+ -> [\d.]+ \({change:+d} %\); data wait \d+ % -> \d+ %; "
        r"STUNE_STEPS_FILE changed; STUNE_TEST_LOADER_S changed",
        head,
    ), head
    assert "  ~ STUNE_TEST_LOADER_S: '0' -> '0.05'" in out.stdout
