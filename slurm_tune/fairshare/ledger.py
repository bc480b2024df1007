"""The accountant's state: settled usage per association and the sacct watermark.

A job run is *settled* once it ended more than `settle_delay` ago: its charge is added to the ledger once,
decayed to the ledger's time, and its key (job id @ start) is remembered until the next read window no
longer reaches it. Runs that are still going, or ended recently, are recomputed from sacct on every run and
never stored. So a second run over the same window adds nothing, and a job whose summary lands late is
still charged with it.

The file is JSON, written atomically (temp file + rename) next to a lock that keeps two accountants apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .. import safeio
from ..errors import CorruptFileError, StuneError
from ..readback import AMOUNT_MAX, EPOCH_MAX, number, optional
from ..usage.pipeline import LEDGER_FORMAT

FORMAT = LEDGER_FORMAT  # usage/pipeline.py names the formats


class LedgerError(StuneError):
    """The ledger cannot be read, written or locked."""


@dataclass
class Ledger:
    watermark: int | None = None  # runs that ended before this are settled
    as_of: int | None = None  # time the stored usage is decayed to
    half_life_s: float | None = None  # the half-life the usage was decayed with
    usage: dict = field(default_factory=dict)  # (account, user) -> [slurm, stune], decayed to as_of
    settled: dict = field(default_factory=dict)  # run key -> end time, for runs near the read window
    path: str | None = None

    @classmethod
    def load(cls, path: str) -> Ledger:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return cls(path=path)
        except (OSError, ValueError) as exc:
            raise LedgerError(
                f"{path}: unreadable ledger: {getattr(exc, 'strerror', None) or exc} "
                f"(move it away to start over)"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise LedgerError(f"{path}: not a stune fair-share ledger (expected format {FORMAT})")
        try:
            return cls._checked(doc, path)
        except CorruptFileError as exc:  # acting on garbage would set wrong priorities on every pending job
            raise LedgerError(
                f"{exc} (the ledger is kept and nothing was changed; move it away to start over)"
            ) from None

    @classmethod
    def _checked(cls, doc: dict, path: str) -> Ledger:
        """Every value as save() writes it: times and usage finite and in range (readback's rule)."""

        def mapping(key: str) -> dict:
            value = doc.get(key, {})
            if not isinstance(value, dict):
                raise CorruptFileError(path, None, key, "is not a mapping")
            return value

        usage = {}
        for k, v in mapping("usage").items():
            if "|" not in k or not isinstance(v, list) or len(v) != 2:
                raise CorruptFileError(
                    path, None, f"usage.{k}", "is not an account|user: [slurm, stune] pair"
                )
            usage[tuple(k.split("|", 1))] = [
                float(number(x, path, f"usage.{k}[{i}]", 0.0, AMOUNT_MAX)) for i, x in enumerate(v)
            ]
        settled = {
            k: number(v, path, f"settled.{k}", -1, EPOCH_MAX, integer=True)
            for k, v in mapping("settled").items()
        }
        return cls(
            watermark=optional(doc.get("watermark"), path, "watermark", -EPOCH_MAX, EPOCH_MAX, integer=True),
            as_of=optional(doc.get("as_of"), path, "as_of", 0, EPOCH_MAX, integer=True),
            half_life_s=optional(doc.get("half_life_s"), path, "half_life_s", 0.0, EPOCH_MAX),
            usage=usage,
            settled=settled,
            path=path,
        )

    def save(self, path: str | None = None) -> None:
        path = path or self.path
        if not path:
            raise LedgerError("the ledger has no path")
        doc = {
            "format": FORMAT,
            "watermark": self.watermark,
            "as_of": self.as_of,
            "half_life_s": self.half_life_s,
            "usage": {f"{a}|{u}": v for (a, u), v in sorted(self.usage.items())},
            "settled": dict(sorted(self.settled.items())),
        }
        directory = os.path.dirname(path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            # readable by all (usage per association is what sshare shows anyone), so a user's `explain`
            # reads it instead of re-reading sacct's whole history
            safeio.write_atomic(path, json.dumps(doc, indent=1) + "\n", mode=0o644, sync=True)
        except OSError as exc:
            raise LedgerError(f"{path}: cannot write the ledger: {exc.strerror}") from None


class LedgerLock(safeio.LockFile):
    """An exclusive flock next to the ledger: a second accountant fails fast instead of double-charging."""

    def __init__(self, path: str):
        super().__init__(path + ".lock", blocking=False, holder="stune-fairshare")

    def __enter__(self) -> LedgerLock:
        try:
            super().__enter__()
        except safeio.LockBusy as exc:
            raise LedgerError(str(exc)) from None
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot lock: {exc.strerror}") from None
        return self
