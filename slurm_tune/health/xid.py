"""NVIDIA Xid events: the one table of what each Xid means and what stune does about it, and the Xid check.

The kernel driver logs `NVRM: Xid (PCI:0000:47:00): 79, ...` when a GPU or its driver hits an error (the
forms: hw/kernellog.py). Many Xids are the application's fault (a bad pointer is Xid 31) and say nothing
about the node; some mean the GPU needs a reset, a reboot or a technician. Each code has a rule (NVIDIA's
Xid catalog, its resolution buckets, and the practice of DCGM, gpud and NVSentinel):

- action: `count` (listed and counted, never held against the node), `degrade` (the node is marked
  degraded, kept out of multi-node jobs, for `health.xid.hold`), `drain` (the node fails: held until a
  reboot, a GPU reset or `stune-health clear --xid`);
- burst: that many events of the code within `health.xid.burst_window` escalate one step (0: never);
- remedy: the first step of the remediation ladder that can fix it (`reset` the GPU, `reboot` the node, or
  `repair`: no automatic fix), when the partition opts in (health/ladder.py);
- app: caused by applications (13, 31, 43, 45, ...): never drained on, whatever a burst or the profile says.

A profile overrides any rule per code (`health.xid.codes`); `stune-health xids [-p P]` prints the table in
force. Codes in neither table are counted as "not in stune's Xid table", so a new driver's codes show up
without draining anything. The events are judged by health/incidents.py (bursts, recurrence, holds); this
module also holds what the prolog needs of them: the Xids held against the node (held_results).
"""

from __future__ import annotations

from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:  # profiletypes, not profilestore: profilehealth.py imports this module to validate
    from ..profiletypes import Sections as Profile

COUNT, DEGRADE, DRAIN = "count", "degrade", "drain"
LEVELS = (COUNT, DEGRADE, DRAIN)  # mildest first
RESET, REBOOT, REPAIR = "reset", "reboot", "repair"
REMEDIES = (RESET, REBOOT, REPAIR)  # gentlest first


class Rule:
    """What stune does about one Xid code (see the module docstring)."""

    __slots__ = ("meaning", "action", "remedy", "burst", "app", "source")

    def __init__(self, meaning: str, action: str, remedy: str = REPAIR, burst: int = 0, app: bool = False):
        self.meaning, self.action, self.remedy, self.burst, self.app = meaning, action, remedy, burst, app
        self.source = "stune"  # or "profile": some field came from the profile

    def replaced(self, action=None, remedy=None, burst=None) -> Rule:
        rule = Rule(
            self.meaning,
            action if action is not None else self.action,
            remedy if remedy is not None else self.remedy,
            burst if burst is not None else self.burst,
            self.app,
        )
        rule.source = "profile" if (action, remedy, burst) != (None, None, None) else self.source
        return rule


def _app(meaning: str, burst: int = 0) -> Rule:
    return Rule(meaning, COUNT, REPAIR, burst, app=True)


