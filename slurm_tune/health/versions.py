"""Version checks against the partition's validated matrix (`versions:` in the profile).

HCA firmware (`fw_ver`, by the board's PSID `board_id` - exactly, or by a glob pattern such as `DEL*` for
OEM PSIDs - then by model `hca_type`), the NVIDIA driver, the CUDA driver API version and each GPU's VBIOS.
A rule is `{min: V}` (V or newer) or `{allowed: [V, ...]}` (exactly one of these). A version outside the
matrix fails: the combination was never validated for this partition. AMD and Ascend nodes: ROCm and the
amdgpu driver, the NPU driver, firmware and CANN, from the `accel` section (text.parse_vendor_version's
order: 24.1.rc2 < 24.1.rc3 < 24.1.0). A version, board_id or model that is not fully well formed is
unknown, naming where it was read: garbage is never a lower version.
"""

from __future__ import annotations

from ..hw.sysfs import IB_CLASS
from ..text import parse_vendor_version, parse_version
from . import result
from .ib import section

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
ID_MAX = 64


def judge(text, rule, hex_parts: bool = False, vendor: bool = False) -> tuple[str, str]:
    """(status, what was expected) for one version string against one rule: unknown unless `text` is a
    fully well-formed version (`vendor`: an accelerator stack's, with pre-release tags: 24.1.rc2 < 24.1.0)."""
    if rule.min is not None:
        expected = f"{rule.min} or newer"
    else:
        expected = "one of " + ", ".join(rule.allowed)

    def parse(version):
        return parse_vendor_version(version) if vendor else parse_version(version, hex_parts)

    key = parse(text)
    if key is None:
        return result.UNKNOWN, expected
    if rule.min is not None:
        floor = parse(rule.min)
        if floor is None:  # profilecheck refuses such a profile; one that slipped through cannot judge
            return result.UNKNOWN, expected
        return (result.OK if key >= floor else result.FAIL), expected
    return (result.OK if any(key == parse(v) for v in rule.allowed) else result.FAIL), expected


def well_formed_id(text) -> bool:
    """A board_id (PSID, e.g. MT_0000000223, DEL0000000010) or hca_type (MT4123) as the kernel shows it."""
    return isinstance(text, str) and 0 < len(text) <= ID_MAX and all(c in ID_CHARS for c in text)


def is_pattern(key: str) -> bool:
    return "*" in key or "?" in key


def glob_match(pattern: str, text: str) -> bool:
    """`*` (any run) and `?` (one character), case-sensitive, like fnmatchcase for these two; hand-made
    because fnmatch imports re (the hot-path rule, docs/speed.md)."""
    p = t = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            p, t = p + 1, t + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark, p = p, t, p + 1
        elif star >= 0:
            p, mark = star + 1, mark + 1
            t = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def match_rule(rules, board, model) -> tuple[str | None, str | None]:
    """(the rule key that applies, None) or (None, why it cannot be told). Order: the exact board_id, the
    first PSID pattern (in the profile's order) matching it, the model. (None, None): no rule matches."""
    board_ok, model_ok = well_formed_id(board), well_formed_id(model)
    if board_ok:
        if board in rules and not is_pattern(board):
            return board, None
        for key in rules:
            if is_pattern(key) and glob_match(key, board):
                return key, None
    if model_ok and model in rules and not is_pattern(model):
        return model, None
    if not board_ok:
        return None, f"unreadable board_id {board!r}"
    if not model_ok:
        return None, f"no rule for board {board} and unreadable hca_type {model!r}"
    return None, None


