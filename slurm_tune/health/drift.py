"""The `drift` family: host settings that make training slow without failing, against the profile's `drift`
section (driftspec.py, with defaults per fabric). Judged only where the snapshot has a `drift` section (the
periodic run's full capture and `stune-health capture`: hw/drift.py), never in a hook.

Every finding is degraded (the node stays in service for single-node jobs, multi-node jobs avoid it) with
a reason that says the fix; a setting that cannot be read (a missing or garbled file, a probe that did not
answer) is unknown, never a drift. `findings()` is also what `stune-admin doctor`'s drift table is made of.

    gdr_module      nvidia-peermem or nv_peer_mem loaded where GPUDirect RDMA is expected (gdr.py's rule)
    pcie_acs        no ACS P2P redirect between a GPU and a fabric HCA under one switch (driftpci.py)
    iommu           the GPUs' and HCAs' IOMMU mode (driftpci.py)
    fabricmanager   nv-fabricmanager running where NVSwitches are on the PCI bus
    slurmd_memlock  slurmd's locked-memory limit unlimited (its jobs inherit it; RDMA pins memory)
    cpu_governor    every cpufreq policy's governor
    thp             transparent huge pages mode
    numa_balancing  kernel.numa_balancing
    gpu_power_limit each GPU's enforced power limit; gpu_clocks: its SM / memory application clocks (NVML)
    roce_mtu        each fabric HCA netdev's MTU (RoCE)
    sysctl <name>   each sysctl the profile names
"""

from __future__ import annotations

from ..gdr import profile_expects_gdr
from ..hw import driftparse as parse
from ..hw.sysfs import parse_int
from . import driftpci, result
from .driftbase import Drift, ok, unknown

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

FABRIC_WORDS = {"ib": "IB", "roce": "RoCE", "tcp": "TCP"}


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    if not isinstance(snapshot, dict) or "drift" not in snapshot:
        return [], {}
    return [f.result() for f in findings(snapshot, profile)], {}


def findings(snapshot: dict, profile: Profile) -> list[Drift]:
    """Every drift finding the profile asks for, one family check after another; a bug in one check is an
    unknown for its setting, never the others'."""
    host, why = _host(snapshot)
    want = profile.drift
    gdr = profile_expects_gdr(profile)
    checks = [
        ("gdr_module", gdr and want.gdr_module, lambda: [_gdr_module(host, why, profile)]),
        ("pcie_acs", gdr and want.pcie_acs, lambda: driftpci.acs(snapshot, profile)),
        ("iommu", want.iommu is not None, lambda: driftpci.iommu(snapshot, profile)),
        ("fabricmanager", want.fabricmanager, lambda: [_fabricmanager(host, why)]),
        ("slurmd_memlock", want.slurmd_memlock, lambda: [_memlock(host, why)]),
        (
            "cpu_governor",
            want.cpu_governor is not None,
            lambda: [_governor(host, why, str(want.cpu_governor))],
        ),
        ("thp", want.thp is not None, lambda: [_thp(host, why, want.thp)]),
        (
            "numa_balancing",
            want.numa_balancing is not None,
            lambda: [_numa(host, why, bool(want.numa_balancing))],
        ),
        ("gpu", bool(profile.gpu.count), lambda: _gpu_settings(snapshot, want)),
        (
            "roce_mtu",
            profile.fabric.type == "roce" and want.roce_mtu_min is not None,
            lambda: _mtu(snapshot, profile),
        ),
        ("sysctl", bool(want.sysctls), lambda: _sysctls(host, why, want.sysctls)),
    ]
    out: list[Drift] = []
    for setting, applies, run in checks:
        if not applies:
            continue
        try:
            out += [f for f in run() if f is not None]
        except Exception as exc:  # a bug in one check must never drain, nor hide the other settings
            out.append(unknown(setting, "node", setting, f"internal error: {type(exc).__name__}: {exc}"))
    return out


def _host(snapshot: dict) -> tuple[dict, str]:
    """(the host part of the drift section, why a key missing from it was not read)."""
    section = snapshot.get("drift")
    if not isinstance(section, dict):
        return {}, "the snapshot's drift section is unreadable"
    host = section.get("host")
    if section.get("answered") is not True:
        err = section.get("error")
        why = (
            f"not read: {err}" if isinstance(err, str) and err else "not read: the drift probe did not answer"
        )
    else:
        why = "not in the snapshot's drift section"
    return (host if isinstance(host, dict) else {}), why


