"""Slurm's TRES strings: `billing=2,cpu=2,gres/gpu=4,node=2` (sacct AllocTRES, squeue tres_alloc_str), and
the GPUs of a node's GRES string (`gpu:a100:8(S:0-1)`)."""

from __future__ import annotations


def tres_value(tres: str, key: str) -> str | None:
    """The value of `key` in a TRES string ('billing=2,cpu=2,gres/gpu=4,node=2' -> '4' for 'gres/gpu'), or
    None. Only the exact key counts: a typed entry (gres/gpu:a100=4) counts the same GPUs again."""
    for item in tres.split(","):
        name, sep, value = item.partition("=")
        if sep and name == key:
            return value
    return None


# The TRES of the devices a job holds, whatever the vendor: NVIDIA and AMD GPUs (gres/gpu) and Ascend NPUs
# (gres/npu, recorded where AccountingStorageTRES names it). The accountant charges idle holding of either.
ACCEL_TRES = ("gres/gpu", "gres/npu")


def accel_count(tres: str) -> float:
    """The accelerator devices in a TRES string: its gres/gpu plus its gres/npu ('gres/npu=2' -> 2.0)."""
    return sum(tres_count(tres, key) for key in ACCEL_TRES)


def tres_count(tres: str, key: str) -> float:
    """The count of `key` in a TRES string as a number ('gres/gpu=4' -> 4.0); 0.0 when absent or unreadable.
    A unit suffix (K, M, G, T, P: sacct without --noconvert) is dropped, not scaled: counts carry none."""
    try:
        return float((tres_value(tres, key) or "").rstrip("KMGTP") or 0)
    except ValueError:
        return 0.0


def gres_gpus(gres: str, name: str = "gpu") -> int:
    """GPUs in a GRES string: gpu:4, gpu:a100:8(S:0-1), gpu:2,shard:8 (`name`: another GRES's count, npu)."""
    total = 0
    for part in gres.split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == name and fields[-1].isdigit() and len(fields) > 1:
            total += int(fields[-1])
    return total
