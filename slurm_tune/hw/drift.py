"""The `drift` snapshot section: the host settings that make training slow without failing, read once under
the relocatable root (procfs too: `<root>/proc/...`), for the drift checks (health/drift.py) to judge offline.

    host.modules         /proc/modules, as text (nvidia-peermem / nv_peer_mem)
    host.cmdline         /proc/cmdline (iommu=pt)
    host.iommu_units     the IOMMUs in /sys/class/iommu
    host.governors       {policy: scaling_governor} from /sys/devices/system/cpu/cpufreq (None: no cpufreq)
    host.thp             /sys/kernel/mm/transparent_hugepage/enabled
    host.numa_balancing  /proc/sys/kernel/numa_balancing
    host.sysctls         {name: value} for DEFAULT_SYSCTLS and the ones the profile names (None: no such file)
    host.processes       slurmd's pids with their /proc/<pid>/limits text; nv-fabricmanager's pids
    host.nvswitches      NVIDIA bridge-class devices on the PCI bus (NVSwitches)
    pci.endpoints        per GPU and HCA: its path below sys/devices, its IOMMU group and the group's type
    pci.config           per endpoint and every PCI device above one: the ACS capability (hw/pciconfig.py)

Values are kept as the node showed them; parsing happens in the checks. One probe under the deadline: a stall
keeps what was read before it, and the section says it did not answer. Only the periodic run's full capture
and `stune-health capture` take it (health/collect.py): the prolog never does (docs/speed.md).
"""

from __future__ import annotations

import os

from ..text import is_digits
from . import pciconfig
from .sysfs import PCI_DEVICES, Sysfs

# Often tuned, and cheap to read: every capture has them, so two nodes' captures can be compared.
DEFAULT_SYSCTLS = (
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.core.netdev_max_backlog",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_mtu_probing",
    "vm.zone_reclaim_mode",
    "vm.swappiness",
    "vm.max_map_count",
    "kernel.numa_balancing",
)
MODULES_MAX = 1 << 18
LIMITS_MAX = 8192
PROCS_MAX = 1 << 17  # entries of /proc looked at
SLURMD, FABRICMANAGER = "slurmd", "nv-fabricmanage"  # comm is cut at 15 characters: nv-fabricmanager
NVIDIA, BRIDGE_OTHER = "0x10de", "0x0680"  # NVSwitch: an NVIDIA "bridge: other" (class 0x0680xx)
CPUFREQ = "sys/devices/system/cpu/cpufreq"
THP = "sys/kernel/mm/transparent_hugepage/enabled"
NUMA_BALANCING = "proc/sys/kernel/numa_balancing"


def sysctl_path(name: str) -> str:
    """`net.core.rmem_max` -> proc/sys/net/core/rmem_max; a name with slashes is a path already."""
    return "proc/sys/" + (name if "/" in name else name.replace(".", "/"))


def read_text(sysfs: Sysfs, rel: str, most: int) -> str | None:
    """A text file that may be longer than one sysfs page (/proc/modules), its first `most` bytes; None when
    missing or unreadable (said in sysfs.problems)."""
    data, problem = pciconfig.read_file(sysfs.path(rel), most)
    if problem:
        sysfs.problems.append(f"{rel}: {problem}")
    return None if data is None else data.decode("utf-8", "replace")


def _link_name(sysfs: Sysfs, rel: str) -> tuple[str | None, str | None]:
    """(the basename a link points at, None); (None, None) when there is no link; (None, why) otherwise."""
    try:
        return os.path.basename(os.readlink(sysfs.path(rel)).rstrip("/")), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{rel}: {exc.strerror}"


def governors(sysfs: Sysfs) -> dict | None:
    names, why = sysfs.listdir_checked(CPUFREQ)
    if why is not None:
        return None if why == "missing" else {"error": why}
    return {p: sysfs.read(f"{CPUFREQ}/{p}/scaling_governor") for p in names if p.startswith("policy")}


