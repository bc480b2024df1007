"""Writing stune's code cache (codecache.py serves it): the code of every stune module the command imported,
when a run missed (the file was missing, an entry was stale or damaged, a module was not in it)."""
import marshal
import os
import sys

from .codecache import FORMAT, MAGIC, PACKAGE, PACKAGE_DIR, _cache_from_source, _compile, _current, read


def write(cache) -> bool:
    """Rewrite `cache`'s file when a module this process imported did not come from it: with the code of
    every module imported after install(), and the entries other runs of the command use (another
    partition's path, a dry run's) while they are current, so runs that take different paths do not rewrite
    it in turn. True when written. Raises OSError."""
    imported = {}
    missed = cache.stale
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if name in cache.preloaded or spec is None or not _cacheable(name, spec.origin):
            continue
        imported[name] = (spec.origin, spec.submodule_search_locations is not None)
        missed = missed or spec.loader is not cache
    if not missed:
        return False
    previous = read(cache.path)[0]  # the code of the modules served (dropped from memory once loaded)
    table = {}
    for name, (origin, is_package) in imported.items():
        try:
            table[name] = _entry(previous.get(name), origin, is_package)
        except (OSError, SyntaxError, ValueError):
            continue
    for name, entry in previous.items():
        if name not in table and _current(entry) and _loads(entry[4]):
            table[name] = entry
    from .safeio import write_atomic

    os.makedirs(os.path.dirname(cache.path), mode=0o700, exist_ok=True)
    write_atomic(cache.path, pack(FORMAT, MAGIC, PACKAGE_DIR, table), mode=0o600)
    return True


def _entry(old, origin: str, is_package: bool) -> tuple:
    """The file's entry for a module: the previous one while it is current, else compiled anew."""
    if old is not None and old[0] == origin and old[1] == is_package and _current(old) and _loads(old[4]):
        return old
    st = os.stat(origin)  # before reading: a source changed after this is newer than the entry
    return (origin, is_package, st.st_mtime_ns, st.st_size, marshal.dumps(_compile(origin)),
            _cache_from_source(origin))


def pack(form, magic, package_dir, table: dict) -> bytes:
    index, blobs, offset = {}, [], 0
    for name, (origin, is_package, mtime_ns, size, code, cached) in table.items():
        index[name] = (origin, is_package, mtime_ns, size, offset, len(code), cached)
        blobs.append(code)
        offset += len(code)
    header = marshal.dumps((form, magic, package_dir, index))
    return b"".join([len(header).to_bytes(4, "little"), header, *blobs])


def _cacheable(name: str, origin) -> bool:
    """stune's modules but this one, and `__future__` (each of them imports it first), loaded from a .py
    source. Not the rest of the standard library: what a first run's profile cache miss imports (yaml's re,
    enum, ...) would stay in the file and cost every later run its reading."""
    if not isinstance(origin, str) or not origin.endswith(".py") or name == __name__:
        return False  # (this module is no command's: only a run that missed imports it)
    if name == PACKAGE or name.startswith(PACKAGE + "."):  # (a sys.path entry may hold `..`)
        return os.path.abspath(origin).startswith(PACKAGE_DIR + os.sep)
    return name == "__future__"


def _loads(data) -> bool:
    try:
        marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return False
    return True
