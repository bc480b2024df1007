"""How README's demo shows and checks each step: a heading (step), a stune command run as a user would, echoed
(run, json_of for a check), a claim that stops the demo when it does not hold (claim, ClaimFailed), a job
waited for, and the captured node the steps judge (SNAPSHOT). demo.py and demo_fairshare.py are the steps."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

from slurm_tune.errors import StuneError
from slurm_tune.slurm import Slurm

from .layout import REPO

SNAPSHOT = REPO / "tests" / "fixtures" / "snapshots" / "dgx-a100-ib.json"
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class ClaimFailed(StuneError):
    """A claim the demo prints did not hold."""


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def claim(text: str, holds: bool, seen: str = "") -> None:
    """Say a claim, checked: `  checked: TEXT (SEEN)`. One that does not hold stops the demo, named."""
    detail = f" ({seen})" if seen else ""
    if not holds:
        raise ClaimFailed(f"claim not true: {text}{detail}")
    print(f"  checked: {text}{detail}", flush=True)


def run(
    argv: list[str], *, cwd: str | None = None, ok_codes: tuple[int, ...] = (0,), quiet: bool = False
) -> str:
    """Run a stune command as a user would, echoing it and its output (`quiet`: neither, for a check)."""
    if not quiet:
        print(f"$ {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    if not quiet:
        print(output, end="" if output.endswith("\n") or not output else "\n", flush=True)
    if proc.returncode not in ok_codes:
        raise ClaimFailed(
            f"`{' '.join(argv[:3])}` exited {proc.returncode}, not {' or '.join(map(str, ok_codes))}"
            + (f": {output.strip().splitlines()[-1]}" if output.strip() else "")
        )
    return proc.stdout


def json_of(argv: list[str]) -> dict:
    """A command's --json answer, for a check (not echoed: the demo already showed the same in words)."""
    try:
        return json.loads(run(argv, quiet=True))
    except ValueError as exc:
        raise ClaimFailed(f"`{' '.join(argv[:3])}` did not answer JSON: {exc}") from None


def wait_done(slurm: Slurm, job_id: int, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = slurm.sacct(["JobID", "State"], job_ids=[str(job_id)])
        state = rows[0]["State"].split()[0] if rows else "PENDING"
        if state in FINISHED:
            return state
        time.sleep(1)
    raise StuneError(f"job {job_id} did not finish within {timeout:g}s")
