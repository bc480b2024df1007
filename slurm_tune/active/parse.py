"""Parsers for the benchmark tools' real output formats. One function per tool: bytes or text in, a Reading out.

A Reading is `ok` with a number, `fail` when the tool itself reports a wrong result (nccl-tests' #wrong or
out-of-bounds count, a dcgmi diag Fail), `unavailable` when what the tool needs is not installed (as for a
missing tool), or `unknown` with the reason: an error message, a truncated run, a format nobody recognises.
Garbage never becomes a number: numbers are accepted only in the tool's own notation (digits, one decimal
point), finite and below a sanity bound, and only from a complete output (its closing line seen), so a run cut
by the time limit is unknown, not slow.

Units: bandwidths come out in GB/s (1e9 bytes/s) for GPUs and disks, Gb/s (1e9 bits/s) for networks, as the
tools print them.

What a Reading is, and the rules for numbers and cut output, live in reading.py. This module holds the
parsers of the GPU tools (nccl-tests and rccl-tests, nvbandwidth, dcgmi diag, the numeric consistency check);
parse_accel.py Ascend's HCCL Test; parse_io.py those of the network and storage tools (perftest, iperf3, fio,
dd). PARSERS names them all by tool.
"""

from __future__ import annotations

import re

from ..comm.prefix import strip_wrappers
from . import parse_accel, parse_io
from .reading import (
    NUMBER,
    OK,
    Reading,
    complete_lines,
    fail,
    first_error,
    number,
    ok,
    unavailable,
    unknown,
)

# ---- nccl-tests (all_reduce_perf and friends) -------------------------------------------------------------
_NCCL_ERRORS = (
    "Test NCCL failure",
    "Test CUDA failure",
    "NCCL WARN",
    "NCCL error",
    "Test failure",
    "unhandled system error",
    "unhandled cuda error",
    "srun: error",
    "mpirun noticed",
    "cudaErrorNoDevice",
    "no CUDA-capable device",
    "hipErrorNoDevice",
    "Test HIP failure",
)
# Warnings RCCL prints on healthy runs (NCCL_DEBUG=WARN or INFO): not a reason to doubt the table.
_NCCL_BENIGN = ("Cannot enable MSCCL++",)
_NCCL_VERSION = re.compile(r"NCCL version ([0-9]+\.[0-9]+\.[0-9]+)(?:\+cuda([0-9]+\.[0-9]+))?")
_NCCL_TESTS_VERSION = re.compile(r"nccl-library=([0-9]{4,6})")
# RCCL: its banner `RCCL version : 2.21.5-HEAD:9a0e6a1` (NCCL_DEBUG=INFO) or NCCL_DEBUG=VERSION's
# `RCCL version 2.18.3+hip6.0 HEAD:...`; the banner's `ROCm version : 6.3.3.0-74-cbc70b5`.
_RCCL_VERSION = re.compile(
    r"RCCL version :? ?([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})(?:\+hip([0-9]{1,3}\.[0-9]{1,3}))?"
)
_ROCM_VERSION = re.compile(r"ROCm version : ([0-9]{1,3}(?:\.[0-9]{1,5}){1,3})")


def _nccl_lib_version(code: str) -> str:
    """nccl-tests prints the library as an integer: 21903 -> 2.19.3 (major*10000 + minor*100 + patch)."""
    n = int(code)
    return (
        f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
        if n >= 20900
        else f"{n // 1000}.{n % 1000 // 100}.{n % 100}"
    )


