"""The drift family's GPU settings (health/drift.py): each GPU's enforced power limit and its SM and memory
application clocks against the profile's drift.gpu_power_limit_w / gpu_sm_clock_mhz / gpu_mem_clock_mhz,
from NVML's answers in the snapshot's `gpus` section (live, or replayed from a GPU snapshot file).

Per GPU a drift or an unknown; when every GPU is as declared, one ok for the node."""

from __future__ import annotations

from . import result
from .driftbase import Drift, ok, unknown

POWER_SLACK_W = 0.5  # NVML answers milliwatts; `nvidia-smi -pl 400` sets 400000 mW


def _count(value) -> int | None:
    return value if type(value) is int and 0 < value < 1 << 20 else None


def _watts(value) -> float | None:
    return float(value) if type(value) in (int, float) and 0 < value < 1e5 else None


def gpu_settings(snapshot: dict, want) -> list[Drift]:
    power, sm, mem = want.gpu_power_limit_w, want.gpu_sm_clock_mhz, want.gpu_mem_clock_mhz
    settings = [s for s, v in (("gpu_power_limit", power), ("gpu_clocks", sm or mem)) if v]
    if not settings:
        return []
    gpus = snapshot.get("gpus")
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    if not isinstance(gpus, dict) or gpus.get("answered") is not True or not isinstance(devices, list):
        return [unknown(s, "node", s.replace("_", " "), "not judged: NVML did not answer") for s in settings]
    out: list[Drift] = []
    if power:
        out += _power(devices, power)
    if sm or mem:
        out += _clocks(devices, sm, mem)
    return out


def _power(devices: list, wanted: int) -> list[Drift]:
    out = []
    expected = f"{wanted} W"
    for pos, dev in enumerate(devices):
        subject, what = f"gpu{pos}", f"gpu{pos} power limit"
        have = _watts(dev.get("power_limit_w")) if isinstance(dev, dict) else None
        if have is None:
            out.append(unknown("gpu_power_limit", subject, what, "not read (NVML power_limit)", expected))
        elif abs(have - wanted) >= POWER_SLACK_W:
            out.append(
                Drift(
                    "gpu_power_limit",
                    subject,
                    result.DEGRADED,
                    what,
                    f"{have:g} W",
                    expected,
                    f"nvidia-smi -i {pos} -pl {wanted}",
                    "(the enforced limit; set it at every boot, e.g. in the node's GPU setup unit)",
                )
            )
    if not out:
        out.append(
            ok("gpu_power_limit", "node", "GPU power limit", f"{expected} on {len(devices)} GPUs", expected)
        )
    return out


def _clocks(devices: list, sm: int | None, mem: int | None) -> list[Drift]:
    out = []
    expected = " ".join(f"{k} {v} MHz" for k, v in (("SM", sm), ("memory", mem)) if v)
    for pos, dev in enumerate(devices):
        subject, what = f"gpu{pos}", f"gpu{pos} application clocks"
        clocks = dev.get("app_clocks_mhz") if isinstance(dev, dict) else None
        clocks = clocks if isinstance(clocks, dict) else {}
        have_sm, have_mem = _count(clocks.get("sm")), _count(clocks.get("mem"))
        if (sm and have_sm is None) or (mem and have_mem is None):
            out.append(unknown("gpu_clocks", subject, what, "not read (NVML application clocks)", expected))
            continue
        if (sm and have_sm != sm) or (mem and have_mem != mem):
            out.append(
                Drift(
                    "gpu_clocks",
                    subject,
                    result.DEGRADED,
                    what,
                    f"SM {have_sm} MHz memory {have_mem} MHz",
                    expected,
                    f"nvidia-smi -i {pos} -ac {mem or have_mem},{sm or have_sm}",
                    "(memory,SM; set them at every boot)",
                )
            )
    if not out:
        out.append(
            ok("gpu_clocks", "node", "GPU application clocks", f"{expected} on {len(devices)} GPUs", expected)
        )
    return out
