"""The AMD device dict (hw/accel.py's `accel` section) and the value forms AMD's tools give, for hw/amd.py
(amdsmi, live) and hw/amdparse.py (amd-smi, rocm-smi and rocminfo outputs).

Values come as amdsmi returns them (20, "N/A") or as the tools print them ("20 W", "29 °C", "3056 MB",
"32 GT/s", "Gen 5", {"value": 42, "unit": "%"}). Each converter returns the value in the section's unit, or
None for N/A, a unit it does not know, or anything that is not a plain number: garbage is unmeasured, never 0.
"""

from __future__ import annotations

import math
import re

# amdsmi's "no value": uint16/32/64 max, as its _validate_if_max_uint says
UNSET = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
_QUANTITY = re.compile(r"([-+]?[0-9]{1,18}(?:\.[0-9]{1,9})?)\s*([A-Za-z°%/]{0,8})")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+~_-]{0,63}")
_BUS_ID = re.compile(r"(?:[0-9a-fx]{4,8}:)?[0-9a-fx]{2}:[0-9a-fx]{2}\.[0-7x]")
_GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}  # PCIe GT/s -> generation
_NOT_GIVEN = frozenset(("", "n/a", "na", "-", "none", "unknown", "not supported", "<redacted>"))
MIB = 1048576.0
# Beyond these a reading is a sensor answering garbage, not a device: unmeasured, so it can never fail a node
MAX_WATTS = 10000.0  # one accelerator (an MI355X OAM is rated 1400 W)
TEMPERATURE_C = (-50.0, 200.0)  # a die hotter than 200 °C has long shut itself down
MAX_MIB = float(1 << 30)  # a pebibyte of device memory


def blank_device(index: int) -> dict:
    """A device of the `accel` section with nothing measured: every value None (unmeasured, never 0)."""
    return {
        "index": index,
        "chip": 0,
        "minor": None,
        "render": None,  # AMD: N of /dev/dri/renderDN where the tool tells it (minor is N - 128)
        "name": None,
        "health": None,
        "bus_id": None,
        "serial": None,
        "power_w": None,
        "power_limit_w": None,
        "temperature_c": None,
        "util_pct": None,
        "mem_util_pct": None,
        "mem_used_mb": None,
        "mem_total_mb": None,
        "ecc": {"uncorrected": None, "corrected": None},
        "pcie": {"width": None, "max_width": None, "gen": None, "max_gen": None},
        "links": [],
        "processes": None,
        "firmware": {},  # name -> version as the tool gives them (vbios, and rocm-smi's firmware blocks)
        "errors": {},
    }


def blank_system() -> dict:
    return {
        "driver_version": None,
        "firmware_version": None,
        "cann_version": None,
        "rocm_version": None,
        "tool_version": None,
        "errors": {},
    }


def text(value) -> str | None:
    """A printable value as given, stripped; None for N/A and the other ways of saying nothing."""
    if isinstance(value, dict):
        value = value.get("value")
    if not isinstance(value, str):
        return None
    value = " ".join(value.split())
    return value if value.lower() not in _NOT_GIVEN and value.isprintable() and len(value) <= 256 else None


def version(value) -> str | None:
    """A version as given (6.8.5, 6.3.3, 26.1.0+e94df3ed), None unless it starts with a digit."""
    value = text(value)
    return value if value is not None and _VERSION.fullmatch(value) else None


def bus_id(value) -> str | None:
    """0000:c1:00.0 in lower case (a masked 0000:xx:00.0 stays), None unless it is a PCI address."""
    value = text(value)
    return value.lower() if value is not None and _BUS_ID.fullmatch(value.lower()) else None


def quantity(value) -> tuple[float, str] | None:
    """(number, unit) of 20, 20.5, "20 W", "29 °C", {"value": 20, "unit": "W"}; None for anything else."""
    unit = ""
    if isinstance(value, dict):
        given = value.get("unit")
        unit, value = given if isinstance(given, str) else "", value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if isinstance(value, int) and value in UNSET:
            return None
        number = float(value)
    elif isinstance(value, str):
        match = _QUANTITY.fullmatch(value.strip())
        if match is None:
            return None
        number, unit = float(match[1]), match[2] or unit
    else:
        return None
    return (number, unit.strip()) if math.isfinite(number) else None


def _scaled(value, units: dict) -> float | None:
    q = quantity(value)
    if q is None or q[1] not in units or q[0] < 0:
        return None
    return q[0] * units[q[1]]


