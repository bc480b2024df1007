"""docs/steps.md's PyTorch snippet runs as printed: on a tiny CPU model it writes one parseable line per step
on rank 0, writes nothing on the other ranks or without $STUNE_STEPS_FILE, and its data wait is the loader's."""

from __future__ import annotations

import json
import os
import re
import socket
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


# The script's own objects the snippet uses (`loader`, `train_step`): a tiny linear model, and a loader whose
# every batch takes LOADER_S to arrive (a slow dataset); with WORLD_SIZE set, a gloo process group first.
SETUP = """
import os, time, torch
import torch.distributed
if "WORLD_SIZE" in os.environ:
    torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
BATCHES, BATCH, LOADER_S = {batches}, 8, {loader_s}
model = torch.nn.Linear(4, 2)
loss_fn = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train_step(x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
def slow_batches():
    for _ in range(BATCHES):
        time.sleep(LOADER_S)
        yield torch.randn(BATCH, 4), torch.randint(0, 2, (BATCH,))
loader = slow_batches()
"""


def snippet_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "STUNE_STEPS_FILE")}
    env.update(extra)
    return env


def check_torch(out) -> None:
    if out.returncode != 0 and "No module named 'torch'" in out.stderr:
        pytest.fail(f"torch {TORCH} is not installed in {sys.prefix}: scripts/setup.sh installs it")
    assert out.returncode == 0, out.stderr


def run_snippet(tmp_path, batches: int = 30, loader_s: float = 0.0, **env_extra) -> None:
    code = SETUP.format(batches=batches, loader_s=loader_s) + snippet()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=snippet_env(**env_extra),
        cwd=tmp_path,
    )
    check_torch(out)


def test_the_snippet_stays_short():
    """About ten lines of loop (the issue's "ten-line snippet"), with its imports and the 10 s flush as ruff
    formats them: 17."""
    code = [ln for ln in snippet().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(code) <= 17, code


def test_the_snippet_writes_a_parseable_line_per_step(tmp_path):
    path = tmp_path / "steps.jsonl"
    run_snippet(tmp_path, batches=30, STUNE_STEPS_FILE=str(path))
    records = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(30))
    assert {r["samples"] for r in records} == {8}
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


def test_without_stune_the_snippet_writes_nothing(tmp_path):
    run_snippet(tmp_path, batches=5)
    assert list(tmp_path.iterdir()) == []


def test_in_a_two_rank_process_group_rank_0_writes_the_global_batch(tmp_path):
    """Two real ranks (gloo, as torchrun starts them: RANK, WORLD_SIZE, MASTER_ADDR/PORT), each with its own
    steps path as each node has: only rank 0's is written, with samples = 8 per rank x 2 ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    code = SETUP.format(batches=12, loader_s=0.0) + snippet()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=snippet_env(
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                STUNE_STEPS_FILE=str(tmp_path / f"steps-{rank}.jsonl"),
            ),
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        check_torch(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps-0.jsonl"]
    written = (tmp_path / "steps-0.jsonl").read_text().splitlines()
    assert {json.loads(ln)["samples"] for ln in written} == {16} and len(written) == 12