# The accelerator stacks' rules (issue 26): rule -> (vendor, the `accel` section's `system` key, what it is)
ACCEL_VERSIONS = {
    "npu_driver": ("ascend", "driver_version", "Ascend NPU driver"),
    "npu_firmware": ("ascend", "firmware_version", "Ascend NPU firmware"),
    "cann": ("ascend", "cann_version", "CANN toolkit"),
    "rocm": ("amd", "rocm_version", "ROCm"),
    "amdgpu_driver": ("amd", "driver_version", "amdgpu driver"),
}


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    results = _hca_firmware(snapshot, profile) if profile.fabric.hcas else []
    if not isinstance(snapshot, dict) or not profile.gpu.count:
        return results, {}
    if "gpus" in snapshot and profile.accelerator == "nvidia":
        results += _gpu_versions(snapshot, profile.versions)
    if "accel" in snapshot:
        results += _accel_versions(snapshot["accel"], profile)
    return results, {}


def node_version(name: str, label: str, text, rule, where: str, vendor: bool = False) -> result.Result:
    """One version of the node's (a driver, a toolkit) against its rule: `where` says where it was read, for
    an unreadable one."""
    status, expected = judge(text, rule, vendor=vendor)
    if status == result.FAIL:
        return result.fail(
            f"versions.{name}",
            "node",
            f"{label} {text}; expected {expected}",
            f"{label} {text} not validated",
        )
    if status == result.UNKNOWN:
        shown = repr(text) if not isinstance(text, str) or len(text) <= 200 else repr(text[:200]) + "..."
        return result.unknown(
            f"versions.{name}", "node", f"unreadable {label} version {shown}{where}; expected {expected}"
        )
    return result.ok(f"versions.{name}", "node", f"{label} {text}; expected {expected}")


def _accel_versions(section, profile: Profile) -> list:
    """The version matrix of an AMD or Ascend node (the `accel` section's `system`, read even when the devices
    did not answer): each rule of the section's vendor that the profile sets. A version that is missing or
    not fully well formed is unknown, with the backend's reason."""
    vendor = section.get("vendor") if isinstance(section, dict) else None
    vendor = vendor if vendor in ("amd", "ascend") else profile.accelerator
    system = section.get("system") if isinstance(section, dict) else None
    system = system if isinstance(system, dict) else {}
    errors = system.get("errors")
    errors = errors if isinstance(errors, dict) else {}
    out = []
    for name, (owner, key, label) in ACCEL_VERSIONS.items():
        rule = getattr(profile.versions, name)
        if rule is None or owner != vendor:
            continue
        why = errors.get(key)
        why = f" ({' '.join(why.split())[:160]})" if isinstance(why, str) and why.strip() else ""
        out.append(node_version(name, label, system.get(key), rule, why, vendor=True))
    return out


def _hca_firmware(snapshot, profile: Profile) -> list:
    rules = profile.versions.hca_firmware
    devices, why = section(snapshot, "ib")
    out = []
    for name in dict.fromkeys(h.device for h in profile.fabric.hcas):
        if devices is None or (why is not None and name not in devices):
            out.append(result.unknown("versions.hca_firmware", name, f"cannot judge: {why}"))
            continue
        try:  # one HCA's bad data (or a bug it triggers) is that HCA's finding only
            found = _one_hca(name, devices, rules)
        except Exception as exc:
            found = result.unknown(
                "versions.internal", name, f"internal error judging {name}: {type(exc).__name__}: {exc}"
            )
        if found is not None:
            out.append(found)
    return out