NVLINK5 = range(144, 151)  # Blackwell NVLink errors: the driver marks each line Fatal or Nonfatal
XIDS: dict[int, Rule] = {
    8: _app("GPU stopped processing: a channel timed out (usually the application)"),
    13: _app("graphics engine exception (usually an application error)"),
    31: _app("GPU memory page fault (usually an application error)"),
    32: Rule(
        "invalid or corrupted push buffer stream (DMA from the host: often PCIe quality)", COUNT, burst=10
    ),
    38: Rule("driver firmware error", DRAIN, RESET),
    43: _app("GPU stopped processing (usually an application error)"),
    45: _app("preemptive cleanup after an earlier error (usually the application was killed)"),
    48: Rule("double-bit ECC error", DRAIN, RESET),
    61: Rule("internal micro-controller breakpoint/warning", DRAIN, RESET),
    62: Rule("internal micro-controller halt", DRAIN, RESET),
    63: Rule("ECC page retirement or row remap recorded: pending until the GPU is reset", DEGRADE, RESET),
    64: Rule("ECC page retirement or row remap recording failed", DRAIN, REBOOT),
    68: _app("video decoder (NVDEC) exception"),
    69: _app("graphics engine class error"),
    74: Rule("NVLink error", DRAIN, RESET),
    79: Rule("GPU has fallen off the bus", DRAIN, REBOOT),
    92: Rule("high single-bit ECC error rate", DEGRADE, RESET, burst=3),
    94: Rule("contained ECC error: the application was stopped, a row remap is pending", DEGRADE, RESET, 3),
    95: Rule("uncontained ECC error", DRAIN, RESET),
    109: Rule("context switch timeout", COUNT, burst=5),
    119: Rule("GSP RPC timeout", DRAIN, RESET),
    120: Rule("GSP error", DRAIN, RESET),
    121: Rule("C2C link error", DRAIN, RESET),
    137: _app("NVLink FLA privilege error (usually an application error)"),
    140: Rule("unrecovered ECC error", DRAIN, RESET),
    143: Rule("GPU initialization failure", DRAIN, REPAIR),
    **{
        code: Rule(f"NVLink {name} error (a line the driver marks Fatal drains)", DEGRADE, RESET)
        for code, name in zip(NVLINK5, ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE"))
    },
    151: Rule("key rotation error", DRAIN, REBOOT),
    154: Rule("GPU recovery action changed (the action the driver names decides)", DRAIN, RESET),
    155: Rule("NVLink software-defined error", DRAIN, REBOOT),
    156: Rule("resource retirement event", DEGRADE, REBOOT),
    158: Rule("GPU fatal timeout", DRAIN, REBOOT),
    159: Rule("CHI non-data error", DEGRADE, RESET),
    167: Rule("PCIe fatal timeout", DRAIN, REBOOT),
}
APP_CODES = frozenset(code for code, rule in XIDS.items() if rule.app)
UNKNOWN_RULE = Rule("not in stune's Xid table", COUNT)
# Xid 154 names the recovery the driver wants (NVML's nvmlDeviceGpuRecoveryAction_t): `... changed from 0x0
# (None) to 0x1 (GPU Reset Required)`. None means it recovered.
RECOVERY_ACTIONS = {
    0: (COUNT, None),
    1: (DRAIN, RESET),
    2: (DRAIN, REBOOT),
    3: (DEGRADE, RESET),
    4: (DRAIN, RESET),
}


def policy(profile: Profile | None) -> dict[int, Rule]:
    """The rules in force: stune's table with the profile's `health.xid.codes` over it, field by field."""
    table = dict(XIDS)
    codes = _profile_codes(profile)
    for key in codes:
        entry = codes[key]
        code = int(key)
        base = table.get(code) or Rule("set by the profile", COUNT)
        table[code] = base.replaced(entry.get("action"), entry.get("remedy"), entry.get("burst"))
    return table


def _profile_codes(profile):
    health = getattr(profile, "health", None) if profile is not None else None
    xid = health.get("xid") if health is not None else None
    codes = xid.get("codes") if xid is not None else None
    return codes if codes is not None else {}


def rule_for(table: dict[int, Rule], code: int) -> Rule:
    return table.get(code) or UNKNOWN_RULE


def refine(code: int, rule: Rule, text: str) -> tuple[str, str]:
    """(action, remedy) for one event: the rule's, unless the line itself says more (an NVLink error the
    driver marks Fatal; the recovery Xid 154 names). A profile's own rule for the code is taken as it is."""
    action, remedy = rule.action, rule.remedy
    if rule.source == "profile" or not isinstance(text, str):
        return action, remedy
    if code in NVLINK5 and "Fatal" in text.split():
        return DRAIN, remedy
    if code == 154:
        at = text.find(" to 0x")
        digits = text[at + 6 : at + 14].split(" ", 1)[0] if at >= 0 else ""
        if digits and all(c in "0123456789abcdefABCDEF" for c in digits):
            wanted = RECOVERY_ACTIONS.get(int(digits, 16))
            if wanted is not None:
                return wanted[0], wanted[1] or remedy
    return action, remedy


def escalate(level: str, app: bool) -> str:
    """One step up; an application's Xid never past degrade."""
    up = LEVELS[min(LEVELS.index(level) + 1, len(LEVELS) - 1)]
    return DEGRADE if app and up == DRAIN else up


# ---- the check family --------------------------------------------------------------------------------------


def _events(snapshot) -> list | None:
    kernel = snapshot.get("kernel") if isinstance(snapshot, dict) else None
    if not isinstance(kernel, dict):
        return None
    if kernel.get("answered") is not True:
        return None
    events = kernel.get("events")
    xids = events.get("xid") if isinstance(events, dict) else None
    return xids if isinstance(xids, list) else None


def valid_event(ev) -> bool:
    return (
        isinstance(ev, dict)
        and type(ev.get("seq")) is int
        and type(ev.get("xid")) is int
        and 0 <= ev["xid"] < 1 << 20
        and isinstance(ev.get("pci", ""), str)
    )


def boot_id(snapshot) -> str | None:
    kernel = snapshot.get("kernel") if isinstance(snapshot, dict) else None
    events = kernel.get("events") if isinstance(kernel, dict) else None
    value = events.get("boot_id") if isinstance(events, dict) else None
    return value if isinstance(value, str) and value else None


def new_events(snapshot, last_seq, last_boot) -> tuple[list, int | None, bool]:
    """(events after last_seq, the highest seq seen, whether the node rebooted since).

    A reboot resets the GPUs and restarts the kernel log's sequence numbers: it is a new boot id, or (when
    the boot id cannot be read) every sequence number in the log being below the last one seen."""
    events = [ev for ev in _events(snapshot) or [] if valid_event(ev)]
    boot = boot_id(snapshot)
    if boot is not None and isinstance(last_boot, str) and boot != last_boot:
        return events, max((ev["seq"] for ev in events), default=None), True
    if not events:
        return [], last_seq, False
    top = max(ev["seq"] for ev in events)
    if type(last_seq) is not int:
        return events, top, False
    if top < last_seq:
        return events, top, True
    return [ev for ev in events if ev["seq"] > last_seq], max(top, last_seq), False


def gpu_name(snapshot, pci: str) -> str:
    """`gpu3 0000:47:00` for the Xid's `0000:47:00` when NVML listed that GPU, else the PCI address."""
    gpus = snapshot.get("gpus") if isinstance(snapshot, dict) else None
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    for dev in devices if isinstance(devices, list) else []:
        if not isinstance(dev, dict) or not isinstance(dev.get("pci_bus_id"), str) or not pci:
            continue
        bus = dev["pci_bus_id"].lower()
        if bus.endswith(pci.lower()) or bus.rsplit(".", 1)[0].endswith(pci.lower()):
            return f"gpu{dev.get('index')} {pci}"
    return pci or "gpu"


def held_results(snapshot, held: list, repair) -> list:
    """The fail results for the Xids held against the node (the prolog's only Xid work: no policy, no log)."""
    if isinstance(repair, dict) and isinstance(repair.get("reason"), str):
        return [result.fail("gpu.xid", "node", repair.get("message") or repair["reason"], repair["reason"])]
    out, seen = [], set()
    for ev in held:
        if not valid_event(ev) or (ev["xid"], ev.get("pci", "")) in seen:
            continue
        seen.add((ev["xid"], ev.get("pci", "")))
        where = gpu_name(snapshot, ev.get("pci", ""))
        out.append(
            result.fail(
                "gpu.xid",
                where,
                f"Xid {ev['xid']} ({rule_for(XIDS, ev['xid']).meaning}) at kernel log seq {ev['seq']}; held "
                "until reboot, a GPU reset or `stune-health clear --xid`",
                f"{where.split()[0]} Xid {ev['xid']}",
            )
        )
    return out


def held_check(snapshot, previous: dict) -> tuple[list, dict]:
    """The Xid check without a kernel log (the prolog): what is held against the node, nothing new."""
    sticky = [ev for ev in previous.get("xid_sticky") or [] if valid_event(ev)]
    ladder = previous.get("ladder")
    return held_results(snapshot, sticky, ladder.get("repair") if isinstance(ladder, dict) else None), {}
