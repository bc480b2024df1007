"""AMD tool outputs -> the `accel` section's device dicts (hw/accel.py), for fixtures and for replay snapshots
built from what a node printed when amdsmi could not be run in place.

- `amd-smi static` / `amd-smi metric`, text (indented `KEY: value` blocks per `GPU: N`, lists wrapped over
  lines) or `--json` (a list of {"gpu": N, ...} with {value, unit} objects beside bare "N/A"; a cut JSON
  document is closed after its last whole line);
- `amd-smi` with no command: the default table (two rows per GPU, a version banner);
- `rocm-smi`: the concise table and the `GPU[n]\\t\\t: key: value` lines (`--showallinfo` and its parts), and
  `--json`; rocmparse.py;
- `rocminfo`: the GPU agents' names; rocmparse.py.

Each parse_* returns {"system": {...}, "devices": [...]} with every value the output does not give None;
`section()` merges several outputs of one node into an `accel` section (source "replay"). Never raises.
"""

from __future__ import annotations

import json
import re

from . import rocmparse
from .amdvalues import (
    blank_device,
    blank_system,
    bus_id,
    celsius,
    count,
    fill_minors,
    first,
    gen,
    gen_of_speed,
    lanes,
    merge,
    mib,
    percent,
    text,
    version,
    watts,
)

_KEY = re.compile(r"( *)([A-Za-z0-9_][A-Za-z0-9_ ]{0,63}?)[ \t]*:(?:[ \t]+(.*))?")
MAX_DEVICES = 1024  # more GPU blocks than any node has: the rest of such an output is not read
MAX_VALUE = 4096  # a value wrapped over lines is not followed further (amd-smi's longest list is ~200 chars)
_REPAIR_LINES = 64  # a cut JSON document is closed after one of its last lines
MAX_JSON = 16 << 20  # a cut document longer than this is not repaired (amd-smi's for 8 GPUs is ~100 kB)


def _tree_text(data: str) -> list[tuple[int, dict]]:
    """`amd-smi static|metric` text -> [(gpu index, {section: {key: value}})], keys lower case. A line without
    `KEY:` continues the value above it (amd-smi wraps long lists)."""
    gpus: list[tuple[int, dict]] = []
    stack: list[tuple[int, dict]] = []
    last: tuple[dict, str] | None = None
    for line in data.expandtabs(4).splitlines():
        match = _KEY.fullmatch(line)
        if match is None:
            if last is not None and line.strip() and len(last[0][last[1]]) < MAX_VALUE:
                last[0][last[1]] += " " + line.strip()
            continue
        indent, key, value = len(match[1]), match[2].strip().lower(), (match[3] or "").strip()
        last = None
        if indent == 0:
            index = count(value) if key == "gpu" else None
            stack = []
            if index is not None and len(gpus) < MAX_DEVICES:
                stack = [(0, {})]
                gpus.append((index, stack[0][1]))
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            continue
        parent = stack[-1][1]
        if value:
            parent[key] = value
            last = (parent, key)
        elif len(stack) < 8:
            parent[key] = {}
            stack.append((indent, parent[key]))
    return gpus


def _json_start(data: str) -> int:
    """Where the JSON document starts: the first line beginning with [ or { (a prompt line may come first)."""
    match = re.search(r"^[ \t]*[\[{]", data, re.M)
    return match.end() - 1 if match else -1


def _closers_at(data: str, cuts: set[int]) -> dict[int, str | None]:
    """At each offset in `cuts`, the brackets that close what data[:offset] leaves open; None where it is
    inside a string or a bracket closed the wrong one. One pass."""
    stack: list[str] = []
    in_string = escaped = broken = False
    out: dict[int, str | None] = {}
    for i, ch in enumerate(data):
        if i in cuts:
            out[i] = None if in_string or broken else "".join(reversed(stack))
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}" and (not stack or stack.pop() != ch):
            broken = True
    return out


