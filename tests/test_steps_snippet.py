"""docs/steps.md's PyTorch snippet runs as printed: on a tiny CPU model it writes one parseable line per step
on rank 0, writes nothing on the other ranks or without $STUNE_STEPS_FILE, and its data wait is the loader's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.usage.steps import WARMUP_STEPS, parse

REPO = Path(__file__).resolve().parent.parent
TORCH = "2.13.0+cpu"


def snippet() -> str:
    """The one ```python block of docs/steps.md."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "steps.md").read_text(), re.S)
    assert len(blocks) == 1, "docs/steps.md should hold exactly one python block: the snippet"
    return blocks[0]


# The script's own objects the snippet uses (`loader`, `model`, `loss_fn`, `opt`): a tiny linear model, and a
# loader whose every batch takes LOADER_S to arrive (a slow dataset).
SETUP = """
import time, torch
torch.manual_seed(0)
BATCHES, BATCH, LOADER_S = {batches}, 8, {loader_s}
model = torch.nn.Linear(4, 2)
loss_fn = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def slow_batches():
    for _ in range(BATCHES):
        time.sleep(LOADER_S)
        yield torch.randn(BATCH, 4), torch.randint(0, 2, (BATCH,))
loader = slow_batches()
"""


def run_snippet(
    tmp_path, batches: int = 30, loader_s: float = 0.0, **env_extra
) -> subprocess.CompletedProcess:
    code = SETUP.format(batches=batches, loader_s=loader_s) + snippet()
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
    }
    env.pop("STUNE_STEPS_FILE", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    if out.returncode != 0 and "No module named 'torch'" in out.stderr:
        pytest.fail(f"torch {TORCH} is not installed in {sys.prefix}: scripts/setup.sh installs it")
    assert out.returncode == 0, out.stderr
    return out


def test_the_snippet_is_about_ten_lines():
    code = [ln for ln in snippet().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(code) <= 15, code


def test_the_snippet_writes_a_parseable_line_per_step(tmp_path):
    path = tmp_path / "steps.jsonl"
    run_snippet(tmp_path, batches=30, STUNE_STEPS_FILE=str(path), WORLD_SIZE="4", RANK="0")
    records = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(30))
    assert {r["samples"] for r in records} == {8 * 4}  # the global batch: 8 per rank x 4 ranks
    assert all(0 <= r["data_s"] <= r["step_s"] for r in records)
    stats = parse(path.read_bytes())
    assert (stats.steps, stats.warmup, stats.bad, stats.runs) == (30 - WARMUP_STEPS, WARMUP_STEPS, 0, 1)
    assert stats.sps_p50 > 0


def test_a_slow_loader_shows_as_data_wait(tmp_path):
    path = tmp_path / "steps.jsonl"
    run_snippet(tmp_path, batches=24, loader_s=0.05, STUNE_STEPS_FILE=str(path))
    stats = parse(path.read_bytes())
    assert stats.bad == 0 and stats.steps == 24 - WARMUP_STEPS
    # each step waits 50 ms for its batch and computes a tiny linear layer: the wait is most of the step
    assert stats.dwait_p50 > 0.5, stats
    assert stats.sps_p50 < 8 / 0.05  # no faster than the loader delivers


def test_without_stune_or_off_rank_0_the_snippet_writes_nothing(tmp_path):
    run_snippet(tmp_path, batches=5)  # no STUNE_STEPS_FILE: stune not in use
    path = tmp_path / "steps.jsonl"
    run_snippet(tmp_path, batches=5, STUNE_STEPS_FILE=str(path), RANK="1")
    run_snippet(tmp_path, batches=5, STUNE_STEPS_FILE=str(path), SLURM_PROCID="3")
    assert list(tmp_path.iterdir()) == []
    run_snippet(tmp_path, batches=5, STUNE_STEPS_FILE=str(path), SLURM_PROCID="0", SLURM_NTASKS="2")
    assert {json.loads(ln)["samples"] for ln in path.read_text().splitlines()} == {16}
