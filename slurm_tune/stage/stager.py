"""Stage one source into this node's tier: hit, or copy and publish atomically; hold it for the job.

The protocol, per user namespace and source key (layout.py has the layout):

1. Fast path, no lock: the job already settled this key on this node (a hold or a fallback note): done.
2. flock locks/<key>. Concurrent stagers of the same source (tasks of one job, or other jobs) queue here;
   when they get the lock the first one has published, and they hit.
3. Under the lock: the current entry's stamp equals the source's stamp -> hit: hold it, touch its LRU time.
4. Otherwise copy: admit the size (evicting this user's unheld LRU entries when the tier is past its high
   watermark; evict.py), reserve it in the ledger, copy into tmp/, write the stamp (fsync), then rename into
   entries/<key>.<gen>. Only a complete copy ever has that name: a killed stager leaves a tmp/ directory and
   a pending ledger row, both reclaimed once their lock is free. After a reboot an entry is trusted again
   only if its files still match the manifest in its stamp (see _publish for why that replaces a flush).
5. Older generations of the key are deleted unless a running job still holds one.

The source's stamp is taken before copying, so a source that changes during the copy is seen as changed
by the next job.
"""

from __future__ import annotations

import os
import time
from collections import namedtuple

from ..safeio import rmtree_at
from ..streams import say
from . import fresh, watch
from .dirfd import open_dir
from .errors import SourceError, TierUnavailable
from .evict import Claim
from .fresh import boot_id
from .fresh import manifest as fresh_manifest
from .layout import DATA, ENTRIES, TMP, check_job_id, new_gen, source_key, write_stamp
from .namespace import Namespace
from .spec import StageRequest
from .tier import Tier, TierConfig
from .watch import human

STAMP_FORMAT = "1"


class StageResult(
    namedtuple(
        "StageResult", "request path status entry bytes files seconds note freshness", defaults=(None,)
    )
):
    """status: "hit" (already in the tier), "copied", "held" (this job already staged it on this node), or
    "fallback" (path is the source; note says why). `files` counts files and symlinks, not directories.
    `freshness`: the mode the source was checked in ("fast" or "strict"; None when it was not checked)."""

    __slots__ = ()

    def message(self) -> str:
        """The line for the job's stderr ("" when there is nothing to say)."""
        name = self.request.name
        if self.status == "copied":
            return (
                f"stune-stage: {name}: staged {self.request.source} -> {self.path} "
                f"({human(self.bytes)}, {self.files:,} file{'' if self.files == 1 else 's'}, "
                f"{self.seconds:.1f}s)"
            )
        if self.status == "hit":
            return f"stune-stage: {name}: cache hit {self.path} (source unchanged, {self.freshness} freshness check)"
        return ""


def stage(
    request: StageRequest,
    config: TierConfig,
    *,
    job_id: str | None = None,
    progress_stream=None,
    jobs: int | None = None,
    freshness: str | None = None,
) -> StageResult:
    """Stage `request` for this process's user. Raises TierUnavailable (the tier cannot take it) or
    SourceError (the source is unusable); the caller decides between falling back and failing. ValueError
    for a job id that is not digits or a copy parallelism below 1."""
    started = time.monotonic()
    if job_id is not None:
        check_job_id(job_id)
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"copy threads must be a whole number >= 1, not {jobs!r}")
    key = source_key(request.source)
    with Tier(config) as tier, tier.namespace() as ns:
        if job_id:
            settled = _settled(request, ns, ns.job_record(job_id, key), started)
            if settled is not None:
                return settled
        lock = ns.lock(key, blocking=False)
        if lock is None:
            _say(progress_stream, f"{request.name}: waiting for another stager of {request.source}")
            lock = ns.lock(key)
        try:
            if job_id:  # another task of this job may have finished it while we waited
                settled = _settled(request, ns, ns.job_record(job_id, key), started)
                if settled is not None:
                    return settled
            try:
                return _stage_locked(
                    request,
                    tier,
                    ns,
                    key,
                    job_id,
                    progress_stream,
                    jobs,
                    freshness or config.freshness,
                    started,
                )
            except (TierUnavailable, SourceError) as exc:
                if job_id:  # the job's other tasks on this node read the source too, without retrying
                    ns.record_fallback(job_id, key, str(exc))
                raise
        finally:
            os.close(lock)


