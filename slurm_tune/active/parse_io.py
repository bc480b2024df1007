"""Parsers for the network and storage benchmarks' real output: perftest (ib_write_bw and friends), iperf3 -J,
fio's JSON and GNU dd. As in parse.py (the GPU tools' parsers): bytes or text in, a Reading out, by
reading.py's rules (numbers only in the tool's own notation, and only from complete output). Networks come out
in Gb/s (1e9 bits/s), disks in GB/s (1e9 bytes/s), as the tools print them.
"""

from __future__ import annotations

import json
import re

from .reading import (
    MAX_VALUE,
    Reading,
    complete_lines,
    first_error,
    json_number,
    number,
    ok,
    text_of,
    unknown,
)

# ---- perftest (ib_write_bw, ib_read_bw, ib_send_bw) -------------------------------------------------------
_PERFTEST_ERRORS = (
    "Couldn't",
    "Unable to",
    "Failed to",
    "failed to",
    "Error",
    "error:",
    "No IB devices",
    "IB device",
    "not found",
    "Conflicting port",
    "Connection refused",
)


def perftest_bw(output) -> Reading:
    """ib_write_bw's result table: BW average of the last (largest) size, in Gb/s. With the default MB/sec
    unit (perftest's MB is 2^20 bytes) the value is converted. The table must be closed by its dashed line."""
    lines = complete_lines(output)
    header_at, unit = None, None
    for i, line in enumerate(lines):
        if "BW average[" in line and "#bytes" in line:
            header_at = i
            unit = (
                "Gb/sec"
                if "BW average[Gb/sec]" in line
                else "MB/sec"
                if "BW average[MB/sec]" in line
                else None
            )
    if header_at is None:
        error = first_error(lines, _PERFTEST_ERRORS)
        return unknown(f"ib_write_bw error: {error}" if error else "no result table in the perftest output")
    if unit is None:
        return unknown("perftest result table in an unknown unit")
    last, closed = None, False
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if stripped.startswith("-----"):
            closed = True
            break
        fields = stripped.split()
        if len(fields) == 5 and fields[0].isdigit() and fields[1].isdigit():
            avg = number(fields[3])
            if avg is not None and number(fields[2]) is not None:
                last = (int(fields[0]), avg)
    if last is None:
        return unknown("perftest result table has no readable row")
    if not closed:
        return unknown("truncated perftest output (result table not closed)")
    size, avg = last
    gbps = avg if unit == "Gb/sec" else avg * 1048576 * 8 / 1e9
    return ok(round(gbps, 4), "Gb/s", f"BW average {avg:g} {unit} at {size} B")


# ---- fio --output-format=json ---------------------------------------------------------------------------
def _json_object(text: str):
    """The JSON object in a tool's output: tools print notes or errors before it (fio: 'fio: io_u error...',
    'note: ...'), so decoding starts at the first line that opens an object."""
    start = 0 if text.startswith("{") else text.find("\n{")
    if start < 0:
        return None, "no JSON object in the output"
    try:
        value, _ = json.JSONDecoder().raw_decode(text, start + (1 if text[start] == "\n" else 0))
    except (ValueError, RecursionError) as exc:
        return None, f"unreadable JSON ({str(exc)[:80]})"
    if not isinstance(value, dict):
        return None, "the JSON output is not an object"
    return value, None


