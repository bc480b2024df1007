"""`npu-smi info` into `accel` devices (hw/accel.py's format, vendor ascend): the pure parser.

The table, as npu-smi 24.x/25.x print it (910B; widths change with the version and the card):

    | npu-smi 24.1.rc1                 Version: 24.1.rc1                                             |
    +---------------------------+---------------+----------------------------------------------------+
    | NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
    | Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
    +===========================+===============+====================================================+
    | 0     910B3               | OK            | 97.6        52                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           0    / 0          3525 / 65536         |
    +===========================+===============+====================================================+
    +---------------------------+---------------+----------------------------------------------------+
    | NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
    +===========================+===============+====================================================+
    | No running processes found in NPU 0                                                            |
    +===========================+===============+====================================================+
    | 2       0                 | 1333928       |                          | 37709                   |

Two rows per chip, between border lines. The header's column names say which value is where, so the A3's
`Chip  Phy-ID`, the 310P's `Chip    Device` and a table without the HBM column read the same way; a row whose
values do not line up with its header is left out (the device's values are unknown, never guessed).
`-`, `NA` and `N/A` are None. `used / total` pairs come with any spacing (`3416 / 65536`, `26838/ 32768`).

Numbering (hw/accel.py): `index` is the NPU ID, `chip` the chip within it, `minor` N of /dev/davinciN, which is
also the device id hccn_tool takes: the Phy-ID where the table has one (A3: two chips per NPU, Phy-IDs 0..15),
the Device column where it has that (310P Duo: two chips per card), else the NPU ID (910B: one chip per NPU).
Memory is HBM where the table has a non-empty HBM column, else Memory-Usage (310P); a total of 0 is no such
memory. Processes come from the table at the bottom: an NPU it lists (a process row, or `No running processes
found in NPU N`) has a list for each of its chips; an NPU it does not list, or a table cut off or garbled,
leaves None: the tool did not tell, which is unmeasured, never idle.
"""

from __future__ import annotations

from .amdvalues import blank_device, bus_id, celsius, count, mib, percent, text, version, watts

HEALTH = ("OK", "Warning", "Alarm", "Critical")  # npu-smi's words, as printed; anything else is None
MAX_ID = 4095  # beyond any NPU ID, chip or davinci number: a bigger one is garbage
NO_PROCESSES = "No running processes found in NPU"


def cells(line: str) -> list[str] | None:
    """The cells of a table row (`| a | b |` -> ["a", "b"]), None for anything else."""
    line = line.strip()
    if len(line) < 2 or line[0] != "|" or line[-1] != "|":
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def blocks(text: str) -> list[tuple[list[list[str]], bool]]:
    """The table's rows in runs between border lines (`+---`, `+===`), each with whether a border closed it;
    any line that is neither a row nor a border (a prompt, a cut marker) ends a run unclosed, as the end does."""
    out: list[tuple[list[list[str]], bool]] = []
    run: list[list[str]] = []
    for line in text.splitlines():
        row = cells(line)
        if row is not None:
            run.append(row)
            continue
        if run:
            stripped = line.strip()
            out.append((run, len(stripped) > 1 and stripped[0] == "+" and stripped[-1] == "+"))
        run = []
    if run:
        out.append((run, False))
    return out


def values(cell: str) -> list[str]:
    """A cell's values, a `used / total` pair as one `used/total` (linear: no regex over the spacing)."""
    return "/".join(part.strip() for part in cell.split("/")).split()


def pair(value: str | None) -> tuple[float | None, float | None]:
    """(used, total) MB of `3525/65536`; (None, None) for `NA`, `-` or garbage."""
    if value is None or value.count("/") != 1:
        return None, None
    used, total = value.split("/")
    return mib(used), mib(total)


def ident(value) -> int | None:
    n = count(value)
    return n if n is not None and n <= MAX_ID else None


def _header(block: list[list[str]]) -> list[list[list[str]]] | None:
    """The device header's column names per row and cell, if `block` is it (NPU Name | Health ... / Chip |
    Bus-Id ...)."""
    if len(block) != 2 or len(block[0]) < 3 or len(block[0]) != len(block[1]):
        return None
    names = [[cell.split() for cell in row] for row in block]
    first, second = names
    if first[0][:2] != ["NPU", "Name"] or first[1] != ["Health"] or second[1] != ["Bus-Id"]:
        return None
    if not second[0] or second[0][0] != "Chip":
        return None
    return names


def _row_values(row: list[str], header: list[list[str]]) -> dict[str, str] | None:
    """{column name: value text} of one row under its header row; None when they do not line up."""
    if len(row) != len(header):
        return None
    out: dict[str, str] = {}
    for cell, names in zip(row, header):
        found = values(cell)
        if names[-1:] == ["Name"] and len(found) > len(names):  # a name with spaces: the rest of the cell
            found = [*found[: len(names) - 1], " ".join(found[len(names) - 1 :])]
        if len(found) != len(names):
            return None
        out.update(zip(names, found))
    return out


