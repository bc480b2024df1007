"""Layer 2, convergence: a seeded small training run on the node's device. Standalone (stdlib and torch only):

    python trainrun.py --seed 20240601 --steps 200 --cold-steps 10 [--device auto|cpu|cuda|npu] --json

prints one line `STUNE-VALIDATE {json}` (torchdev.MARK): the loss of every step (the mean of each block of
`loss_every` steps past MAX_POINTS), the time of the first `cold_steps` (compilation, first touch) and of the
rest (steady) apart, and the peak memory (the device allocator's peak; on the CPU the process's peak RSS).

The model (LayerNorm, Linear, GELU, softmax cross-entropy) and the data (a fixed random teacher's labels on
Gaussian inputs, so there is something to learn) are made on the CPU from the seed, then moved to the device:
every platform starts from the same bytes and sees the same batches in the same order.
"""

from __future__ import annotations

import argparse
import sys
import time

try:  # imported by stune (tests), a package module; run by path, torchdev.py is beside this file
    from . import torchdev
except ImportError:
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under -I or PYTHONSAFEPATH
    import torchdev  # type: ignore[no-redef]

MAX_POINTS = 5000  # a longer run's losses are block means: the record stays small
DIM, HIDDEN, CLASSES, SAMPLES, BATCH = 32, 64, 8, 4096, 64


def _model(torch, seed: int):
    nn = torch.nn
    torch.manual_seed(seed)  # the CPU generator: the same initial weights everywhere
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN),
        nn.LayerNorm(HIDDEN),
        nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.LayerNorm(HIDDEN),
        nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def _data(torch, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(SAMPLES, DIM, generator=g)
    teacher = torch.randn(DIM, CLASSES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def _peak(torch, device: str) -> tuple:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated()), "device max_memory_allocated"
    if device == "npu":
        return int(torch.npu.max_memory_allocated()), "device max_memory_allocated"
    import resource

    # Linux reports ru_maxrss in KiB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process peak RSS (getrusage)"


def _phase(steps: int, seconds: float) -> dict:
    return {
        "steps": steps,
        "seconds": round(seconds, 4),
        "steps_per_s": round(steps / seconds, 3) if steps and seconds > 0 else None,
    }


def run(seed: int, steps: int, cold_steps: int, device: str = "auto") -> dict:
    try:
        import torch
    except Exception as exc:  # no torch, or one that cannot load: nothing to run it with
        return torchdev.no_torch("converge", exc)
    dev = torchdev.pick(torch, device)
    d = dev["device"]
    model = _model(torch, seed).to(d)
    x, y = _data(torch, seed)
    x, y = x.to(d), y.to(d)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    every = max(1, -(-steps // MAX_POINTS))
    cold_steps = min(cold_steps, steps)
    losses, block = [], []
    torchdev.synchronize(torch, d)
    started = time.perf_counter()
    cold_end = started
    for step in range(steps):
        at = (step * BATCH) % SAMPLES
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x[at : at + BATCH]), y[at : at + BATCH])
        loss.backward()
        opt.step()
        block.append(loss.detach())
        if len(block) == every or step == steps - 1:
            losses.append(torchdev.finite(torch.stack(block).float().mean()))  # syncs, as a loss log does
            block = []
        if step == cold_steps - 1:
            torchdev.synchronize(torch, d)
            cold_end = time.perf_counter()
    torchdev.synchronize(torch, d)
    ended = time.perf_counter()
    peak, kind = _peak(torch, d)
    return {
        **torchdev.header("converge", torch, dev, seed),
        "steps": steps,
        "loss_every": every,
        "losses": losses,
        "cold": _phase(cold_steps, cold_end - started),
        "steady": _phase(steps - cold_steps, ended - cold_end),
        "peak_mem_bytes": peak,
        "peak_mem_kind": kind,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trainrun")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--cold-steps", type=int, default=10)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    p.add_argument("--json", action="store_true", help="(the only output there is: one marked JSON line)")
    args = p.parse_args(argv)
    torchdev.emit(run(args.seed, max(1, args.steps), max(1, args.cold_steps), args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
