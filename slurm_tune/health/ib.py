"""IB and RoCE fabric checks: each HCA port the partition's profile requires, and the socket interface.

Per port: `state` ACTIVE, `phys_state` LinkUp and `link_layer` matching the fabric, else fail; a missing HCA
or port fails, one that is there but cannot be read (a symlink loop, a file where a directory belongs) is
unknown; `rate` below the profile's rate is degraded; the error counters are judged as increases since
the last periodic run against the profile's thresholds (first sight: baseline only; a counter that went down
was reset by a driver reload or reboot: re-baseline, no alarm). RoCE ports need their netdev up.
"""

from __future__ import annotations

from ..hw.sysfs import (
    IB_ERROR_COUNTERS,
    netdev_is_up,
    parse_counter,
    parse_int,
    parse_port_state,
    parse_rate_gbps,
)
from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

LINK_LAYER = {"ib": "InfiniBand", "roce": "Ethernet"}
# What Linux writes (drivers/infiniband/core/sysfs.c): "<number>: <name>". Anything else is unreadable, so a
# garbled file can never pass for a real DOWN.
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# RFC 2863 operational states, as /sys/class/net/*/operstate spells them.
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
# Width of each error counter in the IB PortCounters attribute that sysfs shows: they stop at their maximum
# instead of wrapping, after which increases cannot be measured until the counters are reset.
COUNTER_MAX = {
    "symbol_error": 0xFFFF,
    "link_error_recovery": 0xFF,
    "link_downed": 0xFF,
    "port_rcv_errors": 0xFFFF,
}


def _dict(value) -> dict | None:
    return value if isinstance(value, dict) else None


def section(snapshot, name: str) -> tuple[dict | None, str | None]:
    """(devices, None) for an answered snapshot section; (what was read before the probe stalled, why) for
    one that did not answer, so a device missing from it is "did not answer", not "missing"; (None, why)
    when there is nothing to judge."""
    sec = _dict(snapshot.get(name)) if isinstance(snapshot, dict) else None
    if sec is None:
        return None, f"the snapshot has no readable {name!r} section"
    devices = _dict(sec.get("devices"))
    if sec.get("answered") is not True:
        err = sec.get("error")
        why = err if isinstance(err, str) and err else f"the {name!r} probe did not answer"
        return (devices if sec.get("answered") is False else None), why
    if devices is None:
        return None, f"the {name!r} section has no readable device list"
    return devices, None


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    """Results for every required port and the socket interface; updates: {'baselines': {...}}."""
    fabric = profile.fabric
    results: list = []
    baselines_in = _dict(previous.get("baselines")) or {}
    baselines: dict = {}
    if fabric.type in LINK_LAYER:
        devices, why = section(snapshot, "ib")
        nets, nets_why = section(snapshot, "net")
        for hca in fabric.hcas:
            subject = f"{hca.device}/{hca.port}"
            if devices is None or (why is not None and hca.device not in devices):
                results.append(result.unknown("ib.link", subject, f"cannot judge: {why}"))
                continue
            try:  # one port's bad data (or a bug it triggers) is that port's finding, never its neighbours'
                port_results, counters = _check_port(
                    devices, hca, fabric, profile.health.counters, _dict(baselines_in.get(subject)) or {}
                )
                if fabric.type == "roce" and hca.netdev:
                    port_results.append(_check_roce_netdev(devices, nets, nets_why, hca))
            except Exception as exc:
                port_results, counters = (
                    [
                        result.unknown(
                            "ib.internal",
                            subject,
                            f"internal error judging {subject}: {type(exc).__name__}: {exc}",
                        )
                    ],
                    None,
                )
                if type(baselines_in.get(subject)) is dict:
                    counters = baselines_in[subject]
            results += port_results
            if counters is not None:
                baselines[subject] = counters
    if fabric.socket_ifname:
        results.append(_check_socket_ifname(snapshot, fabric.socket_ifname))
    return results, {"baselines": baselines}