def _gdr_module(host: dict, why: str, profile: Profile) -> Drift:
    setting, what = "gdr_module", "nvidia-peermem"
    expected = "nvidia-peermem or nv_peer_mem loaded"
    if "modules" not in host:
        return unknown(setting, "node", what, why)
    name, problem = parse.loaded_gdr_module(host["modules"])
    if problem:
        return unknown(setting, "node", what, f"cannot tell whether it is loaded: {problem}")
    if name:
        return ok(setting, "node", "GPUDirect RDMA module", f"{name} loaded", expected)
    fabric = FABRIC_WORDS.get(profile.fabric.type, profile.fabric.type)
    return Drift(
        setting,
        "node",
        result.DEGRADED,
        what,
        "not loaded",
        expected,
        "modprobe nvidia-peermem",
        f"(GPUDirect RDMA: nccl.net_gdr_level {profile.nccl.net_gdr_level} on an {fabric} partition), and "
        "list it in /etc/modules-load.d so a reboot keeps it; without it NCCL stages every message through "
        "host memory",
    )


def _processes(host: dict, why: str) -> tuple[dict | None, str]:
    procs = host.get("processes")
    if "processes" not in host:
        return None, why
    if not isinstance(procs, dict):
        return None, "unreadable process list"
    if procs.get("error"):
        return None, f"cannot list processes: {procs['error']}"
    return procs, ""


def _fabricmanager(host: dict, why: str) -> Drift:
    setting, what = "fabricmanager", "nvidia-fabricmanager"
    switches = host.get("nvswitches")
    if not isinstance(switches, list):
        return unknown(setting, "node", what, why if "nvswitches" not in host else "unreadable NVSwitch list")
    if not switches:
        return ok(
            setting, "node", what, "not needed (no NVSwitch on the PCI bus)", "running on NVSwitch systems"
        )
    expected = f"running ({len(switches)} NVSwitches on the PCI bus)"
    procs, problem = _processes(host, why)
    if procs is None:
        return unknown(setting, "node", what, problem, expected)
    pids = procs.get("fabricmanager")
    if isinstance(pids, list) and pids:
        return ok(setting, "node", what, f"running (pid {pids[0]})", expected)
    return Drift(
        setting,
        "node",
        result.DEGRADED,
        what,
        "not running",
        expected,
        "systemctl enable --now nvidia-fabricmanager",
        "(its version must match the driver's); without it CUDA cannot use the NVLink fabric",
    )


def _memlock(host: dict, why: str) -> Drift:
    setting, what, expected = "slurmd_memlock", "slurmd memlock", "unlimited"
    procs, problem = _processes(host, why)
    if procs is None:
        return unknown(setting, "node", what, problem, expected)
    daemons = procs.get("slurmd")
    if not isinstance(daemons, list) or not daemons:
        return unknown(setting, "node", what, "no slurmd process under /proc", expected)
    for daemon in daemons:
        pid = daemon.get("pid") if isinstance(daemon, dict) else None
        limit = parse.parse_memlock(daemon.get("limits")) if isinstance(daemon, dict) else None
        if limit is None:
            return unknown(
                setting, "node", what, f"unreadable Max locked memory in /proc/{pid}/limits", expected
            )
        if limit != (parse.UNLIMITED, parse.UNLIMITED):
            shown = [v if isinstance(v, str) else parse.size_text(v) for v in limit]
            return Drift(
                setting,
                "node",
                result.DEGRADED,
                what,
                f"{shown[0]} (hard {shown[1]})",
                expected,
                "LimitMEMLOCK=infinity in slurmd.service, then systemctl restart slurmd",
                f"(slurmd pid {pid}); jobs inherit it, and RDMA registrations beyond it fail",
            )
    return ok(setting, "node", what, "unlimited", expected)


def _governor(host: dict, why: str, wanted: str) -> Drift:
    setting, what = "cpu_governor", "CPU governor"
    if "governors" not in host:
        return unknown(setting, "node", what, why, wanted)
    found = host["governors"]
    if found is None:
        return unknown(setting, "node", what, "no cpufreq policies (no cpufreq driver?)", wanted)
    if not isinstance(found, dict) or "error" in found or not found:
        return unknown(setting, "node", what, f"unreadable cpufreq policies: {found!r}"[:160], wanted)
    seen: dict[str, int] = {}
    unreadable = 0
    for value in found.values():
        governor = parse.parse_governor(value)
        if governor is None:
            unreadable += 1
        else:
            seen[governor] = seen.get(governor, 0) + 1
    wrong = {g: n for g, n in seen.items() if g != wanted}
    if wrong:
        governor, n = max(wrong.items(), key=lambda kv: kv[1])
        part = "" if n == len(found) else f" on {n} of {len(found)} policies"
        return Drift(
            setting,
            "node",
            result.DEGRADED,
            what,
            governor + part,
            wanted,
            f"cpupower frequency-set -g {wanted}",
            "(and in the boot's tuned profile or BIOS power settings, so it lasts)",
        )
    if unreadable:
        return unknown(setting, "node", what, f"{unreadable} unreadable scaling_governor file(s)", wanted)
    return ok(setting, "node", what, f"{wanted} on {len(found)} policies", wanted)


