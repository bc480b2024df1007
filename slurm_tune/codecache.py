"""One file holding the compiled code of the modules a hot command imports (docs/speed.md).

A fresh interpreter imports each module through the path search: find the source among sys.path, stat it,
open and read its .pyc. A submission imports two dozen modules that way. A hot launcher (bin/) installs a
`CodeCache` first: each module whose code is in the file, compiled from its source as the source is now
(path, mtime and size, as a .pyc is checked; the same interpreter's magic number), is then imported from
that one file. Anything else (a module not in it, a changed or removed source, another Python, a damaged
file) takes the normal import, and the command writes a fresh file at its end (run_console).

What is cached: stune's own modules (and `__future__`) that the command imported after the launcher
installed the cache; entries stay while current, so runs that take different paths share one file. It lives
in stune's cache directory (the profile cache's, `slurm_tune.cache_dir()`), one per command and installed
package, written by the user who runs the command, for that user. PYTHONDONTWRITEBYTECODE is about .pyc
files beside the sources and does not apply. A file of code is trusted like a .pyc: only a regular file of
the running user with one link that nobody else can write is loaded, and root loads and writes it only
where root alone could have written it (trust.py's rules, which safeio enforces for every file root loads).

No `from __future__` import and no stune import but trust.py: this module runs before the cache can help.
Writing the file is codecache_writer.py's, imported only when a run missed.
"""
import marshal
import os
import sys

from . import cache_dir
from .trust import S_IFREG, load_problem, opened_problem, untrusted_stat

FORMAT = 2
MAX_BYTES = 16 << 20  # far above the code of every module stune has; a bigger file is not ours
PACKAGE = __name__.rpartition(".")[0]
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# CPython's import system: the magic number of its bytecode and its module spec type (None elsewhere: no cache)
MAGIC = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
_ModuleSpec = getattr(sys.modules.get("_frozen_importlib"), "ModuleSpec", None)
_cache_from_source = getattr(sys.modules.get("_frozen_importlib_external"), "cache_from_source", None)


def cache_path(command: str, environ=None) -> str:
    """The file for `command` of the package installed here, on this interpreter's cache tag."""
    tag = PACKAGE_DIR.replace("/", "_")
    return os.path.join(cache_dir(environ), f"code-{command}{tag}.{sys.implementation.cache_tag}.marshal")


class CodeCache:
    """A meta path finder and loader serving modules from one file. Entries: module name -> (source path,
    is a package, the source's mtime_ns and size when compiled, the marshalled code object, the module's
    __cached__: its .pyc path, as the path loader sets it, computed when the file was written)."""

    def __init__(self, path: str, table: dict, usable: bool = True):
        self.path, self.table, self.usable = path, table, usable
        self.preloaded = frozenset(sys.modules)  # imported before the cache could serve them: never its
        self.stale = False  # an entry was out of date or damaged
        self.unserved = False  # a stune module (or __future__) was asked for that the file did not serve

    @classmethod
    def install(cls, command: str) -> "CodeCache":
        """Read the command's file and put the cache first on sys.meta_path."""
        path = cache_path(command)
        table, usable = read(path)
        cache = cls(path, table, usable)
        sys.meta_path.insert(0, cache)
        _INSTALLED.append(cache)
        return cache

    # ---- importlib's finder and loader protocol ----------------------------------------------------------
    def find_spec(self, name, path=None, target=None):
        entry = self.table.get(name)
        if entry is None:
            if name == PACKAGE or name.startswith(PACKAGE + ".") or name == "__future__":
                self.unserved = True
            return None
        if not _current(entry):
            self.stale = True
            return None
        spec = _ModuleSpec(name, self, origin=entry[0], is_package=entry[1])
        spec.has_location = True  # __file__ is the source, as with the path loader
        spec.cached = entry[5]  # else the import system derives it from the source path at every import
        if entry[1]:
            spec.submodule_search_locations = [os.path.dirname(entry[0])]
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        name, origin = module.__spec__.name, module.__spec__.origin
        entry = self.table[name]
        try:
            code = marshal.loads(entry[4])
        except (EOFError, ValueError, TypeError):  # a damaged entry: the source's code, and a new file
            self.stale = True
            code = _compile(origin)
        else:  # the marshalled copy's memory goes back to the allocator for what the module creates
            self.table[name] = entry[:4] + (None,) + entry[5:]
        exec(code, module.__dict__)

    def get_source(self, name: str):
        """The source text, for tracebacks and inspect (as the path loader gives it)."""
        with open(self.table[name][0], encoding="utf-8") as fh:
            return fh.read()

    def save(self) -> bool:
        """Rewrite the file when a module this process imported did not come from it (codecache_writer.write).
        True when written. Raises OSError."""
        if not self.usable or MAGIC is None or not (self.stale or self.unserved):
            return False  # every stune module imported since install() came from the file, as it is now
        from .codecache_writer import write  # a miss: rare (an install, an edit, a new path)

        return write(self)


