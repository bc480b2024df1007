"""Version checks against the partition's validated matrix (`versions:` in the profile).

HCA firmware (`fw_ver`, looked up by `board_id`, then by model `hca_type`), the NVIDIA driver, the CUDA driver
API version and each GPU's VBIOS. A rule is `{min: V}` (V or newer) or `{allowed: [V, ...]}` (exactly one
of these). A version outside the matrix fails: the combination was never validated for this partition.
"""
from __future__ import annotations

from ..profiles import version_key
from . import result as R
from .ib import section


def judge(text, rule) -> tuple[str, str]:
    """(status, what was expected) for one version string against one rule."""
    if rule.min is not None:
        expected = f"{rule.min} or newer"
    else:
        expected = "one of " + ", ".join(rule.allowed)
    if not isinstance(text, str) or not version_key(text):
        return R.UNKNOWN, expected
    key = version_key(text)
    if rule.min is not None:
        return (R.OK if key >= version_key(rule.min) else R.FAIL), expected
    return (R.OK if any(text.strip() == v or key == version_key(v) for v in rule.allowed) else R.FAIL), expected


def check(snapshot, profile, previous: dict) -> tuple[list, dict]:
    results = _hca_firmware(snapshot, profile) if profile.fabric.hcas else []
    if isinstance(snapshot, dict) and "gpus" in snapshot and profile.gpu.count:
        results += _gpu_versions(snapshot, profile.versions)
    return results, {}


def _hca_firmware(snapshot, profile) -> list:
    rules = profile.versions.hca_firmware
    devices, why = section(snapshot, "ib")
    out = []
    for name in dict.fromkeys(h.device for h in profile.fabric.hcas):
        if devices is None or (why is not None and name not in devices):
            out.append(R.unknown("versions.hca_firmware", name, f"cannot judge: {why}"))
            continue
        dev = devices.get(name)
        if not isinstance(dev, dict):
            if name in devices:
                out.append(R.unknown("versions.hca_firmware", name, "unreadable HCA entry"))
            continue  # a missing HCA is the link check's failure
        fw, board, model = dev.get("fw_ver"), dev.get("board_id"), dev.get("hca_type")
        key = next((k for k in (board, model) if isinstance(k, str) and k in rules), None)
        if key is None or rules[key] is None:
            out.append(R.ok("versions.hca_firmware", name, f"fw {fw} (board {board}, {model}): no rule for "
                                                           "this board or model"))
            continue
        status, expected = judge(fw, rules[key])
        seen = f"fw {fw} on board {board} ({model})"
        if status == R.FAIL:
            out.append(R.fail("versions.hca_firmware", name, f"{seen}; expected {expected} (rule {key})",
                              f"{name} fw {fw} not validated"))
        elif status == R.UNKNOWN:
            out.append(R.unknown("versions.hca_firmware", name, f"unreadable fw_ver {fw!r}; expected {expected}"))
        else:
            out.append(R.ok("versions.hca_firmware", name, f"{seen}; expected {expected}"))
    return out


def _gpu_versions(snapshot, versions) -> list:
    gpus = snapshot.get("gpus")
    if not isinstance(gpus, dict) or gpus.get("answered") is not True:
        # the GPU check reports why NVML did not answer; versions just cannot be judged
        return [R.unknown(f"versions.{name}", "node", "not judged: NVML did not answer")
                for name in ("gpu_driver", "cuda_driver", "vbios") if versions[name] is not None]
    out = []
    for name, field, label in (("gpu_driver", "driver_version", "NVIDIA driver"),
                               ("cuda_driver", "cuda_driver_version", "CUDA driver API")):
        rule = versions[name]
        if rule is None:
            continue
        text = gpus.get(field)
        status, expected = judge(text, rule)
        if status == R.FAIL:
            out.append(R.fail(f"versions.{name}", "node", f"{label} {text}; expected {expected}",
                              f"{label} {text} not validated"))
        elif status == R.UNKNOWN:
            out.append(R.unknown(f"versions.{name}", "node", f"unreadable {label} version {text!r}; "
                                                             f"expected {expected}"))
        else:
            out.append(R.ok(f"versions.{name}", "node", f"{label} {text}; expected {expected}"))
    rule = versions.vbios
    devices = gpus.get("devices")
    if rule is not None and isinstance(devices, list):
        bad, unreadable, expected = [], [], ""
        for pos, dev in enumerate(devices):
            text = dev.get("vbios_version") if isinstance(dev, dict) else None
            status, expected = judge(text, rule)
            if status == R.FAIL:
                bad.append(f"gpu{pos} {text}")
            elif status == R.UNKNOWN:
                unreadable.append(f"gpu{pos} {text!r}")
        if bad:
            out.append(R.fail("versions.vbios", "node", f"VBIOS {', '.join(bad)}; expected {expected}",
                              f"{bad[0]} VBIOS not validated"))
        elif unreadable:
            out.append(R.unknown("versions.vbios", "node", f"unreadable VBIOS {', '.join(unreadable)}"))
        else:
            out.append(R.ok("versions.vbios", "node", f"{len(devices)} GPUs; expected {expected or 'any'}"))
    return out
