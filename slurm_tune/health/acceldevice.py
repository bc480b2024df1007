"""The accel family's checks of one device (health/accel.py): Ascend's health state, ECC/RAS errors, temperature,
power, the PCIe link and AMD's XGMI links, each against the profile's `accel` thresholds.

A value the tool did not give (None: npu-smi's `-`/`NA`, amdsmi's not supported) is not measured: ok, said
so, unless the device's `errors` say the read failed (unknown, with that reason). A value that is not of the
section's type and range (text for a number, a bool, 1e300 degrees) is unknown, never a finding.
"""

from __future__ import annotations

from ..vendors import AMD, ASCEND, DEFAULT_MAX_TEMP_C
from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

PREFIX = {AMD: "gpu", ASCEND: "npu"}
TOOL = {AMD: "amdsmi", ASCEND: "npu-smi"}
# npu-smi's health states (npu-smi info's Health column): OK is healthy, Warning is the profile's call,
# Alarm and Critical always fail (docs/accelerators.md).
HEALTH_OK, HEALTH_WARNING, HEALTH_FAIL = "OK", "Warning", ("Alarm", "Critical")
BAD = object()  # a value present but not of its type and range
TEMP_RANGE, POWER_RANGE, COUNT_RANGE = (-60.0, 250.0), (0.0, 10000.0), (0, (1 << 64) - 1)
WIDTHS = (1, 2, 4, 8, 12, 16, 32)
GEN_RANGE = (1, 8)


def number(value, low: float, high: float, whole: bool = False):
    """The value when it is a number of the section's (int or float, not bool, not NaN) within [low, high];
    None when absent; BAD otherwise."""
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        return BAD
    return value


def shown(value, limit: int = 40) -> str:
    """A value as a message quotes it, short: text as repr of its first `limit` characters, others by repr."""
    try:
        return repr(value[:limit]) if isinstance(value, str) else repr(value)[: limit * 2]
    except ValueError:  # an int past Python's digit limit for text
        return "a number too long to show"


def bus_address(text) -> str | None:
    """A PCI address as sysfs names it (`0000:c1:00.0`), lower case, from the forms the tools print; None for
    anything else (a masked `0000:xx:00.0` included)."""
    if not isinstance(text, str) or len(text) > 16:
        return None
    parts = text.strip().lower().replace(".", ":").split(":")
    if len(parts) == 3:
        parts = ["0000", *parts]
    sizes = (4, 2, 2, 1)
    if len(parts) != 4 or not all(
        len(p) == n and all(c in "0123456789abcdef" for c in p) for p, n in zip(parts, sizes)
    ):
        return None
    return f"{parts[0]}:{parts[1]}:{parts[2]}.{parts[3]}"


def minor_of(dev) -> int | None:
    minor = dev.get("minor") if isinstance(dev, dict) else None
    return minor if type(minor) is int and 0 <= minor < 1 << 16 else None


def name_of(dev, pos: int, vendor: str) -> str:
    """`npu3` (by minor, Slurm's number), else `npu3.1` (npu-smi's id and chip), else `npu#5` (the position)."""
    prefix, minor = PREFIX[vendor], minor_of(dev)
    index, chip = (dev.get(k) if isinstance(dev, dict) else None for k in ("index", "chip"))
    if minor is not None:
        return f"{prefix}{minor}"
    if type(index) is int and 0 <= index < 1 << 16:
        return f"{prefix}{index}" + (f".{chip}" if type(chip) is int and 0 <= chip < 64 else "")
    return f"{prefix}#{pos}"


def why_unread(dev: dict, *stems: str) -> str | None:
    """The device's recorded reason a reading failed (`errors` keys starting with one of `stems`), or None."""
    errors = dev.get("errors")
    for key, why in errors.items() if isinstance(errors, dict) else ():
        if isinstance(key, str) and key.startswith(stems) and isinstance(why, str):
            return " ".join(why.split())[:200] or "failed"
    return None


def unmeasured(dev: dict, check: str, subject: str, what: str, vendor: str, stem: str) -> result.Result:
    """A reading the tool did not give: unknown when the device's `errors` say the read failed, else said."""
    why = why_unread(dev, stem)
    if why:
        return result.unknown(check, subject, f"{what} not read: {why}")
    return result.ok(check, subject, f"{what} not reported by {TOOL[vendor]}")


def _maker(level: str):
    return result.fail if level == result.FAIL else result.degraded


