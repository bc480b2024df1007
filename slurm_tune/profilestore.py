"""Loading validated partition profiles: the marshal cache, root's trust rules, and the read-only view.

Split from profilecheck.py (the schema and the validation) because this is the part on the hot paths (see
docs/speed.md): a cache hit neither imports yaml nor builds the schema; a miss validates the YAML through
profilecheck.py. Every public name here is also importable from slurm_tune.profiles.
"""

from __future__ import annotations

import os
import sys

from . import cache_dir
from .errors import ConfigError, NoProfileError, UnsafePathError
from .frozen import Frozen
from .trust import open_regular, read_bounded, require_trusted, trusted_stat_or_raise

TYPE_CHECKING = False  # typing's own flag costs importing typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:  # for annotations only
    from collections.abc import Mapping

    from .profiletypes import Sections

    class _ProfileView(Frozen, Sections):
        """What mypy sees: the Frozen view with the schema's typed sections (profiletypes.py)."""

else:
    _ProfileView = Frozen  # at run time: the view alone

DEFAULT_DIR = "/etc/stune/partitions"
CACHE_FORMAT = 2
# The cache is keyed by the validating code too: an upgrade of stune invalidates it.
_VALIDATOR_PY = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    for name in ("profilecheck.py", "profilehealth.py")
)


class Profile(_ProfileView):
    """One validated partition profile. `source` is its file; `digest` identifies its effective content."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self._data["partition"]

    @property
    def source(self) -> str:
        return self._data["_source"]

    @property
    def digest(self) -> str:
        return self._data["_digest"]

    @property
    def lines(self) -> dict[str, list]:
        """key path -> [file, line], for explaining where a setting came from."""
        return self._data["_lines"]

    def origin(self, key: str) -> str:
        entry = self._data["_lines"].get(key)
        return f"{entry[0]}:{entry[1]}" if entry else "built-in default"


def profile_dir() -> str:
    return os.environ.get("STUNE_PARTITIONS") or DEFAULT_DIR


def _yaml_files(directory: str) -> list[str]:
    try:
        names = sorted(
            n for n in os.listdir(directory) if n.endswith((".yaml", ".yml")) and not n.startswith(".")
        )
    except OSError as exc:
        raise ConfigError(directory, None, "", f"cannot read the profile directory: {exc.strerror}") from None
    return names


def _cache_path(directory: str) -> str:
    tag = os.path.abspath(directory).replace("/", "_")
    return os.path.join(cache_dir(), f"profiles{tag}.{sys.implementation.cache_tag}.marshal")


def _fingerprint(directory: str) -> tuple:
    """What the cache is keyed by: every profile file's (name, size, mtime, inode). Run as root, each file
    must be root's and writable by root alone (the directory is checked by the caller)."""
    stamp = [CACHE_FORMAT, os.path.abspath(directory), *(os.path.getmtime(p) for p in _VALIDATOR_PY)]
    for name in _yaml_files(directory):
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        trusted_stat_or_raise(path, st)
        stamp.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(stamp)


CACHE_MAX_BYTES = 16 << 20  # far above any real profile set; a bigger file is not ours


def _read_cache(cache: str, fingerprint: tuple) -> tuple[dict | None, bool]:
    """(profiles, usable): the cached profiles when the cache matches `fingerprint`, each still marshalled
    (`_unpacked` reads one: a hot path needs one profile, not the set); usable is False when root must
    neither load nor write the cache (someone else can write it: marshal is not safe against crafted data,
    and a forged profile set would be root's policy)."""
    import marshal

    try:
        require_trusted(cache, missing_ok=True)
        fd, st_or_problem = open_regular(cache)  # no symlink (ELOOP: a miss), no FIFO, one link
        if fd is None:
            raise UnsafePathError(cache, st_or_problem)
        try:
            data = read_bounded(fd, CACHE_MAX_BYTES)
        finally:
            os.close(fd)
        stored_fingerprint, profiles = marshal.loads(data or b"")
        if (
            stored_fingerprint == fingerprint
            and isinstance(profiles, dict)
            and all(isinstance(packed, bytes) for packed in profiles.values())
        ):
            return profiles, True
    except UnsafePathError as exc:
        from .streams import say

        say(sys.stderr, f"stune: not using the profile cache: {exc}")
        return None, False
    except (OSError, EOFError, ValueError, TypeError):
        pass
    return None, True


def _write_cache(cache: str, fingerprint: tuple, profiles: dict) -> None:
    """Best effort (an unwritable cache only costs speed), through an exclusive temporary with a random
    name: a name planted in the cache directory is never written through."""
    import marshal

    from .safeio import write_atomic

    try:
        os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
        packed = {name: marshal.dumps(data) for name, data in profiles.items()}
        write_atomic(cache, marshal.dumps((fingerprint, packed)), mode=0o600)
    except (OSError, ValueError):
        pass


def _load_raw(directory: str) -> Mapping[str, dict | bytes]:
    """Every profile's data, validated: from the cache still marshalled (`_unpacked` reads one), else as
    validated now. Run as root, the profile directory (and every directory above it), each profile and the
    cache must be writable by root alone: root refuses with one line naming the path (trust.py's rules; the
    hit path needs no more of safeio)."""
    require_trusted(directory)
    fingerprint = _fingerprint(directory)
    cache = _cache_path(directory)
    profiles, usable = _read_cache(cache, fingerprint)
    if profiles is not None:
        return profiles
    from .profilecheck import _validate_all  # a miss; hot path: see docs/speed.md

    profiles = _validate_all(directory, _yaml_files(directory))
    if usable:
        _write_cache(cache, fingerprint, profiles)
    return profiles


def _unpacked(directory: str, raw: Mapping[str, dict | bytes], name: str) -> dict:
    """The data of profile `name` from _load_raw's answer. A cached profile that does not read back is
    validated again from the YAML (as on a miss)."""
    value = raw[name]
    if not isinstance(value, bytes):
        return value
    import marshal

    try:
        data = marshal.loads(value)
    except (EOFError, ValueError, TypeError):
        data = None
    if isinstance(data, dict):
        return data
    from .profilecheck import _validate_all

    return _validate_all(directory, _yaml_files(directory))[name]


def load_profiles(directory: str | os.PathLike | None = None) -> dict[str, Profile]:
    """Every partition profile in `directory`, validated. Raises ConfigError on the first mistake."""
    directory = os.fspath(directory) if directory else profile_dir()
    raw = _load_raw(directory)
    return {name: Profile(_unpacked(directory, raw, name)) for name in raw}


def load_profile(partition: str, directory: str | os.PathLike | None = None) -> Profile:
    directory = os.fspath(directory) if directory else profile_dir()
    profiles = _load_raw(directory)
    if partition not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise NoProfileError(directory, partition, known)
    return Profile(_unpacked(directory, profiles, partition))