def _settled(request, ns: Namespace, record, started) -> StageResult | None:
    """The result a job's earlier task settled on this node, or None (nothing settled, or the held entry
    was removed by hand: then stage again)."""
    if record is None:
        return None
    kind, value = record
    if kind == "fallback":
        return StageResult(request, request.source, "fallback", None, 0, 0, time.monotonic() - started, value)
    stamp = ns.read_stamp(value)
    if stamp is None:
        return None
    return StageResult(
        request,
        ns.entry_path(value, stamp.get("export", DATA)),
        "held",
        value,
        int(stamp.get("bytes", 0)),
        int(stamp.get("files", 0)),
        time.monotonic() - started,
        "",
    )


def _stage_locked(
    request, tier: Tier, ns: Namespace, key: str, job_id, stream, jobs, mode: str, started: float
) -> StageResult:
    source = fresh.inspect(request.source)
    plan = fresh.walk(source.real) if source.kind == "dir" and mode == "strict" else None
    current = ns.current(key)
    stamp_now = fresh.stamp(source, mode, plan)
    if current is not None:
        stored = ns.read_stamp(current.name)
        if (
            stored is not None
            and stored_stamp(stored, mode) == stamp_now
            and stored.get("source") == request.source
            and _still_read_only(ns, current.name, stored)
            and _verified(ns, current.name, stored)
        ):
            if job_id:
                ns.add_hold(job_id, current.name)
            tier.ledger_touch(ns.uid, current.name)
            _drop_old(tier, ns, key, keep=current.name)
            return StageResult(
                request,
                ns.entry_path(current.name, stored.get("export", DATA)),
                "hit",
                current.name,
                int(stored.get("bytes", 0)),
                int(stored.get("files", 0)),
                time.monotonic() - started,
                "",
                mode,
            )
    # Both modes' stamps: a later check in the other mode (`--freshness`, a changed profile) compares
    # against the stamp of its own mode instead of copying an unchanged source again. Each is taken before
    # the copy of what it covers; a fast check's strict stamp comes from the walk the copy overlaps, and
    # each entry's lstat there comes before its copy starts.
    stamps = {mode: stamp_now}
    if source.kind == "dir" and mode == "strict":
        stamps["fast"] = fresh.stamp(source, "fast")
    _clear_leftovers(tier, ns, key)
    entry = f"{key}.{new_gen()}"
    claim = Claim(tier, ns, entry, exclude_key=key)
    # A directory is admitted as its walk sizes it (evict.Claim); a file or an archive, and a tree already
    # walked for a strict check, before the copy starts.
    allowance = None
    if source.kind != "dir" or plan is not None:
        allowance = claim.settle(plan.alloc if plan is not None else _file_estimate(source))
    tmp_name = f"{entry}.{os.getpid()}.staging"
    published = False
    try:
        os.mkdir(tmp_name, 0o700, dir_fd=ns.sub(TMP))
        nbytes, nfiles, tree, export, plan = _copy(
            source, plan, ns.sub_path(TMP, tmp_name), request, stream, jobs, claim, allowance, tier.reserve()
        )
        if source.kind == "dir" and mode == "fast":
            stamps["strict"] = fresh.stamp(source, "strict", plan)
        _publish(
            ns,
            tmp_name,
            entry,
            {
                "format": STAMP_FORMAT,
                "source": request.source,
                "real": source.real,
                "kind": source.kind,
                "freshness": mode,
                "stamp": stamp_now,
                **{f"stamp.{m}": v for m, v in stamps.items()},
                "bytes": str(nbytes),
                "files": str(nfiles),
                "tree": tree,
                "boot": boot_id(),
                "export": export,
                "readonly": "1",
                "published": f"{time.time():.3f}",
                "ranges": "1" if _in_ranges(source, plan) else "0",
                "complete": "1",
            },
        )
        published = True
        tier.ledger_write(ns.uid, entry, nbytes, "ready")
        if job_id:
            ns.add_hold(job_id, entry)
    finally:
        if not published:
            tier.ledger_remove(ns.uid, entry)
            try:
                rmtree_at(tmp_name, ns.sub(TMP))
            except OSError:
                pass
    _drop_old(tier, ns, key, keep=entry)
    return StageResult(
        request,
        ns.entry_path(entry, export),
        "copied",
        entry,
        nbytes,
        nfiles,
        time.monotonic() - started,
        "",
        mode,
    )


