"""The cache tier's on-disk layout: its names, the formats of entries, ledger rows and stamps, and keys.

Under the tier root (see docs/stage.md):

    ROOT/                     root-owned, mode 1777 (sticky, like /tmp): `stune-stage init` makes it
    ROOT/.ledger/             root-owned, 1777: one file per entry, "<uid>.<entry>", owned by the entry's
                              user; content "<bytes> ready|pending <pid>" (a claim: see Tier.ledger); its
                              mtime is the entry's last use
    ROOT/.quarantine/         root-only: bad namespaces `init` moved aside (Tier.repair_namespace)
    ROOT/<user>/              the user's namespace, mode 0700, owned by the user (namespace.py)
        entries/<key>.<gen>/  a published entry: `stamp` (what was copied, and from which source state) and
                              `data/` (the copy, read-only); <key> identifies the source path, <gen> the copy
        tmp/                  copies in progress and entries being deleted (same filesystem: rename)
        locks/<key>           flock(2) files, one per source; the kernel drops a dead stager's lock
        holds/<jobid>/<entry> a running job uses <entry>: never evicted while the file exists

On the TaskProlog and epilog paths: imports only collections and time (and safeio) up front.
"""

from __future__ import annotations

import time
from collections import namedtuple

from .. import safeio
from ..readback import parse

try:
    from _blake2 import blake2b  # builtin: hashlib would load OpenSSL
except ImportError:  # pragma: no cover - CPython always has it
    from hashlib import blake2b

LEDGER = ".ledger"
QUARANTINE = ".quarantine"  # bad namespaces moved aside by root (root-only, for the admin to inspect)
ENTRIES, TMP, LOCKS, HOLDS = "entries", "tmp", "locks", "holds"
STAMP, DATA = "stamp", "data"
ROW_MAX_DIGITS = 19  # a ledger size has at most this many digits (below 2**63)
NS_SUBDIRS = (ENTRIES, TMP, LOCKS, HOLDS)
_HEX = frozenset("0123456789abcdef")


STAMP_NUMBERS = (("bytes", True), ("files", True), ("published", False))  # (key, integer) in a stamp
Entry = namedtuple("Entry", "name key gen")
LedgerRow = namedtuple("LedgerRow", "uid entry bytes state last_use")


def parse_row(text: str, limit: int) -> tuple[int, str] | None:
    """(bytes, state) of a ledger row "<bytes> ready|pending <pid>", or None for garbage: a size that is
    not plain digits, has more than ROW_MAX_DIGITS of them, or exceeds `limit` (the tier's filesystem)."""
    fields = text.split()
    if not fields or len(fields[0]) > ROW_MAX_DIGITS:
        return None
    nbytes = parse(fields[0], 0, limit, integer=True)
    if nbytes is None:
        return None
    state = " ".join(fields[1:3]) if len(fields) > 1 else "ready"
    if state != "ready" and not state.startswith("pending"):
        return None
    return nbytes, state


def parse_entry_name(name: str) -> Entry | None:
    key, dot, gen = name.partition(".")
    if not dot or len(key) != 32 or not set(key) <= _HEX or not gen or not set(gen) <= _HEX:
        return None
    return Entry(name, key, gen)


def generation(entry: Entry) -> tuple[int, str]:
    """Sort key of an entry's generation: gens are time_ns in hex (new_gen), so a longer one is newer."""
    return len(entry.gen), entry.gen


def source_key(source: str) -> str:
    """32 hex digits naming a source path within a namespace (blake2b)."""
    return blake2b(source.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def check_job_id(job_id: str) -> str:
    """Job ids name directories under holds/: digits only (SLURM_JOB_ID is the array task's own id)."""
    if not isinstance(job_id, str) or not job_id.isdigit() or not job_id.isascii():
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def new_gen() -> str:
    return f"{time.time_ns():x}"


def write_stamp(entry_fd: int, stamp: dict[str, str]) -> None:
    """An entry's stamp as key=value lines (Namespace.read_stamp reads it back), flushed to disk."""
    safeio.write_atomic(
        STAMP, "".join(f"{k}={v}\n" for k, v in stamp.items()), mode=0o600, dir_fd=entry_fd, sync=True
    )
