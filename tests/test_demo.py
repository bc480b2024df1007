"""README's demo checks every claim it prints: a claim that does not hold stops it, non-zero, naming the claim.

The cluster test runs the whole demo as scripts/demo.sh does (after setup and `up`), with a broken accountant:
`stune-fairshare apply` does nothing, as a bug that sets no SiteFactor would. Before, the demo still printed
"bob's pending job is now below alice's" and "Demo finished", and exited 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stune_dev import demo, demo_checks, demo_fairshare

REPO = Path(__file__).resolve().parent.parent


def test_a_claim_that_does_not_hold_stops_the_demo_named(capsys, monkeypatch):
    demo_checks.claim("three nodes with 4 GPUs each", True, "n1 gpu:4")
    assert capsys.readouterr().out == "  checked: three nodes with 4 GPUs each (n1 gpu:4)\n"
    with pytest.raises(
        demo_checks.ClaimFailed, match=r"^claim not true: bob's job is below alice's \(5000 vs 5000\)$"
    ):
        demo_checks.claim("bob's job is below alice's", False, "5000 vs 5000")

    def broken():
        demo_checks.claim("bob's job is below alice's", 5000 < 5000, "5000 vs 5000")
        return 0

    monkeypatch.setattr(demo, "demo", broken)
    assert demo.main() == 1
    assert capsys.readouterr().err == "demo: claim not true: bob's job is below alice's (5000 vs 5000)\n"


def test_the_checks_read_what_the_demo_shows():
    assert demo_fairshare.summary_eta(
        "stune1 held=40.0 used=38.0 cov=40.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="
    ) == pytest.approx(0.95)
    assert demo_fairshare.summary_eta("admin: re-run after maintenance") is None
    assert demo_fairshare.fairshare_alike(5000, 4990) and not demo_fairshare.fairshare_alike(5000, 2500)


@pytest.mark.cluster
def test_the_demo_fails_naming_the_claim_when_the_accountant_is_broken(cluster, shared_tmp):
    shim = shared_tmp / "bin"
    shim.mkdir()
    real = Path(sys.executable).parent / "stune-fairshare"
    (shim / "stune-fairshare").write_text(f'#!/bin/sh\n[ "$1" = apply ] && exit 0\nexec {real} "$@"\n')
    (shim / "stune-fairshare").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", TMPDIR=str(shared_tmp))
    proc = subprocess.run(
        [sys.executable, "-m", "stune_dev.demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr
    # the failure must be the accountant's claim, reached after the usage pipeline's; show both ends if not
    assert "checked: alice's GPUs were measured busy and bob's idle" in proc.stdout, (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("demo: claim not true: bob's pending job ") and "is now below alice's" in last, (
        last
    )
    assert "Demo finished" not in proc.stdout