def _shown(value) -> str | None:
    """A firmware field as a message shows it: the text, or None when it is missing or not text."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def hca_seen(fw, board, model) -> str:
    """What was read of an HCA, for a message: `fw 20.31.1014 on board MT_0000000223 (MT4123)`; a field that
    is missing says so (`fw unreadable on board MT_0000000223 (hca_type unreadable)`), never `None`."""
    fw_s, board_s, model_s = _shown(fw), _shown(board), _shown(model)
    return (
        f"fw {fw_s or 'unreadable'} on "
        + (f"board {board_s}" if board_s else "an unreadable board_id")
        + f" ({model_s or 'hca_type unreadable'})"
    )


def _one_hca(name: str, devices: dict, rules):
    """The firmware finding for one HCA the profile lists (None: missing, which the link check fails)."""
    dev = devices.get(name)
    if not isinstance(dev, dict):
        return (
            result.unknown("versions.hca_firmware", name, "unreadable HCA entry") if name in devices else None
        )
    if isinstance(dev.get("unreadable"), str):
        return result.unknown(
            "versions.hca_firmware", name, f"unreadable {IB_CLASS}/{name}: {dev['unreadable']}"
        )
    fw, board, model = dev.get("fw_ver"), dev.get("board_id"), dev.get("hca_type")
    seen = hca_seen(fw, board, model)
    if not list(rules):
        return result.ok("versions.hca_firmware", name, f"{seen}: the profile has no firmware rules")
    key, problem = match_rule(rules, board, model)
    if problem:
        return result.unknown(
            "versions.hca_firmware",
            name,
            f"{problem} ({IB_CLASS}/{name}/"
            f"{'board_id' if 'board_id' in problem else 'hca_type'}); cannot tell which firmware "
            "rule applies",
        )
    if key is None:
        return result.warning(
            "versions.hca_firmware",
            name,
            f"{seen}: no firmware rule matches this HCA "
            f"(rules: {', '.join(rules)}); add its PSID, a PSID pattern or its model",
        )
    if rules[key] is None:
        return result.ok("versions.hca_firmware", name, f"{seen}: rule {key} switched off")
    status, expected = judge(fw, rules[key])
    if status == result.FAIL:
        return result.fail(
            "versions.hca_firmware",
            name,
            f"{seen}; expected {expected} (rule {key})",
            f"{name} fw {fw} not validated",
        )
    if status == result.UNKNOWN:
        return result.unknown(
            "versions.hca_firmware",
            name,
            f"unreadable fw_ver {fw!r} ({IB_CLASS}/{name}/fw_ver); expected {expected}",
        )
    return result.ok("versions.hca_firmware", name, f"{seen}; expected {expected} (rule {key})")


def _gpu_versions(snapshot, versions) -> list:
    gpus = snapshot.get("gpus")
    if not isinstance(gpus, dict) or gpus.get("answered") is not True:
        # the GPU check reports why NVML did not answer; versions just cannot be judged
        return [
            result.unknown(f"versions.{name}", "node", "not judged: NVML did not answer")
            for name in ("gpu_driver", "cuda_driver", "vbios")
            if versions[name] is not None
        ]
    out = []
    for name, field, label in (
        ("gpu_driver", "driver_version", "NVIDIA driver"),
        ("cuda_driver", "cuda_driver_version", "CUDA driver API"),
    ):
        rule = versions[name]
        if rule is None:
            continue
        out.append(node_version(name, label, gpus.get(field), rule, f" (NVML {field})"))
    rule = versions.vbios
    devices = gpus.get("devices")
    if rule is not None and isinstance(devices, list):
        bad, unreadable, expected = [], [], ""
        for pos, dev in enumerate(devices):
            text = dev.get("vbios_version") if isinstance(dev, dict) else None
            status, expected = judge(text, rule, hex_parts=True)
            if status == result.FAIL:
                bad.append(f"gpu{pos} {text}")
            elif status == result.UNKNOWN:
                unreadable.append(f"gpu{pos} {text!r}")
        if bad:
            out.append(
                result.fail(
                    "versions.vbios",
                    "node",
                    f"VBIOS {', '.join(bad)}; expected {expected}",
                    f"{bad[0]} VBIOS not validated",
                )
            )
        elif unreadable:
            out.append(
                result.unknown(
                    "versions.vbios", "node", f"unreadable VBIOS {', '.join(unreadable)} (NVML vbios_version)"
                )
            )
        else:
            out.append(
                result.ok("versions.vbios", "node", f"{len(devices)} GPUs; expected {expected or 'any'}")
            )
    return out