def watts(value) -> float | None:
    w = _scaled(value, {"": 1.0, "W": 1.0, "mW": 1e-3, "uW": 1e-6, "µW": 1e-6, "kW": 1e3})
    return w if w is not None and w <= MAX_WATTS else None


def mib(value) -> float | None:
    """Memory in MiB (amd-smi's MB are MiB: it divides bytes by 1024*1024)."""
    units = {"": 1.0, "MB": 1.0, "MiB": 1.0, "GB": 1024.0, "GiB": 1024.0, "KB": 1 / 1024, "KiB": 1 / 1024}
    mb = _scaled(value, {**units, "B": 1 / MIB})
    return mb if mb is not None and mb <= MAX_MIB else None


def celsius(value) -> float | None:
    q = quantity(value)
    low, high = TEMPERATURE_C
    return q[0] if q is not None and q[1] in ("", "°C", "C", "c") and low < q[0] < high else None


def percent(value) -> float | None:
    q = quantity(value)
    return q[0] if q is not None and q[1] in ("", "%") and 0 <= q[0] <= 100 else None


def count(value) -> int | None:
    """A counter: a whole number >= 0 (not amdsmi's "no value"), else None."""
    q = quantity(value)
    return int(q[0]) if q is not None and q[1] == "" and q[0] >= 0 and q[0] == int(q[0]) else None


def lanes(value) -> int | None:
    n = count(value.lstrip("xX") if isinstance(value, str) else value)
    return n if n is not None and 1 <= n <= 64 else None


def gen_of_speed(value) -> int | None:
    """PCIe generation of a transfer rate: 32 GT/s, 32000 (amdsmi's MT/s), "16.0GT/s" -> 5, 5, 4."""
    q = quantity(value)
    if q is None or q[1] not in ("", "GT/s", "MT/s"):
        return None
    gts = q[0] / 1000 if q[1] == "MT/s" or (q[1] == "" and q[0] >= 1000) else q[0]
    return _GEN_OF_GTS.get(round(gts, 1))


def gen(value) -> int | None:
    """A PCIe generation: 5, "5", "Gen 5", "GEN5"."""
    if isinstance(value, str):
        value = value.strip()
        value = value[3:].strip() if value[:3].lower() == "gen" else value
    n = count(value)
    return n if n is not None and 1 <= n <= 7 else None


def first(*values):
    return next((v for v in values if v is not None), None)


def fill_minors(devices: list[dict], base: int = 128) -> None:
    """Each device's `minor`: Slurm's number for its render node, where gres.conf lists the node's
    /dev/dri/renderD* files in order. Render nodes are contiguous (renderD128, renderD129, ...) except on
    MI300-class GPUs, whose driver makes 8 per GPU (renderD128, renderD136, ...): the step between them (the
    gcd of their offsets from renderD128) is taken out, so minor is (N - 128) / step; a missing GPU leaves its
    number free. A device whose render node is not known gets its bus-id-ordered position (then index order)."""
    offsets = [
        d["render"] - base for d in devices if isinstance(d.get("render"), int) and d["render"] >= base
    ]
    step = math.gcd(*offsets) or 1
    order = sorted(
        range(len(devices)), key=lambda i: (devices[i]["bus_id"] is None, devices[i]["bus_id"] or "", i)
    )
    for pos, i in enumerate(order):
        render = devices[i].get("render")
        if devices[i]["minor"] is None:
            devices[i]["minor"] = (
                (render - base) // step if isinstance(render, int) and render >= base else pos
            )


def fill(into: dict, dev: dict) -> None:
    """Give `into` (a device) each value of `dev` (the same device from another output) it does not have."""
    for key, value in dev.items():
        if isinstance(value, dict):
            into[key].update({k: v for k, v in value.items() if into[key].get(k) is None})
        elif key == "links":
            into[key] = into[key] or value
        elif into.get(key) is None:
            into[key] = value


def merge(parts: list[dict]) -> dict:
    """One {system, devices} from several parsed outputs of the same node: devices matched by index, each
    value taken from the first output that gives it (list them in order of trust)."""
    system = blank_system()
    devices: dict[int, dict] = {}
    for part in parts:
        for key, value in part.get("system", {}).items():
            if key == "errors":
                system["errors"].update(value)
            elif system.get(key) is None:
                system[key] = value
        for dev in part.get("devices", []):
            fill(devices.setdefault(dev["index"], blank_device(dev["index"])), dev)
    return {"system": system, "devices": [devices[i] for i in sorted(devices)]}
