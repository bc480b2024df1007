"""Layer 3 stays the user's: `stune-validate report` records the verdict of a full training run on the
partition (who, when, the metrics and a note), so the acceptance page can show it beside layers 1 and 2.
The record carries the fingerprint of the partition's newest layer-1 or layer-2 record (the stack as last
validated when the verdict was given), or none.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import time

from ..active import store
from ..errors import StuneError
from .records import latest, valid_record

FILE_MAX = 4 << 20


def _metric(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name.strip() or not math.isfinite(number):
        raise StuneError(f"--metric {text!r}: give name=number (e.g. --metric eval_loss=1.93)")
    return name.strip(), number


def _file_metrics(path: str) -> dict:
    """The numbers of a JSON object (at its top level and under `metrics`), by name."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(FILE_MAX + 1)
    except OSError as exc:
        raise StuneError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > FILE_MAX:
        raise StuneError(f"{path}: over {FILE_MAX >> 20} MiB; give the metrics that matter with --metric")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise StuneError(f"{path}: line {exc.lineno}: not JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise StuneError(f"{path}: not JSON: {str(exc)[:100]}") from None
    if not isinstance(doc, dict):
        raise StuneError(f'{path}: not a JSON object (give {{"name": number, ...}})')
    out = {}
    nested = doc.get("metrics")
    for source in (doc, nested if isinstance(nested, dict) else {}):
        for k, v in source.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[str(k)[:80]] = float(v)
    return out


def record(
    partition: str,
    verdict: str,
    metrics: list[str],
    note: str,
    file: str | None,
    directory: str,
    store_it: bool = True,
) -> dict:
    values = _file_metrics(file) if file else {}
    values.update(_metric(m) for m in metrics)
    stored = store.load(directory, partition, kind="validate", accept=valid_record)
    last = max(
        (r for r in (latest(stored, "ops"), latest(stored, "converge")) if r is not None),
        key=lambda r: r["at"],
        default=None,
    )
    r = {
        "at": round(time.time(), 3),
        "partition": partition,
        "layer": "training",
        "node": "",
        "job": "",
        "status": verdict,
        "detail": note[:2000],
        "fingerprint": dict(last["fingerprint"]) if last else {},
        "verdict": verdict,
        "metrics": values,
        "note": note[:2000],
        "by": os.environ.get("SUDO_USER") or getpass.getuser(),
    }
    if file:
        r["file"] = os.path.abspath(file)
    if store_it:
        store.append(directory, partition, [r], kind="validate")
    return r