def stored_stamp(stored: dict[str, str], mode: str) -> str | None:
    """The source stamp an entry recorded for freshness `mode` (entries made before both modes were
    recorded have only their own mode's)."""
    return (
        stored.get(f"stamp.{mode}")
        or (stored.get("stamp") if stored.get("freshness") == mode else None)
        or (stored.get("stamp") if (stored.get("stamp") or "").startswith("file:") else None)
    )


def _clear_leftovers(tier: Tier, ns: Namespace, key: str) -> None:
    """A stager of this key that was killed left a tmp/ copy and a pending ledger row. We hold the key's
    lock, so their owner is dead: remove both before they count against the quota."""
    with os.scandir(ns.sub(TMP)) as it:
        names = [e.name for e in it if e.name.startswith(key + ".")]
    for name in names:
        try:
            rmtree_at(name, ns.sub(TMP))
        except OSError:
            pass
    published = {e.name for e in ns.entries() if e.key == key}
    for row in tier.ledger():
        if row.uid == ns.uid and row.entry.startswith(key + ".") and row.state != "ready":
            if row.entry in published:  # killed between the rename and the ledger update
                ledger_from_stamp(tier, ns, row.entry)
            else:
                tier.ledger_remove(ns.uid, row.entry)


def ledger_from_stamp(tier: Tier, ns: Namespace, entry: str) -> None:
    """A published entry's ready ledger row, sized from its stamp."""
    stamp = ns.read_stamp(entry) or {}
    tier.ledger_write(ns.uid, entry, int(stamp.get("bytes", 0) or 0), "ready")


def _file_estimate(source) -> int:
    """Bytes an archive or file will take. A compressed archive's size is unknown until extracted: assume
    3x (the copy's guard stops it at the allowance in any case)."""
    size = source.st.st_size
    if source.kind == "archive" and not source.real.lower().endswith(".tar"):
        return 3 * size
    return size + 4096


def _copy(source, plan, tmp_path: str, request, stream, jobs, claim, allowance, reserve):
    """Copy into tmp_path/data: (bytes, files, manifest digest, exported path, the tree's walk or None).
    A tree not yet walked (`plan` None) is walked as it is copied, and admitted through `claim`."""
    from . import copy  # a copy only: a warm hit (every task of a staged job) loads no copy threads

    # The allowance is watched through free-space deltas, which also see every other writer on the disk
    # (concurrent stagers, jobs): only an archive, whose output size is a guess, needs it. A directory or
    # file was sized exactly by admission; for them the guard keeps the reserve only.
    guard = watch.Guard(tmp_path, allowance if source.kind == "archive" else None, reserve)
    data = os.path.join(tmp_path, DATA)
    os.mkdir(data, 0o700)
    label = f"{request.name}: staging {request.source}"
    if source.kind == "dir":
        progress = watch.Progress(stream, label, plan.bytes if plan else 0, plan.count if plan else None)
        if plan is None:
            plan = copy.copy_tree(
                source.real,
                fresh.Walker(source.real),
                data,
                jobs=jobs,
                progress=progress,
                guard=guard,
                claim=claim,
            )
        else:
            copy.copy_tree(source.real, plan, data, jobs=jobs, progress=progress, guard=guard)
        os.chmod(data, copy.read_only(stat_mode(source.st)) | 0o500)
        export = DATA
    elif source.kind == "archive":
        from .archive import extract  # an archive's copy only (tempfile, worker processes)

        progress = watch.Progress(stream, label + " (extracting)", source.st.st_size)
        extract(source, data, progress=progress, guard=guard)
        os.chmod(data, 0o555)
        export = DATA
    else:
        progress = watch.Progress(stream, label, source.st.st_size)
        copy.copy_file(source, data, jobs=jobs, progress=progress, guard=guard)
        os.chmod(data, 0o555)
        export = f"{DATA}/{source.basename}"
    if plan is not None and plan.skipped:
        _say(
            stream,
            f"{request.name}: skipped {len(plan.skipped)} special file(s) (sockets, FIFOs, devices), "
            f"e.g. {plan.skipped[0]}",
        )
    if plan is not None:  # the walk already knows what the copy holds: no second walk
        return plan.alloc, plan.count, plan.tree, export, plan
    nbytes, nfiles, tree = fresh_manifest(data)
    return nbytes, nfiles, tree, export, None


