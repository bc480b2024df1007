"""Sources and freshness: what a source is, and a stamp that changes when the source changes.

Two modes (docs/stage.md says exactly what each guarantees):

- fast (default): the source's own status plus one directory listing and one lstat per top-level entry.
  On a parallel filesystem that is 1 + N metadata round trips for N top-level names, however deep the tree.
- strict: an lstat of every entry in the tree (the same walk a copy needs).

Each status compared is (inode, type and mode, size, mtime, ctime). ctime cannot be set back by an
unprivileged user (unlike mtime: `touch -d`), so a write, chmod, rename or replacement always shows.
"""

from __future__ import annotations

import os
import stat
from collections import namedtuple

from .errors import SourceError
from .spec import ARCHIVE_SUFFIXES

try:
    from _blake2 import blake2b  # builtin: hashlib would load OpenSSL
except ImportError:  # pragma: no cover - CPython always has it
    from hashlib import blake2b

KINDS = ("dir", "archive", "file")


class Source(namedtuple("Source", "path real kind st")):
    """`path` as requested, `real` with symlinks resolved (a SRC that is a symlink names its target),
    `kind` dir/archive/file, `st` the lstat of `real`."""

    __slots__ = ()

    @property
    def basename(self) -> str:
        return os.path.basename(self.real)


