"""`stune-admin doctor`'s accelerator checks (issue 26), per partition whose profile names an `accelerator`:

- which devices the nodes really have against the profile's: a node whose capture holds NVIDIA GPUs (NVML)
  on a partition declared ascend or amd, or AMD/Ascend devices (the capture's `accel` section) on one declared
  nvidia, or another vendor's; and how many devices were found against `gpu.count`;
- gres.conf against those devices (doctor_gres.py);
- the version matrix per vendor: each node's NPU driver, NPU firmware, CANN (and torch_npu / torch where the
  capture has them) on Ascend, ROCm and the amdgpu driver on AMD, as node facts beside NVIDIA's; a partition
  whose nodes differ in any part is named with each value and its nodes.

What a node has comes from its capture (`--facts DIR`, or the hardware-less tree: NodeChecks.node_snapshot);
the `accel` section's format is hw/accel.py's. A part of Doctor (doctor.py), which supplies `add`, `matrix` and
NodeChecks' `node_snapshot`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..accelspec import AMD, ASCEND, NVIDIA
from ..hostlist import compress_hostlist
from .doctor_gres import GresChecks
from .findings import ERROR, OK, WARNING

# The version matrix's parts per vendor, as node facts (the `accel` section's `system` block). torch_npu and
# torch are compared where a capture has them (`system.torch_npu_version`, `system.torch_version`).
VENDOR_FACTS = {
    ASCEND: ("npu_driver", "npu_firmware", "cann", "torch_npu", "torch"),
    AMD: ("rocm", "amdgpu_driver"),
}
SYSTEM_KEYS = {
    "npu_driver": "driver_version",
    "npu_firmware": "firmware_version",
    "cann": "cann_version",
    "torch_npu": "torch_npu_version",
    "torch": "torch_version",
    "rocm": "rocm_version",
    "amdgpu_driver": "driver_version",
}
LABELS = {
    "npu_driver": "NPU driver",
    "npu_firmware": "NPU firmware",
    "cann": "CANN",
    "torch_npu": "torch_npu",
    "torch": "torch",
    "rocm": "ROCm",
    "amdgpu_driver": "amdgpu driver",
}
# Frameworks usually come with the job's container, not the host: a host that differs is a warning.
FRAMEWORKS = ("torch_npu", "torch")
ACCEL_FACT_KEYS = ("accelerator", *(k for keys in VENDOR_FACTS.values() for k in keys))
NOT_THIS_VENDOR = "-"
NOUN = {ASCEND: "Ascend NPU", AMD: "AMD GPU", NVIDIA: "NVIDIA GPU"}


def _dicts(value) -> list[dict]:
    return [d for d in value if isinstance(d, dict)] if isinstance(value, list) else []


def nvml_devices(snap: dict) -> list[dict]:
    gpus = snap.get("gpus")
    return _dicts(gpus.get("devices")) if isinstance(gpus, dict) else []


def accel_section(snap: dict) -> dict | None:
    section = snap.get("accel")
    return section if isinstance(section, dict) else None


def accel_devices(section: dict | None) -> list[dict]:
    return _dicts(section.get("devices")) if section is not None and section.get("answered") is True else []


def accel_facts(snap: dict) -> dict[str, str]:
    """The accelerator facts of one capture: which vendor's devices it found (`nvidia` for NVML's; '?' when
    none) and that vendor's versions ('?' not recorded); the other vendor's parts are '-'."""
    section = accel_section(snap)
    vendor = section.get("vendor") if section is not None else None
    vendor = vendor if isinstance(vendor, str) else None
    facts = dict.fromkeys(ACCEL_FACT_KEYS, NOT_THIS_VENDOR)
    if vendor in VENDOR_FACTS and (accel_devices(section) or not nvml_devices(snap)):
        system = section.get("system") if section is not None else None
        system = system if isinstance(system, dict) else {}
        facts["accelerator"] = str(vendor)
        for key in VENDOR_FACTS[str(vendor)]:
            value = system.get(SYSTEM_KEYS[key])
            facts[key] = str(value)[:40] if isinstance(value, (str, int, float)) and str(value) else "?"
    else:
        facts["accelerator"] = NVIDIA if nvml_devices(snap) else "?"
    return facts


def accel_model(snap: dict) -> list[str]:
    """The device names an `accel` section found (910B3, AMD Instinct MI300X)."""
    return [str(d["name"]) for d in accel_devices(accel_section(snap)) if isinstance(d.get("name"), str)]


def _names(devices: list[dict]) -> str:
    counts = Counter(str(d.get("name") or "?") for d in devices)
    return ", ".join(f"{n} x {name}" for name, n in sorted(counts.items()))


class AccelChecks(GresChecks):
    # what Doctor and NodeChecks supply
    add: Callable[..., None]
    node_snapshot: Callable[..., dict | None]
    matrix: dict[str, dict[str, str]]

    def check_accel(self, profiles, nodes, conf) -> None:
        """Per partition with a profile and a gpu.count (0 skips GPU checks: a CPU partition over accelerator
        nodes is no mismatch): its nodes' devices against its accelerator and gpu.count; on AMD and Ascend
        partitions also gres.conf against those devices."""
        for name, profile in sorted(profiles.items()):
            members = [n for n in nodes if name in n.partitions]
            if not members or not profile.gpu.count:
                continue
            found = self.check_vendor(name, profile, members)
            if profile.accelerator in (AMD, ASCEND):
                self.check_gres_conf(name, profile, members, conf, found)

    def check_vendor(self, part: str, profile, members) -> dict[str, list[dict]]:
        """Each node's devices against the profile's accelerator and gpu.count; returns node -> the devices
        of the profile's vendor its capture found (those whose capture answered)."""
        vendor, want = profile.accelerator, profile.gpu.count
        problems: dict[tuple[str, str, str], list[str]] = {}
        found: dict[str, list[dict]] = {}
        fine = []
        for node in members:
            snap = self.node_snapshot(node.name)
            if not isinstance(snap, dict):
                continue  # check_nodes names it: nothing recorded
            level, text, fix = _vendor_problem(snap, vendor, want)
            if level == OK:
                fine.append(node.name)
            elif level:
                problems.setdefault((level, text, fix), []).append(node.name)
            section = accel_section(snap)
            if section is not None and section.get("vendor") == vendor and section.get("answered") is True:
                found[node.name] = accel_devices(section)  # this vendor's devices, as many as there are
        for (level, text, fix), names in sorted(problems.items()):
            self.add(level, f"accelerator {part}", f"{compress_hostlist(names)}: {text}", fix)
        if fine and vendor != NVIDIA:
            self.add(OK, f"accelerator {part}", f"{compress_hostlist(fine)}: {want} {NOUN[vendor]}(s) found")
        return found

    def check_vendor_versions(self, part: str, members: list[str]) -> bool:
        """The version matrix per vendor over a partition's nodes with facts: each part that differs is named
        with every value and its nodes, the odd ones first. True when none differs."""
        uniform = True
        for vendor, keys in VENDOR_FACTS.items():
            mine = [n for n in members if self.matrix[n].get("accelerator") == vendor]
            for key in keys:
                by_value: dict[str, list[str]] = {}
                for node in mine:
                    value = self.matrix[node].get(key, "?")
                    if value not in ("?", NOT_THIS_VENDOR):
                        by_value.setdefault(value, []).append(node)
                if len(by_value) < 2:
                    continue
                uniform = False
                ordered = sorted(by_value.items(), key=lambda kv: (len(kv[1]), kv[0]))
                shown = ", ".join(f"{value} on {compress_hostlist(nodes)}" for value, nodes in ordered)
                odd = compress_hostlist([n for _, nodes in ordered[:-1] for n in nodes])
                framework = key in FRAMEWORKS
                self.add(
                    WARNING if framework else ERROR,
                    f"partition {part}",
                    f"mixed {LABELS[key]}: {shown}",
                    f"one {LABELS[key]} per partition: "
                    + (
                        f"jobs that use the host's {LABELS[key]} get another on {odd}"
                        if framework
                        else f"upgrade or move {odd} (driver, firmware and CANN/ROCm are validated together)"
                    ),
                )
        return uniform

    def vendor_unknown(self, members: list[str]) -> set[str]:
        """The vendor parts no capture of these nodes recorded (frameworks aside: compared only where there)."""
        out = set()
        for node in members:
            vendor = self.matrix[node].get("accelerator", "?")
            for key in VENDOR_FACTS.get(vendor, ()):
                if key not in FRAMEWORKS and self.matrix[node].get(key) == "?":
                    out.add(key)
        return out


