"""`rocm-smi` and `rocminfo` outputs -> the `accel` section's device dicts (hw/amdparse.py tells the outputs
apart and merges them; hw/amdvalues.py holds the device dict and the value forms).

rocm-smi prints one `GPU[n]\\t\\t: key: \\tvalue` line per reading (`--showallinfo` and each --show option), a
concise table (`rocm-smi` alone: Device, Node, IDs, Temp, Power, Partitions, SCLK, MCLK, Fan, Perf, PwrCap,
VRAM%, GPU%, columns that moved between releases; a partition's secondary rows are N/A), or with `--json` an
object of `cardN` -> {key: value} with the same keys. VRAM% is memory allocated, not memory activity: it is not
read. rocminfo gives each GPU agent's name (its Marketing Name) and the ROCk (amdgpu) driver version.
"""

from __future__ import annotations

import json
import re

from .amdvalues import (
    blank_device,
    blank_system,
    bus_id,
    celsius,
    count,
    fill,
    first,
    gen_of_speed,
    lanes,
    mib,
    percent,
    quantity,
    text,
    version,
    watts,
)

MAX_DEVICES = 1024
_LINE = re.compile(r"(?:WARNING: |ERROR: )?GPU\[([0-9]{1,6})\]\s*:\s*(.{1,96}?):\s+(.*)")
_PCIE_LEVEL = re.compile(r"\(\s*([0-9.]+\s*GT/s)\s*,?\s*x([0-9]+)\s*\)")
_ROCK = re.compile(r"ROCk module(?: version)?\s+(\S+)\s+is loaded")


def _bytes_mib(value) -> float | None:
    q = quantity(value)
    return mib({"value": q[0], "unit": "B"}) if q is not None and q[1] in ("", "B") else None


def _device(index: int, kv: dict) -> dict:
    """One GPU's `key: value` readings (keys lower case, spaces single) as an `accel` device."""
    d = blank_device(index)
    d["name"] = first(text(kv.get("card series")), text(kv.get("marketing name")))
    d["bus_id"] = bus_id(kv.get("pci bus"))
    d["serial"] = text(kv.get("serial number"))
    d["temperature_c"] = first(
        celsius(kv.get("temperature (sensor junction) (c)")), celsius(kv.get("temperature (sensor edge) (c)"))
    )
    d["power_w"] = first(
        watts(kv.get("current socket graphics package power (w)")),
        watts(kv.get("average graphics package power (w)")),
    )
    d["power_limit_w"] = watts(kv.get("max graphics package power (w)"))
    d["util_pct"] = percent(kv.get("gpu use (%)"))
    d["mem_util_pct"] = percent(kv.get("gpu memory use (%)"))  # the memory controller's busy %, as UMC
    d["mem_used_mb"] = _bytes_mib(kv.get("vram total used memory (b)"))
    d["mem_total_mb"] = _bytes_mib(kv.get("vram total memory (b)"))
    level = _PCIE_LEVEL.search(kv.get("pcie clock level") or "")
    if level:
        d["pcie"].update(gen=gen_of_speed(level[1]), width=lanes(level[2]))
    firmware = {
        k[: -len(" firmware version")]: text(v) for k, v in kv.items() if k.endswith(" firmware version")
    }
    firmware["vbios"] = text(kv.get("vbios version"))
    d["firmware"] = {k: v for k, v in firmware.items() if v is not None and k}
    return d


def _table(lines: list[str]) -> dict[int, dict]:
    """The concise table's rows by device: the header names the columns; `(...)` under or beside a column
    name annotates it; a value split at `, ` (`0x75a0,   24959`, `NPS1, DPX, 0`) is one column."""
    columns: list[str] = []
    rows: dict[int, dict] = {}
    for line in lines:
        words = line.split()
        if (
            words
            and words[0] in ("Device", "GPU")
            and any(w.endswith("%") for w in words)
            and len(line) < 512
        ):
            columns = re.sub(r"\([^)]*\)", " ", line).split()
            continue
        cells: list[str] = []
        for word in words:
            if cells and cells[-1].endswith(","):
                cells[-1] += word
            else:
                cells.append(word)
        if not columns or len(cells) != len(columns) or not cells[0].isdigit() or len(cells[0]) > 6:
            continue
        row = dict(zip(columns, cells))
        d = blank_device(int(cells[0]))
        d["temperature_c"] = celsius(row.get("Temp"))
        d["power_w"] = watts(first(row.get("Power"), row.get("AvgPwr")))
        d["power_limit_w"] = watts(row.get("PwrCap"))
        d["util_pct"] = percent(row.get("GPU%"))
        if len(rows) < MAX_DEVICES:
            rows.setdefault(d["index"], d)
    return rows


def parse_rocm_smi(data: str) -> dict:
    """`rocm-smi` as printed: GPU[n] lines, the concise table, or `--json`; all three may be in one output."""
    system = blank_system()
    readings: dict[int, dict] = {}
    if re.search(r"\"card[0-9]+\"\s*:\s*\{", data):
        start = data.find("{")
        try:
            doc = json.loads(data[start:]) if start >= 0 else None
        except (ValueError, RecursionError):
            doc = None
        for card, values in (doc if isinstance(doc, dict) else {}).items():
            index = count(card[4:]) if isinstance(card, str) and card.startswith("card") else None
            if index is not None and isinstance(values, dict) and len(readings) < MAX_DEVICES:
                readings[index] = {" ".join(str(k).lower().split()): v for k, v in values.items()}
    lines = data.splitlines()
    for line in lines:
        match = _LINE.fullmatch(line.strip())
        if match and len(match[1]) <= 6 and (int(match[1]) in readings or len(readings) < MAX_DEVICES):
            readings.setdefault(int(match[1]), {})[" ".join(match[2].lower().split())] = match[3].strip()
    devices = {index: _device(index, kv) for index, kv in readings.items()}
    for index, row in _table(lines).items():
        fill(devices.setdefault(index, blank_device(index)), row)
    for kv in readings.values():
        system["driver_version"] = system["driver_version"] or version(kv.get("driver version"))
    return {"system": system, "devices": [devices[i] for i in sorted(devices)]}


def parse_rocminfo(data: str) -> dict:
    """`rocminfo`: each agent whose Device Type is GPU, numbered in order (its name: Marketing Name, else
    Name), and the ROCk module (amdgpu driver) version. Keys are read at the agent's own indentation, so the
    ISA's `Name:` deeper down is not the agent's."""
    system = blank_system()
    rock = _ROCK.search(data)
    system["driver_version"] = version(rock[1]) if rock else None
    agents: list[dict] = []
    indent = None
    for line in data.splitlines():
        if re.fullmatch(r"\s*Agent\s+[0-9]+\s*", line):
            agents.append({})
            continue
        key, colon, value = line.partition(":")
        depth = len(key) - len(key.lstrip())
        if not colon or not key.strip():
            continue
        if indent is None and key.strip() == "Name":
            indent = depth
        if depth != indent or len(agents) > MAX_DEVICES:
            continue
        if not agents or key.strip() in agents[-1]:
            agents.append({})
        agents[-1][key.strip()] = value.strip()
    gpus = [a for a in agents if a.get("Device Type") == "GPU"]
    devices = []
    for index, agent in enumerate(gpus):
        d = blank_device(index)
        d["name"] = first(text(agent.get("Marketing Name")), text(agent.get("Name")))
        devices.append(d)
    return {"system": system, "devices": devices}
