"""The drift family's PCIe settings (health/drift.py): ACS redirect on the path between GPUs and fabric HCAs,
and the IOMMU mode of those devices, from the drift section's `pci` part (hw/drift.py, hw/pciconfig.py).

ACS: for each GPU and each HCA the profile lists, the PCI devices between them as Linux's p2pdma walks them
(drivers/pci/p2pdma.c: up from the GPU to the first device the HCA's chain shares, that one included, then
up from the HCA to below it). A pair that shares no device meets at the root complex: its traffic goes there
whatever ACS says, so ACS is not judged for it. A device on a path whose ACS Control has P2P Request
Redirect, Completion Redirect or Egress Control on is a drift.
"""

from __future__ import annotations

from ..hw import pciconfig
from ..hw.driftparse import cmdline_passthrough
from . import result
from .driftbase import Drift, ok, unknown

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

IOMMU_TYPES = {"identity": "passthrough", "DMA": "translated", "DMA-FQ": "translated"}
OTHER_TYPES = ("unmanaged", "blocked")  # a domain a driver such as VFIO owns; no DMA for the host's use


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def endpoints(snapshot: dict, profile: Profile, setting: str) -> tuple[list[tuple[str, str]], list[Drift]]:
    """([(label, PCI address)] of the GPUs on the bus, in bus order, and the profile's HCAs), unknowns for what
    cannot be placed."""
    found: list[tuple[str, str]] = []
    problems: list[Drift] = []
    gpus = _dict(snapshot.get("pci_gpus"))
    if profile.gpu.count:
        if gpus.get("answered") is not True:
            problems.append(unknown(setting, "node", "GPUs on the PCI bus", "not read (pci_gpus)"))
        addresses = sorted(a for a in _dict(gpus.get("devices")) if pciconfig.is_pci_address(a))
        found += [(f"gpu{i}", a) for i, a in enumerate(addresses)]
    hcas = _dict(_dict(snapshot.get("ib")).get("devices"))
    for name in dict.fromkeys(h.device for h in profile.fabric.hcas):
        address = _dict(hcas.get(name)).get("pci")
        if isinstance(address, str) and pciconfig.is_pci_address(address):
            found.append((name, address))
        elif name in hcas:
            problems.append(
                unknown(setting, name, f"{name}'s PCI address", f"unreadable ({address!r})"[:120])
            )
    return found, problems


def _pci(snapshot: dict) -> tuple[dict, dict, str]:
    section = _dict(snapshot.get("drift"))
    pci = _dict(section.get("pci"))
    why = "not read: the drift probe did not answer" if section.get("answered") is not True else "not read"
    return _dict(pci.get("endpoints")), _dict(pci.get("config")), why


def _chain(entry, address: str) -> tuple[list[str] | None, str]:
    entry = _dict(entry)
    if entry.get("path") is None and isinstance(entry.get("path_error"), str):
        return None, entry["path_error"][:160]
    chain, why = pciconfig.split_device_path(entry.get("path"))
    if chain is None:
        return None, why or "no device path"
    if chain[-1] != address:
        return None, f"its sysfs path ends at {chain[-1]}, not {address}"
    return chain, ""


def acs(snapshot: dict, profile: Profile) -> list[Drift]:
    setting = "pcie_acs"
    expected = "ReqRedir- CmpltRedir- EgressCtrl-"
    places, out = endpoints(snapshot, profile, setting)
    eps, configs, why = _pci(snapshot)
    chains: dict[str, list[str]] = {}
    for label, address in places:
        if address not in eps:
            out.append(unknown(setting, label, f"{label} {address}", why))
            continue
        chain, problem = _chain(eps[address], address)
        if chain is None:
            out.append(unknown(setting, label, f"where {label} {address} sits", problem))
        else:
            chains[label] = chain
    gpus = [(lab, c) for lab, c in chains.items() if lab.startswith("gpu")]
    hcas = [(lab, c) for lab, c in chains.items() if not lab.startswith("gpu")]
    redirecting: dict[str, list[str]] = {}
    unreadable: dict[str, str] = {}
    paths = 0
    for gpu, up_a in gpus:
        for hca, up_b in hcas:
            devices = path_between(up_a, up_b)
            if devices is None:
                continue  # they meet at the root complex
            paths += 1
            for device in devices:
                ctrl, problem = _acs_ctrl(configs.get(device))
                if problem:
                    unreadable.setdefault(device, problem)
                elif ctrl & pciconfig.ACS_REDIRECT:
                    redirecting.setdefault(device, []).append(f"{gpu}-{hca}")
    for device, pairs in sorted(redirecting.items()):
        ctrl, _ = _acs_ctrl(configs.get(device))
        more = f" (+{len(pairs) - 1} more)" if len(pairs) > 1 else ""
        out.append(
            Drift(
                setting,
                device,
                result.DEGRADED,
                f"ACS on {device}",
                pciconfig.acs_words(ctrl),
                expected,
                f"setpci -s {device} ECAP_ACS+0x6.w=0000",
                f"on the path {pairs[0]}{more}: peer-to-peer goes up to the root complex instead of across the "
                f"switch. setpci lasts until reboot: boot with pci=disable_acs_redir={device}, or switch ACS "
                "off in the BIOS",
            )
        )
    for device, problem in sorted(unreadable.items()):
        out.append(unknown(setting, device, f"ACS on {device}", problem, expected))
    if not redirecting and chains and not any(d.status == result.UNKNOWN for d in out):
        have = (
            f"off on {paths} GPU-HCA path(s) through PCIe switches"
            if paths
            else "not in the way (no GPU shares a PCIe switch with a fabric HCA: they meet at the root complex)"
        )
        out.append(ok(setting, "node", "ACS redirect", have, expected))
    return out


