"""Numeric consistency: the same seeded matrix multiply on every GPU of the node, results compared bit for
bit. A GPU whose result differs from the others' computes wrong without failing ("runs fast, trains wrong").

Run as `python -m slurm_tune.active.numeric [--size N] [--dtype float32|float16|bfloat16]` by the agent, with a
Python that has PyTorch or CuPy. Prints its own small format (parsed by parse.numeric):

    stune-numeric backend torch 2.3.1
    device 0 NVIDIA H100 80GB HBM3 sha256 5f1c...
    stune-numeric done 8

or `stune-numeric unavailable: ...` (neither installed: summarized like a missing tool) or `stune-numeric
unknown: ...` (installed but sees no GPU).

The inputs are generated on the CPU from a fixed seed and copied to each GPU, so every GPU multiplies the same
bytes; the same kernel on the same model must give the same bytes back.
"""

from __future__ import annotations

import argparse
import hashlib
import sys


def _torch(size: int, dtype: str):
    import torch  # optional: the node's Python has PyTorch or CuPy, or neither (main says which)

    if not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA GPU"
    gen = torch.Generator().manual_seed(20240601)
    a = torch.randn(size, size, generator=gen).to(getattr(torch, dtype))
    b = torch.randn(size, size, generator=gen).to(getattr(torch, dtype))
    torch.backends.cuda.matmul.allow_tf32 = False
    out = [f"stune-numeric backend torch {torch.__version__}"]
    for i in range(torch.cuda.device_count()):
        with torch.cuda.device(i):
            c = (a.cuda(i) @ b.cuda(i)).float().cpu().contiguous()
        digest = hashlib.sha256(c.numpy().tobytes()).hexdigest()
        out.append(f"device {i} {torch.cuda.get_device_name(i)} sha256 {digest}")
    return out, None


def _cupy(size: int, dtype: str):
    import cupy  # optional, as torch above
    import numpy  # what CuPy needs anyway

    rng = numpy.random.default_rng(20240601)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    out = [f"stune-numeric backend cupy {cupy.__version__}"]
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        with cupy.cuda.Device(i):
            c = cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b))
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"].decode(errors="replace")
        out.append(f"device {i} {name} sha256 {hashlib.sha256(c.tobytes()).hexdigest()}")
    return out, None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="stune-numeric")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    args = p.parse_args(argv)
    why = None
    for backend in (_torch, _cupy):
        try:
            lines, problem = backend(args.size, args.dtype)
        except ImportError:
            continue
        if lines is None:
            why = problem
            continue
        print("\n".join(lines))
        print(f"stune-numeric done {len(lines) - 1}")
        return 0
    if why is None:  # nothing to run it with: the tool is missing, not the node broken
        print("stune-numeric unavailable: neither PyTorch nor CuPy is installed for this Python")
    else:  # installed, but it sees no GPU on a GPU node: that is the node's to explain
        print(f"stune-numeric unknown: {why}")
    return 3


if __name__ == "__main__":
    sys.exit(main())
