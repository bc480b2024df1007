"""Every active-check result, with its version fingerprint: one JSON line each, appended to
`<store>/results/<partition>/<YYYY-MM>.jsonl` (a month per file keeps the judge's read small: it reads only
the months inside `active.window`). The store is root's: files are opened without following links and
read with a size bound; a line that does not parse is skipped, never trusted.

(The validation layers' and the scaling curves' records share the layout, under `validate/` and `scaling/`
instead of `results/`: append and load with `kind`.)

A result: {at, sweep, partition, check, subject (node, or "a+b" for a pair), nodes, hca, run, status, value,
unit, detail, fingerprint: {driver, cuda, nccl, hca_fw, kernel[, vendor, <the vendor's parts>]}, job}.

The fingerprint of an AMD or Ascend node also names its vendor and that vendor's version matrix (VENDOR_PARTS:
Ascend's NPU driver, NPU firmware and CANN; AMD's ROCm and amdgpu driver; `nccl` holds RCCL's version there),
so its results never join an NVIDIA baseline. An NVIDIA fingerprint has no vendor (results stored before
there were others have none either): its key is what it always was, so old and new NVIDIA results still
compare.
"""

from __future__ import annotations

import json
import json.scanner
import os
import time

from .. import safeio
from ..errors import CorruptFileError
from ..output import compact_json
from ..readback import EPOCH_MAX, number, problem

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_DIR = "/var/lib/stune/active"
MAX_FILE_BYTES = 256 << 20
BASE_KEYS = ("driver", "cuda", "nccl", "hca_fw", "kernel")
VENDOR_PARTS = {"ascend": ("npu_driver", "npu_firmware", "cann"), "amd": ("rocm", "amdgpu_driver")}
FINGERPRINT_KEYS = (*BASE_KEYS, "vendor", *(k for parts in VENDOR_PARTS.values() for k in parts))
VALUE_MAX = 1e15  # a measured value (GB/s, ms, TFLOP/s): anything bigger is garbage


def store_dir(text: str | None = None, environ=None) -> str:
    environ = os.environ if environ is None else environ
    return text or environ.get("STUNE_ACTIVE_DIR") or DEFAULT_DIR


def _month(at: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(at))


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "_"


# The record streams under the store, each `<store>/<kind>/<partition>/<YYYY-MM>.jsonl`: the checks' results
# (this module's), the validation layers' (slurm_tune/validate) and the scaling curves (active/scaling.py).
KINDS = ("results", "validate", "scaling")


def partition_dir(store: str, partition: str, kind: str = "results") -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}")
    return os.path.join(store, kind, _safe_name(partition))


def append(store: str, partition: str, results: list[dict], kind: str = "results") -> None:
    """Append records (one partition; each with its `at`) to their month's file, all of them or none
    (safeio.append_whole): FileWriteError naming the file when the disk is full."""
    directory = partition_dir(store, partition, kind)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    by_month: dict[str, list[str]] = {}
    for r in results:
        by_month.setdefault(_month(r["at"]), []).append(compact_json(r) + "\n")
    for month, lines in by_month.items():
        path = os.path.join(directory, f"{month}.jsonl")
        try:
            fd = safeio.open_append(path, create_mode=0o644)
        except OSError as exc:
            raise safeio.FileWriteError(path, exc) from None
        try:  # whole lines or nothing (a full disk cuts nothing in half): concurrent sweeps never interleave
            safeio.append_whole(fd, "".join(lines).encode(), path)
        finally:
            os.close(fd)


def months_between(since: float, until: float) -> list[str]:
    out: list[str] = []
    t = since
    while True:
        m = _month(t)
        if not out or out[-1] != m:
            out.append(m)
        if m == _month(until):
            return out
        t += 27 * 86400


def load(
    store: str,
    partition: str,
    since: float = 0.0,
    until: float | None = None,
    kind: str = "results",
    accept: Callable[[object], bool] | None = None,
) -> list[dict]:
    """Records of a partition at or after `since`, oldest first. Unreadable lines, and lines `accept` (for
    the checks' results: `valid`) refuses, are skipped."""
    until = time.time() if until is None else until
    accept = valid if accept is None else accept
    directory = partition_dir(store, partition, kind)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    if since > 0:
        wanted = {f"{m}.jsonl" for m in months_between(since, until)}
        names = [n for n in names if n in wanted]
    out = []
    for name in names:
        try:
            fd = safeio.open_file(os.path.join(directory, name))
        except (OSError, safeio.UnsafePathError):
            continue
        try:
            data = safeio.read_bounded(fd, MAX_FILE_BYTES)
        finally:
            os.close(fd)
        if data is None:
            continue
        shared = None
        for r in _lines(data):
            fp = r.get("fingerprint") if isinstance(r, dict) else None
            if (
                fp is not shared and fp == shared
            ):  # one object per run of equal fingerprints: see fingerprint_key
                r["fingerprint"] = fp = shared
            shared = fp
            if accept(r) and not problem(r.get("at"), 0, EPOCH_MAX) and r["at"] >= since:
                out.append(r)
    out.sort(key=lambda r: r["at"])
    return out