def inspect(path: str) -> Source:
    """What `path` is. Raises SourceError when it is missing, unreadable, or not a directory or file."""
    try:
        real = os.path.realpath(path, strict=True)
        st = os.lstat(real)
    except FileNotFoundError:
        raise SourceError(f"source {path} does not exist") from None
    except OSError as exc:
        raise SourceError(f"source {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        kind = "dir"
        readable = os.access(real, os.R_OK | os.X_OK)
    elif stat.S_ISREG(st.st_mode):
        kind = "archive" if real.lower().endswith(ARCHIVE_SUFFIXES) else "file"
        readable = os.access(real, os.R_OK)
    else:
        raise SourceError(f"source {path} is neither a directory nor a regular file")
    if not readable:
        raise SourceError(f"source {path} is not readable by this user")
    return Source(path, real, kind, st)


def _status(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mode:o}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _digest(parts) -> str:
    h = blake2b(digest_size=20)
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()


def stamp(source: Source, mode: str, plan: Plan | None = None) -> str:
    """The freshness stamp of a source in `mode` ("fast" or "strict"). For a strict directory stamp, pass
    the walk's `plan` when there is one, so the tree is walked once."""
    parts = [source.kind, source.real, _status(source.st)]
    if source.kind != "dir":
        # One file: its status already changes on any write, chmod or replacement, in both modes.
        return "file:" + _digest(parts)
    if mode == "strict":
        plan = plan or walk(source.real)
        return "strict:" + _digest([*parts, plan.digest])
    try:
        with os.scandir(source.real) as it:
            top = sorted((e.name, _status(e.stat(follow_symlinks=False))) for e in it)
    except OSError as exc:
        raise SourceError(f"source {source.path}: {exc.strerror}") from None
    return "fast:" + _digest(parts + [f"{name}={status}" for name, status in top])


class Plan(namedtuple("Plan", "dirs files links skipped bytes alloc digest tree")):
    """A directory's copy plan from one walk: `dirs` (relative path, mode, atime_ns, mtime_ns) parents
    first, `files` (relative directory, name, size, mode) and `links` (relative directory, name) grouped
    by directory in walk order, `skipped` (relative paths of sockets, FIFOs, devices),
    total `bytes`, an allocation estimate `alloc` (4 KiB blocks), the strict stamp `digest`, and `tree`,
    the manifest() digest the copy will have (so publishing need not walk the copy again)."""

    __slots__ = ()

    @property  # shadows tuple.count on purpose: the copy's file count is what callers (stager.py) read
    def count(self) -> int:  # type: ignore[override]
        return len(self.files) + len(self.links)


BLOCK = 4096


class Walker:
    """The walk of a tree, one directory at a time, so that a copy can start on what has been walked while the
    rest is: steps() lists each directory (one lstat per entry, never following a symlink) and yields what it
    found in it, and plan() is the whole walk's Plan once steps() is exhausted (the same Plan walk() gives).
    `alloc` is the allocation estimate of everything walked so far."""

    def __init__(self, root: str):
        self.root = root
        self.dirs: list = []
        self.files: list = []
        self.links: list = []
        self.skipped: list[str] = []
        self.bytes = 0
        self.alloc = BLOCK  # the root directory
        # The digests are over each part followed by a NUL, in walk order (_digest's bytes), fed one
        # directory at a time.
        self._parts = blake2b(digest_size=20)
        self._tree = blake2b(digest_size=20)
        self._done = False

    def steps(self):
        """Yield (new directories, files, links) per directory listed, in walk order: the directories are
        relative paths (parents before their children), files (relative directory, name, size, mode),
        links (relative directory, name). Raises SourceError for a directory it cannot list."""
        pending = [""]
        while pending:
            rel = pending.pop()
            path = os.path.join(self.root, rel) if rel else self.root
            prefix = f"{rel}/" if rel else ""
            try:
                with os.scandir(path) as it:
                    children = sorted(((e.name, e.stat(follow_symlinks=False)) for e in it), key=_name)
            except OSError as exc:
                raise SourceError(f"cannot read {path}: {exc.strerror}") from None
            new_dirs, files, links, parts, tree = [], [], [], [], []
            for name, st in children:
                child = prefix + name
                mode = st.st_mode
                parts.append(f"{child}={_status(st)}")
                if stat.S_ISDIR(mode):
                    self.dirs.append((child, stat.S_IMODE(mode), st.st_atime_ns, st.st_mtime_ns))
                    new_dirs.append(child)
                    pending.append(child)
                    tree.append(f"{child}:d:0")
                    self.alloc += BLOCK
                elif stat.S_ISREG(mode):
                    size = st.st_size
                    files.append((rel, name, size, mode))
                    self.bytes += size
                    self.alloc += -(-size // BLOCK) * BLOCK
                    tree.append(f"{child}:f:{size}")
                elif stat.S_ISLNK(mode):
                    links.append((rel, name))
                    self.alloc += BLOCK
                    tree.append(f"{child}:l:{st.st_size}")
                else:
                    self.skipped.append(child)
            if parts:
                self._parts.update(_joined(parts))
            if tree:
                self._tree.update(_joined(tree))
            self.files += files
            self.links += links
            yield new_dirs, files, links
        self._done = True

    def plan(self) -> Plan:
        if not self._done:
            raise RuntimeError("Walker.plan() before the walk is done")
        self.dirs.sort()  # parents before children
        return Plan(
            self.dirs,
            self.files,
            self.links,
            self.skipped,
            self.bytes,
            self.alloc,
            self._parts.hexdigest(),
            self._tree.hexdigest(),
        )


def _name(child: tuple) -> str:
    return child[0]


def _joined(parts: list[str]) -> bytes:
    """The bytes _digest() feeds for `parts`: each part, then a NUL."""
    return ("\0".join(parts) + "\0").encode("utf-8", "surrogateescape")


def walk(root: str) -> Plan:
    """lstat every entry under root (never following a symlink). Raises SourceError if unreadable."""
    walker = Walker(root)
    for _step in walker.steps():
        pass
    return walker.plan()


def manifest(root: str) -> tuple[int, int, str]:
    """(allocated bytes, files and symlinks, digest) of a local copy: the digest covers each relative path, type and
    size. Taken at publication and compared after a reboot, it shows whether a crash left files whose data
    never reached the disk (they come back empty or short)."""
    total = count = 0
    parts = []
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            children = sorted((e.name, e.stat(follow_symlinks=False)) for e in it)
        for name, st in children:
            child = f"{rel}/{name}" if rel else name
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
            parts.append(f"{child}:{kind}:{0 if kind == 'd' else st.st_size}")
            total += st.st_blocks * 512
            count += kind != "d"  # files and symlinks: a summary says "N files"
            if kind == "d":
                pending.append(child)
    return total, count, _digest(parts)


def boot_id() -> str:
    """This boot's id: an entry published in an earlier boot is re-verified before it is trusted."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"