def _device(block: list[list[str]], header: list[list[list[str]]]) -> tuple[dict | None, str]:
    """One chip's device from its two rows, or (None, why)."""
    if len(block) != 2:
        return None, f"a chip of {len(block)} row(s), not 2"
    first, second = _row_values(block[0], header[0]), _row_values(block[1], header[1])
    if first is None or second is None:
        return None, "a row whose values do not line up with the header"
    got = {**first, **second}
    index, chip = ident(got.get("NPU")), ident(got.get("Chip"))
    if index is None or chip is None:
        return None, "a row without a readable NPU ID and chip"
    d = blank_device(index)
    d["chip"] = chip
    errors = d["errors"]
    named = next((got[k] for k in ("Phy-ID", "Device") if k in got), None)
    if named is not None:
        d["minor"] = ident(named)
    elif chip == 0:
        d["minor"] = index
    if d["minor"] is None:
        errors["minor"] = "no device number for this chip"
    d["name"] = text(got.get("Name"))
    health = got.get("Health")
    d["health"] = health if health in HEALTH else None
    if d["health"] is None:
        errors["health"] = f"not a health state npu-smi gives: {(text(health) or '')[:40]!r}"
    d["bus_id"] = bus_id(got.get("Bus-Id"))
    d["power_w"] = watts(got.get("Power(W)"))
    d["temperature_c"] = celsius(got.get("Temp(C)"))
    d["util_pct"] = percent(got.get("AICore(%)"))
    _memory(d, got)
    return d, ""


def _memory(d: dict, got: dict[str, str]) -> None:
    """HBM where the table gives it, else Memory-Usage; a total of 0 is no such memory (910B's DDR column)."""
    for key in ("HBM-Usage(MB)", "Memory-Usage(MB)"):
        used, total = pair(got.get(key))
        if used is None or total is None or total <= 0:
            continue
        if used > total:
            d["errors"]["memory"] = f"{key} used is over its total"
            return
        d["mem_used_mb"], d["mem_total_mb"] = used, total
        d["mem_util_pct"] = round(used / total * 100.0, 2)
        return


def _version_line(block: list[list[str]], out: dict) -> bool:
    """`npu-smi 24.1.rc2   Version: 24.1.rc2`: the tool's version, then the driver's."""
    if len(block) != 1 or len(block[0]) != 1:
        return False
    words = block[0][0].split()
    if len(words) != 4 or words[0] != "npu-smi" or words[2] != "Version:":
        return False
    out["tool_version"], out["driver_version"] = version(words[1]), version(words[3])
    return True


def _process_columns(row: list[str]) -> tuple[int, int] | None:
    """(pid cell, memory cell) of the process table's header (NPU Chip | Process id | ... memory(MB))."""
    if len(row) < 3 or row[0].split()[:2] != ["NPU", "Chip"]:
        return None
    pid = next((i for i, c in enumerate(row) if c == "Process id"), None)
    mem = next((i for i, c in enumerate(row) if c.startswith("Process memory")), None)
    return (pid, mem) if pid is not None and mem is not None else None


class _Processes:
    """The process table: rows per (NPU, chip), the NPUs it lists, the NPUs whose rows were unreadable, those
    whose block was not closed by a border (cut off: perhaps more rows were to come)."""

    def __init__(self, columns: tuple[int, int], width: int):
        self.pid_at, self.mem_at = columns
        self.width = width
        self.rows: dict[tuple[int, int], list[dict]] = {}
        self.listed: set[int] = set()
        self.bad: set[int] = set()
        self.cut: set[int] = set()

    def add(self, row: list[str], closed: bool) -> None:
        """One row of a block; an unclosed block (the output cut there, or garbled) makes its NPUs unknown."""
        if len(row) == 1:
            head, _, rest = row[0].partition(NO_PROCESSES)
            npu = ident(rest.strip()) if not head and rest[:1] == " " else None
            if npu is not None:
                (self.listed if closed else self.cut).add(npu)
            return
        where = row[0].split()
        npu = ident(where[0]) if where else None
        if npu is None:
            return
        if not closed:
            self.cut.add(npu)
            return
        self.listed.add(npu)
        chip = ident(where[1]) if len(where) == 2 else None
        pid = ident_pid(row[self.pid_at]) if len(row) == self.width else None
        if chip is None or pid is None:
            self.bad.add(npu)
            return
        self.rows.setdefault((npu, chip), []).append({"pid": pid, "mem_mb": mib(row[self.mem_at])})

    def give(self, devices: list[dict]) -> None:
        for d in devices:
            if d["index"] in self.bad:
                d["errors"]["processes"] = "an unreadable row in npu-smi's process table"
            elif d["index"] in self.listed and d["index"] not in self.cut:
                d["processes"] = self.rows.get((d["index"], d["chip"]), [])


def ident_pid(value: str) -> int | None:
    n = count(value)
    return n if n is not None and 0 < n < 1 << 32 else None


def parse_npu_smi_info(output: str) -> dict:
    """{"tool_version", "driver_version", "devices": [device], "errors": [why a row was left out]} of the
    text `npu-smi info` printed. Never raises; garbage gives no devices."""
    out: dict = {"tool_version": None, "driver_version": None, "devices": [], "errors": []}
    header: list[list[list[str]]] | None = None
    procs: _Processes | None = None
    seen: set[tuple[int, int]] = set()
    for block, closed in blocks(output):
        if _version_line(block, out):
            continue
        found = _header(block)
        if found is not None:
            header, procs = found, None
            continue
        columns = _process_columns(block[0])
        if columns is not None:
            procs, header = _Processes(columns, len(block[0])), None
            block = block[1:]
        if procs is not None:
            for row in block:
                procs.add(row, closed)
        elif header is not None:
            d, why = _device(block, header)
            if d is None or (d["index"], d["chip"]) in seen:
                if len(out["errors"]) < 20:
                    out["errors"].append(why or f"NPU {d['index'] if d else '?'} chip listed twice")
                continue
            seen.add((d["index"], d["chip"]))
            out["devices"].append(d)
    if procs is not None:
        procs.give(out["devices"])
    return out