def _lines(data: bytes):
    """Each line's JSON value, as json.loads(line) would give it; lines that do not parse are skipped. The C
    scanner reads the text in place (a third faster than json.loads per line); a line it does not take whole
    (leading blanks, an error) gets json.loads' own answer."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # line by line: the bad bytes cost only their own line
        for line in data.split(b"\n"):
            value = _loads(line)
            if value is not _SKIP:
                yield value
        return
    pos, size = 0, len(text)
    while pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end
        if end > pos:
            try:
                value, stop = _SCAN(text, pos)
            except (StopIteration, ValueError, RecursionError):
                stop = -1
            if stop != end:
                value = _loads(text[pos:end])
            if value is not _SKIP:
                yield value
        pos = end + 1


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed: the decoder is what it takes)
_SKIP = object()


def _loads(line):
    if not line.strip():
        return _SKIP
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _SKIP


def valid(r) -> bool:
    """A result stune could have written: its time and value finite and in range (readback's rule)."""
    if not isinstance(r, dict):
        return False
    if (
        problem(r.get("at"), 0, EPOCH_MAX)
        or not isinstance(r.get("check"), str)
        or not isinstance(r.get("subject"), str)
        or r.get("status") not in ("ok", "fail", "unknown", "unavailable")
    ):
        return False
    v = r.get("value")
    if v is not None and problem(v, 0, VALUE_MAX):
        return False
    return fingerprint_ok(r.get("fingerprint"))


# A partition's records carry a handful of distinct fingerprints: their check and key are remembered by the
# parts' values (tuple(map(...)) runs in C: judging 1000 nodes' results reads ~40,000 of them, issue 27).
_MEMO_MAX = 4096
_FP_OK: dict = {}
_FP_KEY: dict = {}
# The last fingerprint object seen, and its answer: load() gives a run of equal fingerprints one shared
# object, so most records are answered by identity (stune never changes a record's fingerprint in place).
_LAST_OK: list = [None, None]
_LAST_KEY: list = [None, None]


def fingerprint_ok(fp) -> bool:
    """A fingerprint whose parts are strings (or absent)."""
    if not isinstance(fp, dict):
        return False
    if fp is _LAST_OK[0]:
        return _LAST_OK[1]
    memo = tuple(map(fp.get, FINGERPRINT_KEYS))
    try:
        ok = _FP_OK.get(memo)
    except TypeError:  # an unhashable part: not a string either
        return False
    if ok is None:
        ok = all(v is None or isinstance(v, str) for v in memo)
        if len(_FP_OK) < _MEMO_MAX:
            _FP_OK[memo] = ok
    _LAST_OK[:] = fp, ok
    return ok


def vendor_of(fp: dict) -> str:
    """The accelerator a fingerprint was taken on: nvidia when it names none (every result before issue 26)."""
    vendor = fp.get("vendor")
    return vendor if isinstance(vendor, str) and vendor else "nvidia"


def fingerprint_key(fp: dict) -> str:
    """One baseline per key: the base versions, then (AMD, Ascend) the vendor and its parts. An NVIDIA
    fingerprint, old or new, keys as it always did. (Remembered by the parts' values, which are strings in
    every record `fingerprint_ok` accepts.)"""
    if fp is _LAST_KEY[0]:
        return _LAST_KEY[1]
    memo = tuple(map(fp.get, FINGERPRINT_KEYS))
    try:
        key = _FP_KEY.get(memo)
    except TypeError:
        return _fingerprint_key(fp)
    if key is None:
        key = _fingerprint_key(fp)
        if len(_FP_KEY) < _MEMO_MAX:
            _FP_KEY[memo] = key
    _LAST_KEY[:] = fp, key
    return key


def _fingerprint_key(fp: dict) -> str:
    key = " ".join(f"{k}={fp.get(k) or '?'}" for k in BASE_KEYS)
    vendor = vendor_of(fp)
    if vendor == "nvidia":
        return key
    parts = VENDOR_PARTS.get(vendor, ())
    return f"{key} vendor={vendor}" + "".join(f" {k}={fp.get(k) or '?'}" for k in parts)


class SweepLock(safeio.LockFile):
    """One sweep (or judge) per partition at a time: an flock on `<store>/<partition>.lock`, not waited for
    (LockBusy: "another sweep of this partition is running")."""

    def __init__(self, store: str, partition: str):
        super().__init__(
            os.path.join(store, f"{_safe_name(partition)}.lock"),
            blocking=False,
            holder="sweep of this partition",
        )


# Every time a mark holds, as a path of keys: its own, and those health/apply.py writes into it when the sweep
# drains (applied.*) or reads from the hooks (hook_fail.at).
MARK_TIMES = (
    ("at",),
    ("synced_at",),
    ("retry_at",),
    ("applied", "synced_at"),
    ("applied", "retry_at"),
    ("hook_fail", "at"),
)


def read_state(store: str) -> dict:
    """The marks the sweeps made ({} when there is no state yet). A state file that is not JSON, or holds a
    time stune never writes (NaN, inf, out of range), is refused with CorruptFileError naming the file and
    the key, and kept: marks are what the next sweep clears or keeps, never guessed."""
    path = os.path.join(store, "state.json")
    try:
        with open(path, "rb") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptFileError(
            path,
            None,
            "",
            f"unreadable: {getattr(exc, 'strerror', None) or exc} (the file "
            "is kept; move it away to start over)",
        ) from None
    if not isinstance(data, dict):
        raise CorruptFileError(
            path, None, "", "not a stune sweep state (the file is kept; move it away to start over)"
        )
    marks = data.get("marks")
    for node, mark in marks.items() if isinstance(marks, dict) else ():
        for keys in MARK_TIMES:
            value = mark
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                number(value, path, f"marks.{node}.{'.'.join(keys)}", 0, EPOCH_MAX)
    return data


def write_state(store: str, state: dict) -> None:
    os.makedirs(store, mode=0o755, exist_ok=True)
    safeio.write_atomic(os.path.join(store, "state.json"), compact_json(state))