def _thp(host: dict, why: str, allowed) -> Drift:
    setting, what, expected = "thp", "transparent huge pages", " or ".join(allowed)
    if "thp" not in host:
        return unknown(setting, "node", what, why, expected)
    mode = parse.parse_thp(host["thp"])
    if mode is None:
        return unknown(setting, "node", what, f"unreadable mode {host['thp']!r}"[:120], expected)
    if mode in allowed:
        return ok(setting, "node", what, mode, expected)
    return Drift(
        setting,
        "node",
        result.DEGRADED,
        what,
        mode,
        expected,
        f"echo {allowed[0]} > /sys/kernel/mm/transparent_hugepage/enabled",
        f"(transparent_hugepage={allowed[0]} on the kernel command line keeps it)",
    )


def _numa(host: dict, why: str, wanted: bool) -> Drift:
    setting, what, expected = "numa_balancing", "NUMA balancing", "on" if wanted else "off"
    if "numa_balancing" not in host:
        return unknown(setting, "node", what, why, expected)
    value = parse.parse_small_int(host["numa_balancing"], 3)
    if value is None:
        return unknown(
            setting, "node", what, f"unreadable kernel.numa_balancing {host['numa_balancing']!r}"[:120]
        )
    if bool(value) == wanted:
        return ok(setting, "node", what, expected, expected)
    return Drift(
        setting,
        "node",
        result.DEGRADED,
        what,
        f"on ({value})" if value else "off",
        expected,
        f"sysctl -w kernel.numa_balancing={int(wanted)}",
        "(and in /etc/sysctl.d); it migrates the job's pages between NUMA nodes under it",
    )


def _sysctls(host: dict, why: str, wanted) -> list[Drift]:
    values = host.get("sysctls")
    out = []
    for name in wanted:
        expected = str(wanted[name])
        setting = f"sysctl {name}"
        if not isinstance(values, dict) or name not in values:
            where = why if "sysctls" not in host else "not captured (capture with the partition's profile)"
            out.append(unknown(setting, name, name, where, expected))
            continue
        value = values[name]
        match = parse.sysctl_matches(value, expected)
        if value is None:
            out.append(unknown(setting, name, name, "no such sysctl under /proc/sys (module not loaded?)"))
        elif match is None:
            out.append(unknown(setting, name, name, f"unreadable value {value!r}"[:120], expected))
        elif match:
            out.append(ok(setting, name, name, " ".join(value.split()), expected))
        else:
            target = expected[2:].strip() if expected.startswith(">=") else expected
            shown = f'"{target}"' if " " in target else target
            out.append(
                Drift(
                    setting,
                    name,
                    result.DEGRADED,
                    name,
                    " ".join(value.split())[:60],
                    expected,
                    f"sysctl -w {name}={shown}",
                    "(and in /etc/sysctl.d, so a reboot keeps it)",
                )
            )
    return out


def _mtu(snapshot: dict, profile: Profile) -> list[Drift]:
    floor = profile.drift.roce_mtu_min or 0
    net = snapshot.get("net")
    devices = net.get("devices") if isinstance(net, dict) else None
    out = []
    for hca in profile.fabric.hcas:
        name = hca.netdev
        if not name:
            continue
        dev = devices.get(name) if isinstance(devices, dict) else None
        if not isinstance(dev, dict) or not dev.get("present"):
            continue  # missing or unreadable: the ib family's finding (fail or unknown)
        what, expected = f"{name} MTU", f"at least {floor}"
        mtu = parse_int(dev.get("mtu"))
        if mtu is None or not 0 < mtu < 1 << 20:
            out.append(unknown("roce_mtu", name, what, f"unreadable mtu {dev.get('mtu')!r}"[:120], expected))
        elif mtu < floor:
            out.append(
                Drift(
                    "roce_mtu",
                    name,
                    result.DEGRADED,
                    what,
                    str(mtu),
                    expected,
                    f"ip link set {name} mtu {floor}",
                    "(and in the interface's configuration); RoCE's 4096-byte MTU needs it",
                )
            )
        else:
            out.append(ok("roce_mtu", name, what, str(mtu), expected))
    return out


def _gpu_settings(snapshot: dict, want) -> list[Drift]:
    """Only a profile that declares GPU power or clocks loads their checks."""
    if not (want.gpu_power_limit_w or want.gpu_sm_clock_mhz or want.gpu_mem_clock_mhz):
        return []
    from .driftgpu import gpu_settings

    return gpu_settings(snapshot, want)