def load_json(data: str):
    """The JSON document in a tool's output; one cut short (a log excerpt, a full disk) is closed after the
    last of its whole lines that leaves it valid (a line cut mid-way is dropped: `95` cut to `9` is no
    reading). None when there is none."""
    start = _json_start(data)
    if start < 0:
        return None
    data = data[start:]
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        pass
    if len(data) > MAX_JSON:
        return None
    cuts = [m.start() for m in re.finditer("\n", data)][-_REPAIR_LINES:]
    closers = _closers_at(data, set(cuts))
    for cut in reversed(cuts):
        head, tail = data[:cut].rstrip().rstrip(","), closers[cut]
        if tail is None or head.endswith(":"):
            continue
        try:
            return json.loads(head + tail)
        except (ValueError, RecursionError):
            continue
    return None


def _lower(tree, depth: int = 0):
    if isinstance(tree, dict) and depth < 8:
        return {str(k).lower(): _lower(v, depth + 1) for k, v in tree.items()}
    return tree


def _tree_json(doc) -> list[tuple[int, dict]]:
    """`amd-smi ... --json`: a list of {"gpu": N, ...}, or an object holding such a list."""
    if isinstance(doc, dict):
        doc = next((v for v in doc.values() if isinstance(v, list)), [doc])
    gpus = []
    for item in doc[:MAX_DEVICES] if isinstance(doc, list) else []:
        index = count(item.get("gpu")) if isinstance(item, dict) else None
        if index is not None:
            gpus.append((index, _lower(item)))
    return gpus


def _at(tree: dict, section: str, key: str):
    part = tree.get(section)
    return part.get(key) if isinstance(part, dict) else None


def _device(index: int, t: dict) -> dict:
    """One GPU of `amd-smi static|metric` (text or JSON) as an `accel` device."""
    d = blank_device(index)
    d["name"] = first(text(_at(t, "asic", "market_name")), text(_at(t, "board", "product_name")))
    d["bus_id"] = bus_id(first(_at(t, "bus", "bdf"), t.get("bdf")))
    d["serial"] = first(text(_at(t, "board", "product_serial")), text(_at(t, "asic", "asic_serial")))
    d["power_w"] = watts(_at(t, "power", "socket_power"))
    d["power_limit_w"] = watts(_at(t, "limit", "socket_power"))
    d["temperature_c"] = first(
        celsius(_at(t, "temperature", "hotspot")), celsius(_at(t, "temperature", "edge"))
    )
    d["util_pct"] = percent(_at(t, "usage", "gfx_activity"))
    d["mem_util_pct"] = percent(_at(t, "usage", "umc_activity"))
    d["mem_used_mb"] = mib(_at(t, "mem_usage", "used_vram"))
    d["mem_total_mb"] = mib(_at(t, "mem_usage", "total_vram"))
    d["ecc"] = {
        "uncorrected": count(_at(t, "ecc", "total_uncorrectable_count")),
        "corrected": count(_at(t, "ecc", "total_correctable_count")),
    }
    d["pcie"] = {
        "width": lanes(_at(t, "pcie", "width")),
        "max_width": lanes(_at(t, "bus", "max_pcie_width")),
        "gen": gen_of_speed(_at(t, "pcie", "speed")),
        "max_gen": first(
            gen(_at(t, "bus", "pcie_interface_version")), gen_of_speed(_at(t, "bus", "max_pcie_speed"))
        ),
    }
    vbios = first(text(_at(t, "vbios", "version")), text(_at(t, "ifwi", "version")))
    d["firmware"] = {"vbios": vbios} if vbios else {}
    return d


def _from_trees(trees: list[tuple[int, dict]]) -> dict:
    system = blank_system()
    devices = []
    for index, tree in trees:
        devices.append(_device(index, tree))
        system["driver_version"] = system["driver_version"] or version(_at(tree, "driver", "version"))
    return {"system": system, "devices": devices}


def parse_amdsmi_text(data: str) -> dict:
    """`amd-smi static` or `amd-smi metric` (any of their options), as printed."""
    return _from_trees(_tree_text(data))


def parse_amdsmi_json(data: str) -> dict:
    """`amd-smi static --json` or `amd-smi metric --json`."""
    return _from_trees(_tree_json(load_json(data)))


