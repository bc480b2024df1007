"""GPU checks: NVML's view of each GPU (from the snapshot's `gpus` section) and the PCI bus's view.

NVML not answering fails the node (a GPU that fell off the bus makes NVML hang). Per GPU: uncorrected
volatile ECC errors and pending retired pages fail; remapped rows pending are degraded and a remapping failure
fails; PCIe width below the maximum is degraded, always, and the link generation only under load (GPUs
train their link down at idle to save power, so an idle gen-1 link says nothing); temperature over the
profile's limit or thermal / power-brake clock slowdown is degraded; NVLink links down are degraded or fail
per profile; persistence mode off is degraded. The bus view counts GPUs even when NVML cannot. Only on an
NVIDIA partition (`accelerator: nvidia`): AMD and Ascend devices are the accel family's (health/accel.py).
"""

from __future__ import annotations

from ..hw.sysfs import NVIDIA_VENDOR, parse_int, pci_address
from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

# NVML clock event reasons that mean the hardware is protecting itself (values from nvml.h).
SLOWDOWN_BITS = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def _int(value) -> int | None:
    return value if type(value) is int else None


def _num(value) -> float | None:
    return value if type(value) in (int, float) and value == value else None


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    spec = profile.gpu
    if not spec.count or not isinstance(snapshot, dict) or profile.accelerator != "nvidia":
        return [], {}  # (an amd or ascend partition's devices are the accel family's: health/accel.py)
    results: list = []
    nvml_devices = None
    if "gpus" in snapshot:
        results_nvml, nvml_devices = _check_nvml(snapshot["gpus"], spec, profile.health, snapshot)
        results += results_nvml
    if "pci_gpus" in snapshot:
        results += _check_pci(snapshot["pci_gpus"], spec, judge_width=nvml_devices is None)
    updates = {}
    if nvml_devices:
        buses = [pci_address(d.get("pci_bus_id")) for d in nvml_devices if isinstance(d, dict)]
        updates["gpu_pci"] = [b for b in buses if b]
    return results, updates


def _nvml_problem(gpus: dict) -> tuple[str, str]:
    """(status, message) when NVML did not answer: fail for the node's GPUs or driver, unknown for stune's own
    installation (pynvml missing) or a snapshot taken without NVML."""
    error = gpus.get("error")
    error = error if isinstance(error, str) else "no answer"
    if "not installed" in error or "not captured" in error:
        return result.UNKNOWN, error
    stalled = _int(gpus.get("stalled_at"))
    if stalled is not None:
        error += f" (stalled reading gpu{stalled})"
    return result.FAIL, error


def _check_nvml(gpus, spec, health, snapshot) -> tuple[list, list | None]:
    if not isinstance(gpus, dict) or type(gpus.get("answered")) is not bool:
        return [result.unknown("gpu.nvml", "node", "unreadable 'gpus' section")], None
    if not gpus["answered"]:
        status, message = _nvml_problem(gpus)
        if status == result.FAIL:
            return [
                result.fail(
                    "gpu.nvml",
                    "node",
                    f"NVML did not answer: {message}; expected {spec.count} GPUs to answer",
                    "NVML not answering",
                )
            ], None
        return [result.unknown("gpu.nvml", "node", f"GPUs not judged: {message}")], None
    devices = gpus.get("devices")
    if not isinstance(devices, list):
        return [result.unknown("gpu.nvml", "node", "unreadable device list")], None
    results = [_check_count(devices, spec, snapshot)]
    for pos, dev in enumerate(devices):
        if not isinstance(dev, dict):
            results.append(result.unknown("gpu.nvml", f"gpu{pos}", "unreadable device entry"))
            continue
        try:  # one GPU's bad data (or a bug it triggers) is that GPU's finding, never its neighbours'
            results += _check_device(dev, pos, spec, health)
        except Exception as exc:
            results.append(
                result.unknown(
                    "gpu.internal",
                    f"gpu{pos}",
                    f"internal error judging gpu{pos}: {type(exc).__name__}: {exc}",
                )
            )
    return results, devices