def stat_mode(st) -> int:
    return st.st_mode & 0o7777


def _publish(ns: Namespace, tmp_name: str, entry: str, stamp: dict[str, str]) -> None:
    """Stamp, then rename: after the rename the entry is complete, and before it nothing has its name.

    There is no flush of the copied data here: syncfs(2) cost 0.2 s per 100 MB published, and on a busy node
    it also waits for every other job's dirty pages on that disk. Instead the stamp records the boot and a
    manifest of the copy, and an entry from an earlier boot is checked against its manifest before it is
    trusted again (a crash leaves unflushed files empty or short): see _verified()."""
    tfd = open_dir(tmp_name, ns.sub(TMP))
    try:
        write_stamp(tfd, stamp)
        os.fsync(tfd)
    finally:
        os.close(tfd)
    os.rename(tmp_name, entry, src_dir_fd=ns.sub(TMP), dst_dir_fd=ns.sub(ENTRIES))
    os.fsync(ns.sub(ENTRIES))  # the rename itself


def _still_read_only(ns: Namespace, entry: str, stored: dict[str, str]) -> bool:
    """A published copy has no write bit (copy.read_only). If the exported path has one again, its
    owner opened it up (`chmod -R u+w`) and may have changed it: not a hit, copy again. Two lstats."""
    if stored.get("readonly") != "1":  # published before copies were read-only: nothing to compare
        return True
    export = stored.get("export", DATA)
    for path in {DATA, export}:
        try:
            st = os.stat(ns.sub_path(ENTRIES, entry, path), follow_symlinks=False)
        except OSError:
            return False
        if st.st_mode & 0o222:
            return False
    return True


def _in_ranges(source, plan) -> bool:
    from .copy import in_ranges  # as in _copy: not on a warm hit

    return in_ranges(source.kind, plan)


def _verified(ns: Namespace, entry: str, stored: dict[str, str]) -> bool:
    """True if the entry can be trusted in this boot: published in it, or (after a reboot) its files still
    match the manifest taken at publication. A verified entry is re-stamped with this boot. A copy made in
    preallocated ranges is trusted in its own boot only: after a crash its files have their full size with
    unwritten blocks that read as zeros, which the manifest cannot see, so it is copied again."""
    now = boot_id()
    if stored.get("boot") == now:
        return True
    if stored.get("ranges") == "1":
        return False
    try:
        _nbytes, _nfiles, tree = fresh_manifest(ns.entry_path(entry))
    except OSError:
        return False
    if tree != stored.get("tree"):
        return False
    efd = open_dir(entry, ns.sub(ENTRIES))
    try:
        write_stamp(efd, dict(stored, boot=now))
    finally:
        os.close(efd)
    return True


def _drop_old(tier: Tier, ns: Namespace, key: str, keep: str) -> None:
    """Delete older copies of this source that no running job holds (we hold the key's lock)."""
    held = None
    for entry in ns.entries():
        if entry.key != key or entry.name == keep:
            continue
        held = ns.held_entries() if held is None else held
        if entry.name in held:
            continue
        if ns.remove_entry(entry.name):
            tier.ledger_remove(ns.uid, entry.name)


def _say(stream, line: str) -> None:
    say(stream, f"stune-stage: {line}")