_INSTALLED = []


def save_installed() -> None:
    """save() each cache this process installed; cli.common.run_console calls it at a command's end."""
    for cache in _INSTALLED:
        try:
            cache.save()
        except Exception:  # a cache only saves time, never changes a command's outcome
            pass


def read(path: str) -> tuple:
    """(table, usable): the entries of the file at `path` that are well formed. usable is False when the
    file must be neither loaded nor written (not ours, linked, someone else can write it); anything else
    wrong (missing, damaged, another interpreter or install) gives an empty table, and every import misses."""
    if MAGIC is None or _ModuleSpec is None or _cache_from_source is None:
        return {}, False
    euid = os.geteuid()
    if euid == 0 and load_problem(path, missing_ok=True):  # root's rule for what it loads
        return {}, False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}, True
    try:
        st = os.fstat(fd)
        # a regular file of this user (root's for root) with one link, that nobody else can write
        if opened_problem(st, S_IFREG, euid) or untrusted_stat(st, euid):
            return {}, False
        data = os.read(fd, min(st.st_size, MAX_BYTES) + 1)  # its size: no oversized buffer to shrink
    except OSError:
        return {}, True
    finally:
        os.close(fd)
    unpacked = unpack(data) if len(data) <= MAX_BYTES else None
    if unpacked is None:
        return {}, True
    form, magic, package_dir, table = unpacked
    if form != FORMAT or magic != MAGIC or package_dir != PACKAGE_DIR:
        return {}, True
    return table, True


# The file: the header's length (4 bytes, little-endian), the header (marshal: format, magic number,
# package directory, and per module its source path, is a package, mtime_ns, size, where its code lies in
# the rest, and its __cached__), then each module's marshalled code (codecache_writer.pack writes it). An
# entry's code is a slice of the one buffer read, not a copy of its own.

def unpack(data: bytes):
    """(format, magic, package directory, table) of a file's bytes, or None when they do not read as one.
    Entries that are not well formed are left out."""
    view = memoryview(data)
    length = int.from_bytes(view[:4], "little")
    try:
        form, magic, package_dir, index = marshal.loads(view[4:4 + length])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(index, dict):
        return None
    body = view[4 + length:]
    size = len(body)
    table = {}
    for name, entry in index.items():
        if type(name) is str and type(entry) is tuple and len(entry) == 7:
            origin, is_package, mtime_ns, source_size, offset, count, cached = entry
            if (type(origin) is str and type(is_package) is bool and type(mtime_ns) is int and mtime_ns >= 0
                    and type(source_size) is int and source_size >= 0 and type(offset) is int and offset >= 0
                    and type(count) is int and count >= 0 and offset + count <= size and type(cached) is str):
                table[name] = (origin, is_package, mtime_ns, source_size, body[offset:offset + count], cached)
    return form, magic, package_dir, table


def _current(entry: tuple) -> bool:
    """The entry was compiled from its source as the source is now."""
    try:
        st = os.stat(entry[0])
    except OSError:
        return False
    return st.st_mtime_ns == entry[2] and st.st_size == entry[3]


def _compile(origin: str):
    with open(origin, "rb") as fh:
        return compile(fh.read(), origin, "exec", dont_inherit=True)