def _check_count(devices: list, spec, snapshot) -> result.Result:
    n = len(devices)
    if n < spec.count:
        missing = _missing_from_nvml(devices, snapshot)
        extra = f"; on the PCI bus but not in NVML: {', '.join(missing)}" if missing else ""
        return result.fail(
            "gpu.count",
            "node",
            f"{n} GPUs answer NVML; expected {spec.count}{extra}",
            f"{n}/{spec.count} GPUs",
        )
    if n > spec.count:
        return result.degraded(
            "gpu.count",
            "node",
            f"{n} GPUs; the profile expects {spec.count}",
            f"{n} GPUs, expected {spec.count}",
        )
    return result.ok("gpu.count", "node", f"{n} GPUs; expected {spec.count}")


def _missing_from_nvml(devices: list, snapshot) -> list:
    pci = snapshot.get("pci_gpus") if isinstance(snapshot, dict) else None
    bus = pci.get("devices") if isinstance(pci, dict) else None
    if not isinstance(bus, dict):
        return []
    seen = {pci_address(d.get("pci_bus_id")) for d in devices if isinstance(d, dict)}
    return sorted(a for a in bus if isinstance(a, str) and a not in seen)


def _subject(dev: dict, pos: int) -> str:
    index = _int(dev.get("index"))
    address = pci_address(dev.get("pci_bus_id"))
    return f"gpu{pos if index is None else index}" + (f" {address}" if address else "")


def _check_device(dev: dict, pos: int, spec, health) -> list:
    subject = _subject(dev, pos)
    short = subject.split()[0]
    errors = dev.get("errors")
    errors = errors if isinstance(errors, dict) else {}
    if any(isinstance(e, str) and "GPU is lost" in e for e in errors.values()):
        return [
            result.fail(
                "gpu.nvml", subject, "NVML says the GPU is lost; expected it to answer", f"{short} lost"
            )
        ]
    out = [
        _check_model(dev, subject, spec),
        _check_ecc(dev, subject, short),
        _check_remap(dev, subject, short),
        _check_pcie(dev, subject, short),
        _check_thermal(dev, subject, short, health.max_gpu_temp_c),
        _check_nvlink(dev, subject, short, spec.nvlink_down),
    ]
    if spec.persistence_mode:
        out.append(_check_persistence(dev, subject, short))
    return out


def _check_model(dev, subject, spec) -> result.Result:
    name = dev.get("name")
    if not spec.model:
        return result.ok("gpu.model", subject, f"{name} (no model required)")
    if not isinstance(name, str) or not name:
        return result.unknown("gpu.model", subject, f"unreadable name {name!r}; expected {spec.model}")
    if spec.model.lower() not in name.lower():
        return result.fail(
            "gpu.model", subject, f"{name}; expected {spec.model}", f"{subject.split()[0]} is {name}"
        )
    return result.ok("gpu.model", subject, f"{name}; expected {spec.model}")


def _check_ecc(dev, subject, short) -> result.Result:
    raw_ecc, raw_pending = dev.get("ecc_uncorrected_volatile"), dev.get("retired_pages_pending")
    ecc, pending = _int(raw_ecc), raw_pending if type(raw_pending) is bool else None
    if ecc is not None and ecc > 0:
        return result.fail(
            "gpu.ecc",
            subject,
            f"{ecc} uncorrected volatile ECC errors; expected 0",
            f"{short} {ecc} uncorrected ECC",
        )
    if pending:
        return result.fail(
            "gpu.ecc",
            subject,
            "retired pages pending (a reset is needed to retire them); expected none",
            f"{short} retired pages pending",
        )
    unreadable = [
        f"{n} {v!r}"
        for n, v, parsed in (
            ("ecc_uncorrected_volatile", raw_ecc, ecc),
            ("retired_pages_pending", raw_pending, pending),
        )
        if v is not None and parsed is None
    ]
    if unreadable:
        return result.unknown("gpu.ecc", subject, "unreadable " + ", ".join(unreadable))
    if ecc is None and pending is None:
        return result.ok("gpu.ecc", subject, "ECC counts not supported by this GPU")
    return result.ok("gpu.ecc", subject, "no uncorrected ECC errors, no retired pages pending")