def _vendor_problem(snap: dict, vendor: str, want: int) -> tuple[str, str, str]:
    """(level, what, fix) for one node's capture against the partition's accelerator; level '' when there is
    nothing to say (an NVIDIA partition's node with NVIDIA GPUs or none recorded: health.md's checks)."""
    nvml = nvml_devices(snap)
    section = accel_section(snap)
    other = section.get("vendor") if section is not None else None
    devices = accel_devices(section)
    capture = "`stune-health capture --partition P -o DIR/<node>.json` on the node"
    if vendor == NVIDIA:
        if not nvml and devices and other in (AMD, ASCEND):
            return (
                ERROR,
                f"{len(devices)} {NOUN[str(other)]}(s) ({_names(devices)}) and no NVIDIA GPU, but the "
                "partition's accelerator is nvidia",
                f"set `accelerator: {other}` in the partition's profile, or move the node",
            )
        return OK if nvml else "", "", ""
    if other == vendor:
        if section is not None and section.get("answered") is not True:
            why = str(section.get("error") or "no reason given")[:160]
            return WARNING, f"its {NOUN[vendor]}s could not be read: {why}", capture
        if len(devices) != want:
            return (
                ERROR,
                f"found {len(devices)} {NOUN[vendor]}(s), gpu.count is {want}",
                "a device missing from the tool is lost to jobs (reseat or replace it), or fix gpu.count",
            )
        return OK, "", ""
    if devices and other in (AMD, ASCEND):
        return (
            ERROR,
            f"{len(devices)} {NOUN[str(other)]}(s) ({_names(devices)}), but the partition's accelerator is "
            f"{vendor}",
            f"set `accelerator: {other}` in the partition's profile, or move the node",
        )
    if nvml:
        return (
            ERROR,
            f"NVML found {len(nvml)} NVIDIA GPU(s) ({_names(nvml)}) and no {NOUN[vendor]}, but the "
            f"partition's accelerator is {vendor}",
            "set `accelerator: nvidia` in the partition's profile, or move the node",
        )
    return WARNING, f"no {NOUN[vendor]}s recorded (its capture has no `accel` section)", capture
