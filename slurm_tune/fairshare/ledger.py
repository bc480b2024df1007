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
from ..errors import StuneError

FORMAT = "stune-fairshare-ledger/1"


class LedgerError(StuneError):
    """The ledger cannot be read, written or locked."""


@dataclass
class Ledger:
    watermark: int | None = None      # runs that ended before this are settled
    as_of: int | None = None          # time the stored usage is decayed to
    half_life_s: float | None = None  # the half-life the usage was decayed with
    usage: dict = field(default_factory=dict)    # (account, user) -> [slurm, stune], decayed to as_of
    settled: dict = field(default_factory=dict)  # run key -> end time, for runs near the read window
    path: str | None = None

    @classmethod
    def load(cls, path: str) -> "Ledger":
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return cls(path=path)
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{path}: unreadable ledger: {getattr(exc, 'strerror', None) or exc} "
                              f"(move it away to start over)") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise LedgerError(f"{path}: not a stune fair-share ledger (expected format {FORMAT})")
        usage = {tuple(k.split("|", 1)): [float(v[0]), float(v[1])] for k, v in doc.get("usage", {}).items()}
        return cls(watermark=doc.get("watermark"), as_of=doc.get("as_of"), half_life_s=doc.get("half_life_s"),
                   usage=usage, settled={k: int(v) for k, v in doc.get("settled", {}).items()}, path=path)

    def save(self, path: str | None = None) -> None:
        path = path or self.path
        if not path:
            raise LedgerError("the ledger has no path")
        doc = {"format": FORMAT, "watermark": self.watermark, "as_of": self.as_of, "half_life_s": self.half_life_s,
               "usage": {f"{a}|{u}": v for (a, u), v in sorted(self.usage.items())},
               "settled": dict(sorted(self.settled.items()))}
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

    def __enter__(self) -> "LedgerLock":
        try:
            super().__enter__()
        except safeio.LockBusy as exc:
            raise LedgerError(str(exc)) from None
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot lock: {exc.strerror}") from None
        return self