def _check_remap(dev, subject, short) -> result.Result:
    rows = dev.get("remapped_rows")
    if rows is None:
        return result.ok("gpu.remap", subject, "no row remapping on this GPU")
    if (
        not isinstance(rows, dict)
        or type(rows.get("pending")) is not bool
        or type(rows.get("failure")) is not bool
    ):
        return result.unknown("gpu.remap", subject, f"unreadable remapped rows {rows!r}")
    if rows["failure"]:
        return result.fail(
            "gpu.remap", subject, "row remapping failed; expected no failure", f"{short} row remap failed"
        )
    if rows["pending"]:
        return result.degraded(
            "gpu.remap",
            subject,
            f"row remap pending ({rows.get('uncorrectable')} uncorrectable "
            "rows): a GPU reset applies it; expected none pending",
            f"{short} row remap pending",
        )
    return result.ok(
        "gpu.remap",
        subject,
        f"{rows.get('correctable')} correctable, {rows.get('uncorrectable')} "
        "uncorrectable rows remapped; none pending",
    )


def _check_pcie(dev, subject, short) -> result.Result:
    link = dev.get("pcie") if isinstance(dev.get("pcie"), dict) else {}
    gen, max_gen, width, max_width = (_int(link.get(k)) for k in ("gen", "max_gen", "width", "max_width"))
    if width is None or max_width is None:
        return result.unknown(
            "gpu.pcie", subject, f"unreadable link width {link.get('width')!r} of {link.get('max_width')!r}"
        )
    if width < max_width:
        return result.degraded(
            "gpu.pcie",
            subject,
            f"PCIe link x{width}; expected x{max_width} (width is judged at any load)",
            f"{short} PCIe x{width}",
        )
    pstate, util = _int(dev.get("performance_state")), dev.get("utilization")
    busy = isinstance(util, dict) and (_num(util.get("gpu")) or 0) > 0
    if gen is None or max_gen is None:
        return result.ok("gpu.pcie", subject, f"x{width}; link generation unreadable")
    if not (pstate == 0 and busy):
        return result.ok(
            "gpu.pcie",
            subject,
            f"x{width}; gen {gen} of {max_gen} not judged: the GPU is idle "
            f"(P{pstate}, links train down at idle), judged under load in P0",
        )
    if gen < max_gen:
        return result.degraded(
            "gpu.pcie",
            subject,
            f"PCIe gen {gen} under load in P0; expected gen {max_gen}",
            f"{short} PCIe gen{gen}",
        )
    return result.ok(
        "gpu.pcie", subject, f"gen {gen} x{width} under load; expected gen {max_gen} x{max_width}"
    )


def _check_thermal(dev, subject, short, limit) -> result.Result:
    temp, reasons = _num(dev.get("temperature_c")), _int(dev.get("clock_event_reasons"))
    slow = [name for bit, name in SLOWDOWN_BITS.items() if reasons is not None and reasons & bit]
    if temp is not None and temp > limit:
        return result.degraded(
            "gpu.thermal",
            subject,
            f"{temp:g} C; expected at most {limit} C"
            + (f"; clocks slowed: {', '.join(slow)}" if slow else ""),
            f"{short} {temp:g}C",
        )
    if slow:
        return result.degraded(
            "gpu.thermal",
            subject,
            f"clocks slowed by {', '.join(slow)}; expected no thermal or power-brake slowdown",
            f"{short} {slow[0]}",
        )
    if temp is None or (reasons is None and dev.get("clock_event_reasons") is not None):
        return result.unknown(
            "gpu.thermal",
            subject,
            f"unreadable temperature {dev.get('temperature_c')!r} or clock "
            f"event reasons {dev.get('clock_event_reasons')!r}",
        )
    return result.ok("gpu.thermal", subject, f"{temp:g} C (limit {limit} C), no slowdown")