def check(dev, pos: int, vendor: str, profile: Profile) -> list:
    """Every finding of one device; a bug its data triggers is its own unknown, never its neighbours'."""
    name = name_of(dev, pos, vendor)
    if not isinstance(dev, dict):
        return [result.unknown("accel.device", name, "unreadable device entry")]
    address = bus_address(dev.get("bus_id"))
    subject = f"{name} {address}" if address else name
    try:
        return _checks(dev, subject, name, vendor, profile)
    except Exception as exc:
        return [
            result.unknown(
                "accel.internal", subject, f"internal error judging {name}: {type(exc).__name__}: {exc}"
            )
        ]


def max_temp_c(profile: Profile, vendor: str) -> int:
    """accel.max_temp_c, else the vendor's default (vendors.py): accelspec.max_temp_c's rule, without the
    schema accelspec imports (not on a hook's path)."""
    given = profile.accel.max_temp_c
    return given if given is not None else DEFAULT_MAX_TEMP_C[vendor]


def _checks(dev: dict, subject: str, short: str, vendor: str, profile: Profile) -> list:
    spec = profile.accel
    out = [_model(dev, subject, short, profile.gpu.model)]
    if vendor == ASCEND:
        out.append(_health(dev, subject, short, spec.health_warning))
    out += [
        _ecc(dev, subject, short, vendor, spec.ecc_uncorrected, spec.ecc_corrected_max),
        _thermal(dev, subject, short, vendor, max_temp_c(profile, vendor)),
        _power(dev, subject, short, vendor, spec.max_power_w),
        _pcie(dev, subject, short, vendor),
    ]
    if vendor == AMD:
        out.append(_xgmi(dev, subject, short, spec.links_down))
    return out


def _model(dev, subject, short, model) -> result.Result:
    name = dev.get("name")
    if not model:
        return result.ok(
            "accel.model",
            subject,
            f"{name[:80] if isinstance(name, str) else shown(name)} (no model required)",
        )
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        return result.unknown("accel.model", subject, f"unreadable name {shown(name, 80)}; expected {model}")
    if model.lower() not in name.lower():
        return result.fail(
            "accel.model", subject, f"{name[:80]}; expected {model}", f"{short} is {name[:40]}"
        )
    return result.ok("accel.model", subject, f"{name[:80]}; expected {model}")


def _health(dev, subject, short, warning_level) -> result.Result:
    health = dev.get("health")
    if health == HEALTH_OK:
        return result.ok("accel.health", subject, "npu-smi health OK")
    if health == HEALTH_WARNING:
        return _maker(warning_level)(
            "accel.health",
            subject,
            f"npu-smi health Warning; expected OK (accel.health_warning: {warning_level})",
            f"{short} health Warning",
        )
    if health in HEALTH_FAIL:
        return result.fail(
            "accel.health", subject, f"npu-smi health {health}; expected OK", f"{short} {health}"
        )
    why = why_unread(dev, "health")
    return result.unknown(
        "accel.health", subject, f"unreadable health {shown(health)}" + (f": {why}" if why else "")
    )


def _ecc(dev, subject, short, vendor, uncorrected_level, corrected_max) -> result.Result:
    ecc = dev.get("ecc")
    ecc = {} if ecc is None else ecc
    if not isinstance(ecc, dict):
        return result.unknown("accel.ecc", subject, f"unreadable ECC counts {shown(ecc, 80)}")
    raw = (ecc.get("uncorrected"), ecc.get("corrected"))
    unc, cor = (number(v, *COUNT_RANGE, whole=True) for v in raw)
    if type(unc) is int and unc > 0:
        return _maker(uncorrected_level)(
            "accel.ecc",
            subject,
            f"{unc} uncorrectable ECC/RAS errors; expected 0 (accel.ecc_uncorrected: {uncorrected_level})",
            f"{short} {unc} uncorrected ECC",
        )
    if type(cor) is int and corrected_max is not None and cor > corrected_max:
        return result.degraded(
            "accel.ecc",
            subject,
            f"{cor} correctable ECC/RAS errors; expected at most {corrected_max} (accel.ecc_corrected_max)",
            f"{short} {cor} corrected ECC",
        )
    if unc is BAD or cor is BAD:
        return result.unknown("accel.ecc", subject, f"unreadable ECC counts {shown(raw, 80)}")
    if unc is None and cor is None:
        return unmeasured(dev, "accel.ecc", subject, "ECC counts", vendor, "ecc")
    return result.ok("accel.ecc", subject, f"{unc} uncorrectable, {cor} correctable ECC/RAS errors")