def nccl_tests(output) -> Reading:
    """all_reduce_perf's table (nccl-tests, and rccl-tests, which prints the same): the bus bandwidth (GB/s)
    at the largest message size, the better of out-of-place and in-place. A non-zero #wrong or out-of-bounds
    count fails; no closing `# Avg bus bandwidth` line (a run cut short, a crash) is unknown. Launchers'
    line labels (srun --label's ` 0: `) are read through; the old layout's `error` column (a float such as
    4e-07, rccl929) is no count: its out-of-bounds line says whether values were wrong."""
    lines = [strip_wrappers(line) for line in complete_lines(output)]  # srun --label, mpirun's [1,0]<stdout>:
    extra = _rccl_versions(lines)
    for line in lines:
        if "nccl" in extra:
            break
        m = _NCCL_VERSION.search(line)
        if m:
            extra["nccl"] = m.group(1)
            if m.group(2):
                extra["cuda"] = m.group(2)
            break
        m = _NCCL_TESTS_VERSION.search(line)
        if m:
            extra["nccl"] = _nccl_lib_version(m.group(1))
            break
    ranks = sum(1 for line in lines if line.startswith(("#  Rank", "#   Rank")))
    if ranks:
        extra["ranks"] = ranks
    rows, wrong, avg, oob = [], 0, None, None
    for stripped in lines:
        if stripped.startswith("# Avg bus bandwidth"):
            avg = number(stripped.rpartition(":")[2].strip())
            continue
        if stripped.startswith("# Out of bounds values"):
            value = stripped.rpartition(":")[2].split()
            oob = int(value[0]) if value and value[0].isdigit() and len(value[0]) < 12 else None
            continue
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong  (root is absent
        # in releases before 2.10; all_gather/alltoall print no redop/root but the tail is the same)
        if len(fields) < 10 or not fields[0].isdigit() or len(fields[0]) > 20:
            continue
        tail = fields[-8:]
        out_of_place, in_place = number(tail[2]), number(tail[6])
        algbws = [number(tail[1]), number(tail[5])]
        wrongs = [tail[3], tail[7]]
        if out_of_place is None or in_place is None or not all(map(_wrong_column, wrongs)):
            continue
        # algbw: a 1-rank run's only figure (its busbw is 0 by nccl-tests' definition: scaling.py)
        rows.append((int(fields[0]), max(out_of_place, in_place), max(a or 0.0 for a in algbws)))
        wrong += sum(int(w) for w in wrongs if w.isdigit() and len(w) < 12)
    error = first_error((x for x in lines if not any(b in x for b in _NCCL_BENIGN)), _NCCL_ERRORS)
    if wrong:
        return fail(f"{wrong} wrong results (data corruption on a collective)", **extra)
    if oob:
        return fail(f"{oob} out-of-bounds values (data corruption on a collective)", **extra)
    if error:
        return unknown(f"nccl-tests error: {error}", **extra)
    if not rows:
        return unknown("no result rows in the nccl-tests output", **extra)
    if avg is None:
        return unknown(f"truncated nccl-tests output ({len(rows)} rows, no closing average line)", **extra)
    size, best, algbw = max(rows)
    extra["avg_busbw"] = avg
    extra["size"] = size
    extra["algbw"] = algbw
    return ok(best, "GB/s", f"busbw {best:g} GB/s at {size} B (average {avg:g})", **extra)


def _wrong_column(token: str) -> bool:
    """A #wrong count (digits), N/A (no check), or the old layout's `error` column (4e-07: a float)."""
    return token.isdigit() or token == "N/A" or ("e" in token and number(token, exponent=True) is not None)


def _rccl_versions(lines: list[str]) -> dict:
    """RCCL's own version (as `nccl`: the collective library, and `rccl`) and ROCm's, from its banner."""
    out: dict = {}
    for line in lines:
        m = _RCCL_VERSION.search(line)
        if m and "nccl" not in out:
            out["nccl"] = out["rccl"] = m.group(1)
            if m.group(2):
                out["hip"] = m.group(2)
        m = _ROCM_VERSION.search(line)
        if m and "rocm" not in out:
            out["rocm"] = m.group(1)
    return out


# ---- nvbandwidth ---------------------------------------------------------------------------------------
def nvbandwidth(output, test: str = "host_to_device_memcpy_ce") -> Reading:
    """nvbandwidth's `SUM <test> <GB/s>` line for `test`, with the slowest entry of that test's matrix
    (the GPU at fault) in extra. A waived test, a CUDA error or a missing SUM line is unknown."""
    lines = complete_lines(output)
    sums: dict[str, float] = {}
    matrix: dict[str, list[tuple[str, float | None]]] = {}
    current: str | None = None
    extra: dict[str, object] = {}
    columns_next = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("Running ") and stripped.endswith("."):
            current = stripped[len("Running ") : -1]
            matrix[current] = []
            continue
        if stripped.startswith("SUM "):
            fields = stripped.split()
            total = number(fields[2]) if len(fields) == 3 else None
            if total is not None:
                sums[fields[1]] = total
            current = None
            continue
        if stripped.startswith("Driver Version:"):
            extra["driver"] = stripped.partition(":")[2].strip()[:40]
        elif stripped.startswith(("CUDA Driver Version", "CUDA Runtime Version")) and "cuda" not in extra:
            value = stripped.partition(":")[2].strip().split()
            if value and value[0].isdigit() and len(value[0]) == 5:  # 12040 -> 12.4
                extra["cuda"] = f"{int(value[0]) // 1000}.{int(value[0]) % 1000 // 10}"
            elif value and NUMBER.match(value[0]):
                extra["cuda"] = value[0]
        if current is not None:
            fields = stripped.split()
            if stripped.endswith("bandwidth (GB/s)"):
                columns_next = True
                continue
            if columns_next:  # the column header: GPU indices, not bandwidths
                columns_next = False
                continue
            if len(fields) >= 2 and fields[0].isdigit():
                matrix[current].extend(
                    (f"{fields[0]}->{col}", number(v)) for col, v in enumerate(fields[1:]) if v != "N/A"
                )
    if test not in sums:
        if test in matrix and any("Waived" in line for line in lines):
            return unknown(f"nvbandwidth waived {test}", **extra)
        error = first_error(lines, ("CUDA_ERROR", "cuda error", "Error", "error", "terminate called"))
        return unknown(f"nvbandwidth: {error}" if error else f"no SUM line for {test}", **extra)
    cells = [(where, gbps) for where, gbps in matrix.get(test, []) if gbps is not None]
    if cells:
        where, slowest = min(cells, key=lambda c: c[1])
        extra.update(slowest=slowest, slowest_at=where)
    extra["sums"] = sums
    return ok(
        sums[test],
        "GB/s",
        f"{test} {sums[test]:g} GB/s"
        + (f" (slowest {extra['slowest']:g} at {extra['slowest_at']})" if cells else ""),
        **extra,
    )


# ---- dcgmi diag ------------------------------------------------------------------------------------------
_DCGM_SECTIONS = ("Metadata", "Deployment", "Integration", "Hardware", "Stress")
_DCGM_NOTES = ("Error", "Warning", "Info")


def _dcgm_unwrap(cells: list[str]) -> str:
    """One value DCGM spread over rows, from the raw cells (between the bars, unstripped). DCGM 3.x cuts a
    long value into fixed pieces, 45 characters in a 48-wide cell (a space, the piece, two spaces of padding),
    in the middle of words and keeping spaces at a piece's ends ("...disab" + "led.", "currently " +
    " disabled"): those pieces are joined as they are. Older DCGM wrapped at words (a row ends anywhere
    short of the padding): those rows are joined with a space."""
    width = len(cells[0])
    pieces = cells[:-1]
    cut = len(cells) > 1 and all(
        len(c) == width and c.startswith(" ") and c.endswith("  ") and len(c.rstrip()) >= width - 4
        for c in pieces
    )
    if cut:
        text = "".join(c[1 : width - 2] for c in pieces) + cells[-1][1:]
    else:
        text = " ".join(c.strip() for c in cells)
    return " ".join(text.split())


def dcgmi_diag(output) -> Reading:
    """dcgmi diag's table (DCGM 2.x to 4.x): any test whose result starts with Fail fails, with the test and
    what DCGM said about it (its Error, Warning and Info rows, each unwrapped); all Pass/Skip is ok. The table
    must be complete (closing border after the rows)."""
    lines = complete_lines(output)
    tests: list[tuple[str, str, list[list[str]]]] = []
    last: tuple[str, str, list[list[str]]] | None = None
    closed, extra = False, {}
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("+---"):  # a border; only a plain one (no section name) closes the table
            if tests and not stripped.strip("+-= "):
                closed = True
            continue
        if not (stripped.startswith("|") and stripped.endswith("|")):
            continue
        if stripped.startswith("|-----"):  # a section border
            continue
        raw = stripped[1:-1].split("|")
        if len(raw) != 2:
            continue
        name, result = raw[0].strip(), raw[1].strip()
        closed = False
        if name in ("Diagnostic",) and result == "Result":
            continue
        if name == "Driver Version Detected":
            extra["driver"] = result[:40]
            continue
        if name in ("DCGM Version", "GPU Device IDs Detected", "Number of GPUs") or name.endswith("Detected"):
            continue
        if name in _DCGM_NOTES or name.startswith(tuple(n + ":" for n in _DCGM_NOTES)):
            if last is not None:
                last[2].append([raw[1]])  # a note of its own: Error / Warning: GPU 3 / Info
            continue
        if not name:
            if last is not None and result:
                last[2][-1].append(raw[1])  # a continuation of the test's result or of its latest note
            continue
        word = result.split(" ", 1)[0].split("-", 1)[0].strip().lower()
        if word not in ("pass", "fail", "skip", "warn", "skipped"):
            continue
        last = (name, word, [[raw[1]]])
        tests.append(last)
    if not tests:
        error = first_error(lines, ("Error", "error", "Unable", "not found", "Failed"))
        return unknown(f"dcgmi: {error}" if error else "no diagnostic results in the dcgmi output", **extra)
    if not closed:
        return unknown("truncated dcgmi diag output (table not closed)", **extra)
    failed = [t for t in tests if t[1] == "fail"]
    if failed:
        name, _, parts = failed[0]
        notes = [_dcgm_unwrap(p) for p in parts]
        why = "; ".join(n for n in notes[1:] if n)[:160] or notes[0][:160]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return fail(f"dcgmi diag {name}: {why}{more}", **extra, failed=[t[0] for t in failed])
    return Reading(
        OK, None, "", f"dcgmi diag: {len(tests)} tests pass or skip", dict(extra, tests=len(tests))
    )


# ---- numeric consistency (slurm_tune.active.numeric) -------------------------------------------------------
def numeric(output) -> Reading:
    """Every GPU's digest of the same seeded matmul: a GPU whose digest differs from the majority fails. The
    closing `done N` line must match the device lines; fewer than two devices cannot be compared (unknown)."""
    lines = complete_lines(output)
    devices, done, why, missing = {}, None, None, None
    for line in lines:
        fields = line.split()
        if line.startswith("stune-numeric unavailable:"):
            missing = line.partition(":")[2].strip()[:160]
        elif line.startswith("stune-numeric unknown:"):
            why = line.partition(":")[2].strip()[:160]
        elif (
            len(fields) >= 5
            and fields[0] == "device"
            and fields[1].isdigit()
            and fields[-2] == "sha256"
            and len(fields[-1]) == 64
            and all(c in "0123456789abcdef" for c in fields[-1])
        ):
            devices[int(fields[1])] = (" ".join(fields[2:-2])[:60], fields[-1])
        elif len(fields) == 3 and fields[:2] == ["stune-numeric", "done"] and fields[2].isdigit():
            done = int(fields[2])
    if missing:
        return unavailable(
            f"{missing}: install PyTorch or CuPy for the Python running stune (or set "
            "active.tools.python to one that has them)"
        )
    if why:
        return unknown(f"numeric check not run: {why}")
    if done is None or done != len(devices):
        return unknown("truncated numeric-consistency output")
    if len(devices) < 2:
        return unknown(f"{len(devices)} GPU: nothing to compare with")
    counts: dict = {}
    for _, digest in devices.values():
        counts[digest] = counts.get(digest, 0) + 1
    majority, votes = max(counts.items(), key=lambda kv: kv[1])
    if votes * 2 <= len(devices):
        return fail(f"no majority among {len(devices)} GPUs' results ({len(counts)} different)")
    odd = sorted(i for i, (_, d) in devices.items() if d != majority)
    if odd:
        return fail(
            f"GPU {','.join(map(str, odd))} ({devices[odd[0]][0]}) computed a different result than the "
            f"other {votes} (silent data corruption)",
            gpus=odd,
        )
    return Reading(OK, None, "", f"{len(devices)} GPUs agree bit for bit", {"devices": len(devices)})


PARSERS = {
    "nccl-tests": nccl_tests,
    "perftest": parse_io.perftest_bw,
    "fio": parse_io.fio_json,
    "dd": parse_io.dd,
    "iperf3": parse_io.iperf3_json,
    "nvbandwidth": nvbandwidth,
    "dcgmi": dcgmi_diag,
    "numeric": numeric,
    "hccl_test": parse_accel.hccl_test,
}