def _check_nvlink(dev, subject, short, severity) -> result.Result:
    links = dev.get("nvlinks")
    if not isinstance(links, list) or not all(
        isinstance(link, dict) and type(link.get("active")) is bool for link in links
    ):
        return result.unknown("gpu.nvlink", subject, f"unreadable NVLink states {links!r}"[:200])
    if not links:
        return result.ok("gpu.nvlink", subject, "no NVLink")
    down = [str(link.get("link")) for link in links if not link["active"]]
    if down:
        message = f"NVLink {', '.join(down)} down of {len(links)}; expected all up"
        reason = f"{short} NVLink {down[0]} down" + (f" (+{len(down) - 1})" if len(down) > 1 else "")
        maker = result.fail if severity == result.FAIL else result.degraded
        return maker("gpu.nvlink", subject, message, reason)
    return result.ok("gpu.nvlink", subject, f"{len(links)} NVLinks up")


def _check_persistence(dev, subject, short) -> result.Result:
    mode = dev.get("persistence_mode")
    if mode is None:
        return result.ok("gpu.persistence", subject, "persistence mode not supported")
    if type(mode) is not int or mode not in (0, 1):
        return result.unknown("gpu.persistence", subject, f"unreadable persistence mode {mode!r}")
    if mode == 0:
        return result.degraded(
            "gpu.persistence",
            subject,
            "persistence mode off; expected on (nvidia-persistenced)",
            f"{short} persistence off",
        )
    return result.ok("gpu.persistence", subject, "persistence mode on")


def _check_pci(section, spec, judge_width: bool) -> list:
    """The bus's view: the NVIDIA GPUs on it (and, by address, those NVML listed before), and each link's
    width when NVML did not give it. A GPU gone from the bus fails, naming it; a device whose vendor id cannot
    be read is unknown, not gone."""
    if (
        not isinstance(section, dict)
        or section.get("answered") is not True
        or not isinstance(section.get("devices"), dict)
    ):
        why = (
            section.get("error")
            if isinstance(section, dict) and isinstance(section.get("error"), str)
            else "unreadable 'pci_gpus' section"
        )
        return [result.unknown("gpu.pci", "node", f"cannot see the PCI bus: {why}")]
    devices = {a: d for a, d in section["devices"].items() if isinstance(a, str)}
    nvidia, gone, unreadable = [], [], []
    for address, dev in sorted(devices.items()):
        if isinstance(dev, dict) and dev.get("present") is False:
            gone.append(address)
        elif (
            isinstance(dev, dict)
            and dev.get("present") is True
            and isinstance(dev.get("vendor"), str)
            and dev["vendor"].strip().lower() == NVIDIA_VENDOR
        ):
            nvidia.append(address)
        elif not (
            isinstance(dev, dict) and dev.get("present") is True and parse_int(dev.get("vendor")) is not None
        ):
            unreadable.append(address)  # (a readable other vendor id is simply not a GPU)
    seen = f"{len(nvidia)} NVIDIA GPUs on the PCI bus; expected {spec.count}"
    if gone:
        out = [
            result.fail(
                "gpu.pci", "node", f"{seen}; gone from the bus: {', '.join(gone)}", f"{gone[0]} gone from PCI"
            )
        ]
    elif len(nvidia) < spec.count and unreadable:
        out = [result.unknown("gpu.pci", "node", f"{seen}; unreadable vendor id of {', '.join(unreadable)}")]
    elif len(nvidia) < spec.count:
        out = [result.fail("gpu.pci", "node", seen, f"{len(nvidia)}/{spec.count} GPUs on PCI")]
    else:
        out = [result.ok("gpu.pci", "node", seen)]
    if not judge_width:
        return out
    for address in nvidia:
        dev = devices[address]
        width, max_width = parse_int(dev.get("current_link_width")), parse_int(dev.get("max_link_width"))
        if width is None or max_width is None or width <= 0 or max_width <= 0:
            out.append(
                result.unknown(
                    "gpu.pcie",
                    address,
                    f"unreadable link width {dev.get('current_link_width')!r} "
                    f"of {dev.get('max_link_width')!r}",
                )
            )
        elif width < max_width:
            out.append(
                result.degraded(
                    "gpu.pcie",
                    address,
                    f"PCIe link x{width}; expected x{max_width} (width is "
                    "judged at any load; the generation only under load)",
                    f"{address} PCIe x{width}",
                )
            )
        else:
            out.append(
                result.ok("gpu.pcie", address, f"x{width}; the generation is judged under load, by NVML")
            )
    return out