def _thermal(dev, subject, short, vendor, limit) -> result.Result:
    temp = number(dev.get("temperature_c"), *TEMP_RANGE)
    if temp is BAD:
        return result.unknown(
            "accel.thermal", subject, f"unreadable temperature {shown(dev.get('temperature_c'))}"
        )
    if temp is None:
        return unmeasured(dev, "accel.thermal", subject, "temperature", vendor, "temperature")
    if temp > limit:
        return result.degraded(
            "accel.thermal",
            subject,
            f"{temp:g} C; expected at most {limit} C (accel.max_temp_c)",
            f"{short} {temp:g}C",
        )
    return result.ok("accel.thermal", subject, f"{temp:g} C (limit {limit} C)")


def _power(dev, subject, short, vendor, limit) -> result.Result:
    power = number(dev.get("power_w"), *POWER_RANGE)
    if power is BAD:
        return result.unknown("accel.power", subject, f"unreadable power {shown(dev.get('power_w'))}")
    if power is None and limit is None:
        return result.ok("accel.power", subject, f"power not reported by {TOOL[vendor]} (no limit set)")
    if power is None:
        return unmeasured(dev, "accel.power", subject, "power", vendor, "power")
    if limit is not None and power > limit:
        return result.degraded(
            "accel.power",
            subject,
            f"{power:g} W; expected at most {limit:g} W (accel.max_power_w)",
            f"{short} {power:g}W",
        )
    return result.ok(
        "accel.power", subject, f"{power:g} W" + (f" (limit {limit:g} W)" if limit is not None else "")
    )


def _pcie(dev, subject, short, vendor) -> result.Result:
    link = dev.get("pcie")
    link = {} if link is None else link
    if not isinstance(link, dict):
        return result.unknown("accel.pcie", subject, f"unreadable PCIe link {shown(link, 80)}")
    width, max_width = (number(link.get(k), 1, 32, whole=True) for k in ("width", "max_width"))
    gen, max_gen = (number(link.get(k), *GEN_RANGE, whole=True) for k in ("gen", "max_gen"))
    values = {k: link.get(k) for k in ("width", "max_width", "gen", "max_gen")}
    if any(v is BAD for v in (width, max_width, gen, max_gen)) or any(
        type(w) is int and w not in WIDTHS for w in (width, max_width)
    ):
        return result.unknown("accel.pcie", subject, f"unreadable PCIe link {shown(values, 120)}")
    if width is None or max_width is None:
        return unmeasured(dev, "accel.pcie", subject, "PCIe link width", vendor, "pcie")
    if width < max_width:
        return result.degraded(
            "accel.pcie",
            subject,
            f"PCIe link x{width}; expected x{max_width} (width is judged at any load)",
            f"{short} PCIe x{width}",
        )
    util = number(dev.get("util_pct"), 0.0, 100.0)
    if gen is None or max_gen is None:
        return result.ok("accel.pcie", subject, f"x{width}; link generation not reported")
    if not (util is not None and util is not BAD and util > 0):
        return result.ok(
            "accel.pcie",
            subject,
            f"x{width}; gen {gen} of {max_gen} not judged: the device is idle (links train down at idle), "
            "judged under load",
        )
    if gen < max_gen:
        return result.degraded(
            "accel.pcie",
            subject,
            f"PCIe gen {gen} under load; expected gen {max_gen}",
            f"{short} PCIe gen{gen}",
        )
    return result.ok(
        "accel.pcie", subject, f"gen {gen} x{width} under load; expected gen {max_gen} x{max_width}"
    )


def _xgmi(dev, subject, short, level) -> result.Result:
    links = dev.get("links")
    links = [] if links is None else links
    if not isinstance(links, list) or not all(
        isinstance(link, dict) and type(link.get("up")) is bool and type(link.get("link")) is int
        for link in links
    ):
        return result.unknown("accel.xgmi", subject, f"unreadable XGMI links {shown(links, 120)}")
    if not links:
        why = why_unread(dev, "links")
        if why:
            return result.unknown("accel.xgmi", subject, f"XGMI links not read: {why}")
        return result.ok("accel.xgmi", subject, "no XGMI links")
    down = [str(link["link"]) for link in links if not link["up"]]
    if down:
        return _maker(level)(
            "accel.xgmi",
            subject,
            f"XGMI link {', '.join(down)} down of {len(links)}; expected all up (accel.links_down: {level})",
            f"{short} XGMI {down[0]} down" + (f" (+{len(down) - 1})" if len(down) > 1 else ""),
        )
    return result.ok("accel.xgmi", subject, f"{len(links)} XGMI links up")
