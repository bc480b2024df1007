"""The node's PyTorch device and its version matrix, for the two scripts layers 1 and 2 run (opsuite.py,
trainrun.py). Standalone: stdlib and torch only, because the node's interpreter (`validate.python`) need not
have stune installed; the scripts import it from their own directory.

Which device: Ascend's torch_npu ("npu") when it imports and sees an NPU, else torch.cuda (CUDA, or ROCm on a
build with torch.version.hip: the same API), else the CPU.
"""

from __future__ import annotations

import json
import math
import platform

MARK = "STUNE-VALIDATE "


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def pick(torch, want: str = "auto") -> dict:
    """{device, backend, name, accel_version}: the device the layers run on and what it is."""
    if want in ("auto", "npu"):
        try:
            import torch_npu  # Ascend: registers torch.npu

            if torch.npu.is_available():
                for setting in ("matmul", "conv"):  # HF32 is Ascend's TF32: off, for fp32 to be fp32
                    try:
                        getattr(torch.npu, setting).allow_hf32 = False
                    except AttributeError:
                        pass
                return {
                    "device": "npu",
                    "backend": "npu",
                    "name": str(torch.npu.get_device_name(0)),
                    "accel_version": str(getattr(torch_npu, "__version__", "")),
                }
        except ImportError:
            pass
    if want in ("auto", "cuda") and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is judged as fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
        hip = getattr(torch.version, "hip", None)
        return {
            "device": "cuda",
            "backend": "rocm" if hip else "cuda",
            "name": str(torch.cuda.get_device_name(0)),
            "accel_version": str(hip or torch.version.cuda or ""),
        }
    return {"device": "cpu", "backend": "cpu", "name": _cpu_name(), "accel_version": ""}


def header(layer: str, torch, dev: dict, seed: int) -> dict:
    """What both scripts' documents begin with: the layer, and the versions and seed it ran with."""
    return {
        "layer": layer,
        "status": "done",
        "torch": str(torch.__version__),
        "device": dev["name"],
        "backend": dev["backend"],
        "accel_version": dev["accel_version"],
        "seed": seed,
    }


def synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "npu":
        torch.npu.synchronize()


def finite(x):
    """A float JSON can carry (NaN and infinities are not JSON): None for those."""
    x = float(x)
    return x if math.isfinite(x) else None


def emit(doc: dict) -> None:
    """The one line stune reads back (after whatever torch itself printed)."""
    print(MARK + json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False), flush=True)


def no_torch(layer: str, exc: BaseException) -> dict:
    import sys

    return {
        "layer": layer,
        "status": "unavailable",
        "detail": f"PyTorch does not import in {sys.executable} ({type(exc).__name__}: {exc}): install torch "
        "(and torch_npu on Ascend) there, or point validate.python at an interpreter that has it",
    }