def _check_port(devices: dict, hca, fabric, thresholds, baseline: dict) -> tuple[list, dict | None]:
    subject = f"{hca.device}/{hca.port}"
    dev = _dict(devices.get(hca.device))
    if hca.device not in devices:
        return [
            result.fail(
                "ib.link",
                subject,
                f"HCA {hca.device} is missing (not in /sys/class/infiniband); "
                f"the {fabric.type} profile requires it",
                f"{hca.device} missing",
            )
        ], None
    if dev is None:
        return [result.unknown("ib.link", subject, f"unreadable entry for {hca.device}")], None
    if isinstance(dev.get("unreadable"), str):
        return [
            result.unknown(
                "ib.link", subject, f"HCA {hca.device} is there but cannot be read: {dev['unreadable']}"
            )
        ], None
    ports = _dict(dev.get("ports"))
    port = _dict(ports.get(str(hca.port))) if ports is not None else None
    if ports is None or (port is None and str(hca.port) in ports):
        return [result.unknown("ib.link", subject, f"unreadable port list for {hca.device}")], None
    if port is None and isinstance(dev.get("ports_error"), str):
        return [
            result.unknown("ib.link", subject, f"cannot list the ports of {hca.device}: {dev['ports_error']}")
        ], None
    if port is not None and isinstance(port.get("unreadable"), str):
        return [
            result.unknown(
                "ib.link",
                subject,
                f"port {hca.port} of {hca.device} is there but cannot be read: {port['unreadable']}",
            )
        ], None
    if port is None or port.get("present") is False:
        return [
            result.fail(
                "ib.link",
                subject,
                f"port {hca.port} of {hca.device} is missing; the profile requires it",
                f"{subject} missing",
            )
        ], None
    counters, new_baseline = _check_counters(port, subject, thresholds, baseline)
    return [
        _check_link(port, subject, fabric),
        _check_rate(port, subject, fabric.rate_gbps),
        *counters,
    ], new_baseline


def _check_link(port: dict, subject: str, fabric) -> result.Result:
    state, phys, layer = port.get("state"), port.get("phys_state"), port.get("link_layer")
    parsed_state, parsed_phys = _known(state, PORT_STATES), _known(phys, PHYS_STATES)
    expected_layer = LINK_LAYER[fabric.type]
    if parsed_state is not None and parsed_state[1] != "ACTIVE":
        return result.fail(
            "ib.link",
            subject,
            f"state {parsed_state[1]} ({state!s}), phys_state {phys!s}; expected ACTIVE and LinkUp",
            f"{subject} state {parsed_state[1]}",
        )
    if parsed_phys is not None and parsed_phys[1] != "LinkUp":
        return result.fail(
            "ib.link",
            subject,
            f"phys_state {parsed_phys[1]} ({phys!s}); expected LinkUp",
            f"{subject} phys_state {parsed_phys[1]}",
        )
    if layer in LINK_LAYER.values() and layer != expected_layer:
        return result.fail(
            "ib.link",
            subject,
            f"link_layer {layer}; expected {expected_layer} for a {fabric.type} fabric",
            f"{subject} link_layer {layer}",
        )
    unreadable = [
        name
        for name, ok in (
            ("state", parsed_state),
            ("phys_state", parsed_phys),
            ("link_layer", layer in LINK_LAYER.values()),
        )
        if not ok
    ]
    if unreadable:
        shown = ", ".join(f"{n} {port.get(n)!r}" for n in unreadable)
        return result.unknown("ib.link", subject, f"unreadable {shown}")
    return result.ok("ib.link", subject, f"ACTIVE, LinkUp, {layer}")


def _known(text, table: dict) -> tuple[int, str] | None:
    """(number, name) when `text` is one of the kernel's own state strings, else None."""
    parsed = parse_port_state(text)
    return parsed if parsed is not None and table.get(parsed[0]) == parsed[1] else None


def _check_rate(port: dict, subject: str, expected) -> result.Result:
    text = port.get("rate")
    rate = parse_rate_gbps(text)
    if expected is None:
        return result.ok("ib.rate", subject, f"{text} (no rate required)")
    if rate is None:
        return result.unknown(
            "ib.rate", subject, f"unreadable rate {text!r}; expected at least {expected} Gb/s"
        )
    if rate < expected:
        return result.degraded(
            "ib.rate",
            subject,
            f"rate {rate:g} Gb/s ({text}); expected at least {expected} Gb/s",
            f"{subject} rate {rate:g} Gb/s < {expected}",
        )
    return result.ok("ib.rate", subject, f"{rate:g} Gb/s; expected at least {expected}")