def fio_json(output, direction: str = "read") -> Reading:
    """fio's JSON: the summed `bw_bytes` of `direction` over all jobs, in GB/s. A job with a non-zero
    `error` is unknown with fio's error number (the disk or the job file may be at fault)."""
    text = text_of(output)
    doc, why = _json_object(text)
    if doc is None:
        error = first_error(text.splitlines(), ("fio: ", "error"))
        return unknown(f"fio: {error}" if error else why)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        return unknown("fio JSON has no jobs")
    total, runtime = 0.0, 0
    for job in jobs:
        if not isinstance(job, dict):
            return unknown("fio JSON job is not an object")
        err = job.get("error")
        if err not in (0, None):
            return unknown(f"fio job {str(job.get('jobname'))[:40]!r} ended with error {str(err)[:20]}")
        part = job.get(direction)
        if not isinstance(part, dict):
            return unknown(f"fio JSON job has no {direction} section")
        bw = json_number(part.get("bw_bytes"))
        if bw is None:
            kib = json_number(part.get("bw"))  # fio before 3.5 reports KiB/s only
            bw = kib * 1024 if kib is not None else None
        if bw is None:
            return unknown(f"fio JSON job has no readable {direction} bandwidth")
        total += bw
        rt = part.get("runtime")
        runtime += rt if type(rt) is int and rt > 0 else 0
    if runtime == 0:
        return unknown(f"fio did no {direction} I/O (runtime 0)")
    version = doc.get("fio version")
    extra = {"fio": version[:40]} if isinstance(version, str) else {}
    gbs = total / 1e9
    return ok(round(gbs, 6), "GB/s", f"{direction} {gbs:.3f} GB/s over {len(jobs)} job(s)", **extra)


# ---- dd (GNU coreutils) ---------------------------------------------------------------------------------
_DD_COPIED = re.compile(r"^([0-9]{1,20}) bytes? (?:\([^)]*\) )?copied, ([0-9.,eE+-]{1,20}) s, ")


def dd(output) -> Reading:
    """GNU dd's summary (`N bytes (...) copied, S s, R GB/s`): bytes / seconds, in GB/s, computed from the
    exact byte count rather than dd's rounded rate. A `dd:` error line is unknown."""
    text = text_of(output).replace("\r", "\n")
    lines = text.splitlines()
    error = next((line.strip()[:200] for line in lines if line.startswith("dd: ")), None)
    if error:
        return unknown(error)
    found = None
    for line in lines:
        m = _DD_COPIED.match(line.strip())
        if m:
            found = m
    records_out = any(line.strip().endswith("records out") for line in lines)
    if found is None or not records_out:
        return unknown("no dd summary in the output" if found is None else "truncated dd output")
    nbytes = int(found.group(1))
    seconds = number(found.group(2).replace(",", "."), exponent=True)
    if not seconds or nbytes == 0:
        return unknown("dd copied nothing or took no time")
    gbs = nbytes / seconds / 1e9
    if gbs > MAX_VALUE:
        return unknown("dd rate out of range")
    return ok(round(gbs, 6), "GB/s", f"{nbytes} bytes in {seconds:g} s")


# ---- iperf3 -J ----------------------------------------------------------------------------------------
def iperf3_json(output) -> Reading:
    """iperf3's JSON: the receiver's rate (end.sum_received, or end.sum for UDP) in Gb/s. An `error` member
    (no server, connection refused) is unknown."""
    doc, why = _json_object(text_of(output))
    if doc is None:
        return unknown(why)
    if isinstance(doc.get("error"), str):
        return unknown(f"iperf3: {doc['error'][:200]}")
    end = doc.get("end")
    if not isinstance(end, dict):
        return unknown("iperf3 JSON has no end summary (interrupted run)")
    part = end.get("sum_received") if isinstance(end.get("sum_received"), dict) else end.get("sum")
    if not isinstance(part, dict):
        return unknown("iperf3 JSON has no receiver summary")
    bps = json_number(part.get("bits_per_second"))
    seconds = json_number(part.get("seconds"))
    if bps is None:
        return unknown("iperf3 receiver rate unreadable")
    if seconds is not None and seconds == 0:
        return unknown("iperf3 measured for 0 seconds")
    start = doc.get("start") if isinstance(doc.get("start"), dict) else {}
    version = start.get("version")
    extra = {"iperf3": version[:40]} if isinstance(version, str) else {}
    gbps = bps / 1e9
    return ok(round(gbps, 6), "Gb/s", f"received {gbps:.3f} Gb/s", **extra)