def path_between(up_a: list[str], up_b: list[str]) -> list[str] | None:
    """The devices a peer-to-peer transfer between the last devices of two chains (host bridge side first)
    crosses, as Linux's p2pdma counts them; None when the chains share none (the root complex joins them)."""
    a, b = list(reversed(up_a)), list(reversed(up_b))
    shared = set(b)
    for i, device in enumerate(a):
        if device in shared:
            return a[: i + 1] + b[: b.index(device)]
    return None


def _acs_ctrl(entry) -> tuple[int, str]:
    """(ACS Control, '') of a captured config entry (0 when the device has no ACS capability), or (0, why it
    cannot be told)."""
    if not isinstance(entry, dict):
        return 0, "config space not read"
    if entry.get("problem"):
        return 0, str(entry["problem"])[:160]
    found = entry.get("acs")
    if found is None and "acs" in entry:
        return 0, ""
    ctrl = found.get("ctrl") if isinstance(found, dict) else None
    if type(ctrl) is not int or not 0 <= ctrl <= 0xFFFF:
        return 0, f"unreadable ACS entry {found!r}"[:160]
    return ctrl, ""


def iommu(snapshot: dict, profile: Profile) -> list[Drift]:
    setting, what = "iommu", "IOMMU"
    allowed = list(profile.drift.iommu or ())
    expected = " or ".join(allowed)
    places, out = endpoints(snapshot, profile, setting)
    eps, _, why = _pci(snapshot)
    host = _dict(_dict(snapshot.get("drift")).get("host"))
    modes: dict[str, list[str]] = {}
    for label, address in places:
        entry = eps.get(address)
        if not isinstance(entry, dict):
            out.append(unknown(setting, label, f"{label}'s IOMMU", why, expected))
            continue
        mode, problem = _mode(entry, host.get("cmdline"))
        if mode is None:
            out.append(unknown(setting, label, f"{label}'s IOMMU", problem, expected))
        else:
            modes.setdefault(mode, []).append(label)
    wrong = {m: labels for m, labels in modes.items() if m not in allowed}
    for mode, labels in sorted(wrong.items()):
        who = ", ".join(labels[:3]) + (f" (+{len(labels) - 3} more)" if len(labels) > 3 else "")
        out.append(
            Drift(
                setting,
                "node",
                result.DEGRADED,
                what,
                f"{mode} for {who}",
                expected,
                _iommu_fix(mode, allowed),
                "(on the kernel command line, then reboot); translated DMA slows or breaks GPUDirect RDMA",
            )
        )
    if modes and not wrong and not any(d.status == result.UNKNOWN for d in out):
        out.append(ok(setting, "node", what, " and ".join(sorted(modes)), expected))
    return out


def _mode(entry: dict, cmdline) -> tuple[str | None, str]:
    if isinstance(entry.get("iommu_error"), str):
        return None, entry["iommu_error"][:160]
    group, kind = entry.get("iommu_group"), entry.get("iommu_type")
    if group is None:
        return "off", ""  # the kernel puts a device behind an IOMMU in a group; none: no translation
    if not isinstance(group, str) or not group.isascii() or not group.isdigit():
        return None, f"unreadable iommu_group {group!r}"[:120]
    if kind is None:  # no iommu_group/type file (kernels before 5.11): the command line says
        passthrough = cmdline_passthrough(cmdline)
        if passthrough:
            return "passthrough", ""
        return None, "no iommu_group/type, and no iommu=pt on the kernel command line to go by"
    if kind in IOMMU_TYPES:
        return IOMMU_TYPES[kind], ""
    if kind in OTHER_TYPES:
        return kind, ""
    return None, f"unreadable iommu_group/type {kind!r}"[:120]


def _iommu_fix(mode: str, allowed: list[str]) -> str:
    if "passthrough" in allowed and mode in ("translated", "unmanaged", "blocked"):
        return "boot with iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=pt)"
    if "off" in allowed and mode != "off":
        return "boot with intel_iommu=off (or amd_iommu=off), or iommu=pt if IOMMU must stay on"
    if "passthrough" in allowed:
        return "boot with intel_iommu=on iommu=pt (or amd_iommu=on iommu=pt)"
    return "boot without iommu=pt (translated DMA)"