def _check_counters(port: dict, subject: str, thresholds, baseline: dict) -> tuple[list, dict]:
    """One result for the port's error counters, and the port's new baseline."""
    raw = _dict(port.get("counters"))
    if raw is None:
        return [result.unknown("ib.counters", subject, "no readable counters directory")], dict(baseline)
    seen, worst, unreadable, notes, new_baseline, first = [], result.OK, [], [], {}, []
    reason = ""
    for name in IB_ERROR_COUNTERS:
        limits = thresholds.get(name) if name in thresholds else None
        value = parse_counter(raw.get(name))
        if value is None:
            unreadable.append(f"{name} {raw.get(name)!r}")
            if type(baseline.get(name)) is int:
                new_baseline[name] = baseline[name]
            continue
        new_baseline[name] = value
        before = baseline.get(name)
        if type(before) is not int:
            first.append(f"{name} {value}")
            continue
        if value < before:
            notes.append(f"{name} went from {before} to {value} (counters reset): re-baselined")
            continue
        if value >= COUNTER_MAX[name] and before >= COUNTER_MAX[name]:
            unreadable.append(f"{name} saturated at {value} (reset the counters, e.g. perfquery -R)")
            continue
        delta = value - before
        if limits is None:
            continue
        fail_at, degraded_at = limits.fail, limits.degraded
        if fail_at is not None and delta > fail_at:
            status, limit = result.FAIL, f"fail above {fail_at}"
        elif delta > degraded_at:
            status, limit = result.DEGRADED, f"degraded above {degraded_at}"
        else:
            if delta:
                notes.append(f"{name} +{delta}")
            continue
        seen.append(f"{name} +{delta} since the last run ({limit})")
        if result.RANK[status] > result.RANK[worst]:
            worst, reason = status, f"{subject} {name} +{delta}"
    if first:  # a first sight: totals are history, the next run judges the increase
        notes.insert(0, f"first reading, baseline taken ({', '.join(first)})")
    if worst != result.OK:
        message = "; ".join(seen + notes)
        counters = result.Result("ib.counters", subject, worst, message, reason)
    elif unreadable:
        counters = result.unknown("ib.counters", subject, "unreadable " + "; ".join(unreadable))
    else:
        counters = result.ok(
            "ib.counters", subject, "; ".join(notes) if notes else "no error counter increases"
        )
    return [counters], new_baseline


def _check_roce_netdev(devices: dict, nets: dict | None, nets_why: str | None, hca) -> result.Result:
    subject = f"{hca.device}/{hca.port}"
    if nets is None or (nets_why is not None and hca.netdev not in nets):
        return result.unknown("ib.netdev", subject, f"cannot see {hca.netdev}: {nets_why}")
    info = _dict(nets.get(hca.netdev))
    if info is not None and isinstance(info.get("unreadable"), str):
        return result.unknown(
            "ib.netdev", subject, f"{hca.netdev} is there but cannot be read: {info['unreadable']}"
        )
    if info is None or info.get("present") is False:
        if hca.netdev in nets and info is None:
            return result.unknown("ib.netdev", subject, f"unreadable entry for {hca.netdev}")
        return result.fail(
            "ib.netdev",
            subject,
            f"netdev {hca.netdev} is missing; the profile binds it to {subject}",
            f"{hca.netdev} missing",
        )
    if info.get("present") is not True:
        return result.unknown("ib.netdev", subject, f"unreadable entry for {hca.netdev}")
    dev = _dict(devices.get(hca.device)) or {}
    bound = dev.get("netdevs")
    if (
        isinstance(bound, list)
        and bound
        and all(isinstance(b, str) for b in bound)
        and hca.netdev not in bound
    ):
        return result.fail(
            "ib.netdev",
            subject,
            f"{hca.device} is bound to {', '.join(bound)}; the profile expects {hca.netdev}",
            f"{hca.device} netdev {','.join(bound)}",
        )
    state = info.get("operstate")
    if state not in OPERSTATES or (state == "unknown" and parse_int(info.get("flags")) is None):
        return result.unknown(
            "ib.netdev",
            subject,
            f"unreadable operstate {state!r} (flags {info.get('flags')!r}) of {hca.netdev}",
        )
    if not netdev_is_up(info):
        return result.fail(
            "ib.netdev", subject, f"{hca.netdev} operstate {state}; expected up", f"{hca.netdev} {state}"
        )
    return result.ok("ib.netdev", subject, f"{hca.netdev} up")


def _check_socket_ifname(snapshot, name: str) -> result.Result:
    nets, why = section(snapshot, "net")
    if nets is None or (why is not None and name not in nets):
        return result.unknown("net.socket", name, f"cannot judge: {why}")
    info = _dict(nets.get(name))
    if info is not None and isinstance(info.get("unreadable"), str):
        return result.unknown("net.socket", name, f"there but cannot be read: {info['unreadable']}")
    if info is None or info.get("present") is False:
        if name in nets and info is None:
            return result.unknown("net.socket", name, "unreadable entry")
        return result.fail(
            "net.socket", name, "the socket interface (NCCL bootstrap) is missing", f"{name} missing"
        )
    if info.get("present") is not True:
        return result.unknown("net.socket", name, "unreadable entry")
    state = info.get("operstate")
    if state not in OPERSTATES or (state == "unknown" and parse_int(info.get("flags")) is None):
        return result.unknown(
            "net.socket", name, f"unreadable operstate {state!r} (flags {info.get('flags')!r})"
        )
    if not netdev_is_up(info):
        return result.fail("net.socket", name, f"operstate {state}; expected up", f"{name} {state}")
    return result.ok("net.socket", name, "up")
