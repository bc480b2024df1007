"""Layer 1, operator alignment: a seeded suite of operators on the node's device, each compared with the same
operator computed in fp64 on the CPU. Standalone (stdlib and torch only): the node's interpreter runs it as

    python opsuite.py --seed 20240601 [--device auto|cpu|cuda|npu] --json

and it prints one line `STUNE-VALIDATE {json}` (torchdev.MARK) that stune reads (scriptout.py). Every input
is generated on the CPU from the seed, and a low-precision input is rounded there too, so every platform
computes on the same bytes and the fp64 reference sees exactly the values the device saw.

Per operator: max_abs = max |out - ref|, scale = max |ref|, max_rel = max_abs / scale (relative to the
output's scale: an element-wise ratio is meaningless where the reference is near zero), nonfinite = count of
NaN/inf outputs, and a sample of SAMPLE outputs at fixed indices (the reference partition's comparison).
Judging against tolerances is stune's (judge.py), not this script's.

The fp64 references of softmax, layer norm and attention are written out from their formulas, not by
calling the operator under test, so a wrong operator cannot be its own reference.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

try:  # imported by stune (tests), a package module; run by path, torchdev.py is beside this file
    from . import torchdev
except ImportError:
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under -I or PYTHONSAFEPATH
    import torchdev  # type: ignore[no-redef]

SAMPLE = 64
UNSUPPORTED_WORDS = ("not implemented", "not supported", "unsupported", "no kernel", "does not support")


def _suite(torch, seed: int) -> list:
    """(op, dtype, inputs (CPU), device function, fp64 reference function), inputs drawn in this order."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * scale

    def ref_softmax(x, dim=-1):
        e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
        return e / e.sum(dim=dim, keepdim=True)

    def ref_layer_norm(x, w, b, eps=1e-5):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w + b

    def attention(q, k, v, softmax):  # matmul + softmax + matmul, no fused kernel
        return softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) @ v

    a, b = randn(256, 512), randn(512, 256)
    out: list[tuple] = []
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        out.append(("matmul", name, (a.to(dtype), b.to(dtype)), torch.matmul, torch.matmul))
    out.append(
        ("softmax", "fp32", (randn(64, 1024, scale=4.0),), lambda x: torch.softmax(x, dim=-1), ref_softmax)
    )
    x, w, bias = randn(64, 1024, scale=2.0), 1.0 + randn(1024, scale=0.1), randn(1024, scale=0.1)
    out.append(
        (
            "layer_norm",
            "fp32",
            (x, w, bias),
            lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5),
            ref_layer_norm,
        )
    )
    q, k, v = randn(4, 4, 128, 64), randn(4, 4, 128, 64), randn(4, 4, 128, 64)
    out.append(
        (
            "attention",
            "fp32",
            (q, k, v),
            lambda q, k, v: attention(q, k, v, lambda s: torch.softmax(s, dim=-1)),
            lambda q, k, v: attention(q, k, v, ref_softmax),
        )
    )
    img, kernel, cb = randn(4, 16, 32, 32), randn(32, 16, 3, 3, scale=0.2), randn(32, scale=0.1)
    conv = lambda x, w, b: F.conv2d(x, w, b, padding=1)
    out.append(("conv2d", "fp32", (img, kernel, cb), conv, conv))
    big = torch.rand(1 << 22, generator=g, dtype=torch.float32)  # positive: the sum has no cancellation
    out.append(("sum", "fp32", (big,), torch.sum, torch.sum))
    out.append(("mean", "fp32", (big,), torch.mean, torch.mean))
    return out


def _sample(flat) -> list:
    n = flat.numel()
    idx = sorted({i * n // SAMPLE for i in range(min(SAMPLE, n))})
    return [torchdev.finite(flat[i]) for i in idx]


def run_op(torch, dev: dict, op, dtype, inputs, fn, ref_fn) -> dict:
    entry: dict = {"op": op, "dtype": dtype}
    started = time.perf_counter()
    try:
        on_device = [t.to(dev["device"]) for t in inputs]
        result = fn(*on_device)
        torchdev.synchronize(torch, dev["device"])
        got = result.detach().to("cpu", torch.float64).reshape(-1)
    except Exception as exc:  # a backend that cannot run it says so; that is no wrong result
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        unsupported = isinstance(exc, NotImplementedError) or any(
            w in text.lower() for w in UNSUPPORTED_WORDS
        )
        return dict(entry, status="unsupported" if unsupported else "error", detail=text)
    ref = ref_fn(*[t.to(torch.float64) for t in inputs]).reshape(-1)
    bad = int((~torch.isfinite(got)).sum())
    diff = (got - ref).abs()
    max_abs = float(diff.max()) if bad == 0 else None
    scale = float(ref.abs().max())
    return dict(
        entry,
        status="ok",
        max_abs=max_abs,
        scale=scale,
        max_rel=None if max_abs is None else (max_abs / scale if scale > 0 else max_abs),
        nonfinite=bad,
        sample=_sample(got),
        seconds=round(time.perf_counter() - started, 4),
    )


def run(seed: int, device: str = "auto") -> dict:
    try:
        import torch
    except Exception as exc:  # no torch, or one that cannot load: nothing to run it with
        return torchdev.no_torch("ops", exc)
    started = time.perf_counter()
    dev = torchdev.pick(torch, device)
    ops = [run_op(torch, dev, *case) for case in _suite(torch, seed)]
    return {
        **torchdev.header("ops", torch, dev, seed),
        "ops": ops,
        "seconds": round(time.perf_counter() - started, 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="opsuite")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    p.add_argument("--json", action="store_true", help="(the only output there is: one marked JSON line)")
    args = p.parse_args(argv)
    torchdev.emit(run(args.seed, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