_BANNER = re.compile(r"AMD-SMI\s+(\S+)\s+amdgpu version:\s*(\S*)\s+ROCm version:\s*(\S*)")
_ROW1 = re.compile(
    r"\|\s*(\S+)\s+(.*?)\s*\|\s*(N/A|[0-9.]+\s*%)\s+(N/A|[0-9.]+\s*°?C)\s+(N/A|[0-9]+)\s+(N/A|[0-9.]+\s*W)\s*\|"
)
_PCT = r"(?:N/A|[0-9.]+\s*%)"
_ROW2 = re.compile(
    rf"\|\s*([0-9]+)\s+\S+\s+\S+\s+\S+\s*\|\s*({_PCT})\s+{_PCT}\s+(N/A|\S+\s*/\s*\S+)\s*(\S*)\s*\|"
)


def parse_amdsmi_table(data: str) -> dict:
    """`amd-smi` alone: the banner (tool, amdgpu and ROCm versions) and two rows per GPU: BDF, name, Mem-Uti,
    Temp, UEC (uncorrectable ECC), Power / GPU, HIP-ID, OAM-ID, Partition, GFX-Uti, Fan, Mem-Usage."""
    system = blank_system()
    devices: list[dict] = []
    pending = None
    for line in data.splitlines():
        if len(line) > 512:  # a table row is about 80 characters; anything this long is not one
            continue
        banner = _BANNER.search(line)
        if banner:
            system.update(tool_version=version(banner[1]), driver_version=version(banner[2]))
            system["rocm_version"] = version(banner[3])
        row1, row2 = _ROW1.fullmatch(line.strip()), _ROW2.fullmatch(line.strip())
        if row1:
            pending = row1
        elif row2 and pending is not None and len(devices) < MAX_DEVICES:
            d = blank_device(int(row2[1]) if len(row2[1]) <= 6 else len(devices))
            d.update(bus_id=bus_id(pending[1]), name=text(pending[2]), mem_util_pct=percent(pending[3]))
            d.update(temperature_c=celsius(pending[4]), power_w=watts(pending[6]), util_pct=percent(row2[2]))
            d["ecc"]["uncorrected"] = count(pending[5])
            used, _, total = row2[3].partition("/")
            d["mem_used_mb"], d["mem_total_mb"] = mib(used + row2[4]), mib(total + row2[4])
            devices.append(d)
            pending = None
    return {"system": system, "devices": devices}


def kind(data: str) -> str | None:
    """Which tool printed `data`: amdsmi-json, amdsmi-table, amdsmi-text, rocm-smi, rocminfo, or None."""
    if re.search(r"\"card[0-9]+\"\s*:\s*\{", data):
        return "rocm-smi"
    if _json_start(data) >= 0 and re.search(r"\"gpu\"\s*:", data):
        return "amdsmi-json"
    if _BANNER.search(data) or re.search(r"\|\s*BDF\s+GPU-Name\s*\|", data):
        return "amdsmi-table"
    if re.search(r"^GPU:[ \t]*[0-9]+[ \t]*$", data, re.M):
        return "amdsmi-text"
    if re.search(r"^[ \t]*GPU\[[0-9]+\][ \t]*:|^[ \t]*(Device|GPU)[ \t]+.*\bGPU%", data, re.M):
        return "rocm-smi"
    if re.search(r"^[ \t]*(Marketing Name|Device Type):", data, re.M):
        return "rocminfo"
    return None


PARSERS = {
    "amdsmi-json": parse_amdsmi_json,
    "amdsmi-table": parse_amdsmi_table,
    "amdsmi-text": parse_amdsmi_text,
    "rocm-smi": rocmparse.parse_rocm_smi,
    "rocminfo": rocmparse.parse_rocminfo,
}


def parse_any(data) -> dict:
    """Any of the outputs above, told apart by their form; nothing recognised: no devices."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    found = kind(data) if isinstance(data, str) else None
    return PARSERS[found](data) if found else {"system": blank_system(), "devices": []}


def section(outputs: list, elapsed_s: float = 0.0) -> dict:
    """The `accel` section (vendor amd, source replay) of one node from its tools' outputs, the most trusted
    first (amd-smi static and metric before rocm-smi before rocminfo). No device in any: not answered."""
    merged = merge([parse_any(out) for out in outputs])
    fill_minors(merged["devices"])
    out = {"answered": bool(merged["devices"]), "vendor": "amd", "source": "replay", "elapsed_s": elapsed_s}
    out.update(merged)
    if not merged["devices"]:
        out["error"] = "no AMD device in the tool outputs"
    return out