def processes(sysfs: Sysfs) -> dict:
    """slurmd's pids, each with its limits text, and nv-fabricmanager's pids, from <root>/proc/*/comm."""
    out: dict = {"slurmd": [], "fabricmanager": [], "error": None}
    names, why = sysfs.listdir_checked("proc")
    if why is not None:
        out["error"] = f"proc: {why}"
        return out
    for pid in names[:PROCS_MAX]:
        if not is_digits(pid):
            continue
        comm = sysfs.read(f"proc/{pid}/comm")
        if comm == SLURMD:
            out["slurmd"].append({"pid": pid, "limits": read_text(sysfs, f"proc/{pid}/limits", LIMITS_MAX)})
        elif comm == FABRICMANAGER:
            out["fabricmanager"].append(pid)
    return out


def nvswitches(sysfs: Sysfs) -> list[str]:
    found = []
    for address in sysfs.listdir(PCI_DEVICES):
        if (sysfs.read(f"{PCI_DEVICES}/{address}/vendor") or "").lower() != NVIDIA:
            continue
        if (sysfs.read(f"{PCI_DEVICES}/{address}/class") or "").lower().startswith(BRIDGE_OTHER):
            found.append(address)
    return found


def endpoint(sysfs: Sysfs, address: str) -> dict:
    """Where a GPU or HCA sits (its sysfs path below sys/devices) and its IOMMU group's type."""
    base = f"{PCI_DEVICES}/{address}"
    path, why = pciconfig.device_path(sysfs.root, base)
    group, group_why = _link_name(sysfs, f"{base}/iommu_group")
    return {
        "path": path,
        "path_error": why,
        "iommu_group": group,
        "iommu_error": group_why,
        "iommu_type": sysfs.read(f"{base}/iommu_group/type") if group else None,
    }


def config(sysfs: Sysfs, address: str) -> dict:
    """The ACS capability of one PCI device, from its config space (hw/pciconfig.py)."""
    data, why = pciconfig.read_config(sysfs.path(f"{PCI_DEVICES}/{address}/config"))
    if why is not None or data is None:
        return {"size": 0, "acs": None, "problem": f"config: {why or 'missing'}"}
    return pciconfig.parse_acs(data)


def capture(root: str, timeout_s: float, *, pci: list[str], sysctls) -> dict:
    """The `drift` section. `pci`: the GPUs' and HCAs' PCI addresses (from the capture's other sections);
    `sysctls`: the names to read beyond DEFAULT_SYSCTLS."""
    from .deadline import OK, run_probe

    sysfs = Sysfs(root)
    names = list(dict.fromkeys([*DEFAULT_SYSCTLS, *sysctls]))

    def probe(partial):
        host: dict = {}
        pcis: dict = {"endpoints": {}, "config": {}}
        partial.value = {"host": host, "pci": pcis}
        host["modules"] = read_text(sysfs, "proc/modules", MODULES_MAX)
        host["cmdline"] = sysfs.read("proc/cmdline")
        host["iommu_units"] = sysfs.listdir("sys/class/iommu")
        host["governors"] = governors(sysfs)
        host["thp"] = sysfs.read(THP)
        host["numa_balancing"] = sysfs.read(NUMA_BALANCING)
        host["sysctls"] = {}
        for name in names:
            host["sysctls"][name] = sysfs.read(sysctl_path(name))
        host["processes"] = processes(sysfs)
        host["nvswitches"] = nvswitches(sysfs)
        for address in dict.fromkeys(a for a in pci if pciconfig.is_pci_address(a)):
            found = pcis["endpoints"][address] = endpoint(sysfs, address)
            chain, _ = pciconfig.split_device_path(found["path"])
            for device in chain or [address]:
                if device not in pcis["config"]:
                    pcis["config"][device] = config(sysfs, device)
        return partial.value

    result = run_probe("sysfs-drift", probe, timeout_s)
    section = dict(result.value) if isinstance(result.value, dict) else {}
    section["answered"] = result.status == OK
    if result.status != OK:
        section["error"] = result.message
    section["elapsed_s"] = round(result.elapsed_s, 4)
    section["problems"] = list(sysfs.problems)
    return section
