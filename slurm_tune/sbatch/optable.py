"""sbatch's option table, learned from the installed sbatch and cached per Slurm release and plugin stack.

`sbatch --help` lists sbatch's own options (`  -A, --account=name`, `      --exclusive[=user]`, `  -H, --hold`)
and, under "Options provided by plugins:", the site's SPANK options (pyxis's `--container-image=...`). Each
line says whether the option takes an argument: `--name=ARG` required, `--name[=ARG]` optional, `--name` none.
The learned table is laid over the built-in one (options.py: Slurm 22.05's, probed from its getopt table),
which keeps what `--help` does not show (hidden options, and `--no-kill`/`--get-user-env`, whose optional
argument the help does not print). A release that adds options (24.11's --tres-per-task, 26.05's
--mem-update) or a site with plugins is read as its own sbatch reads a command line.

The table is cached in the user's cache directory (slurm_tune.cache_dir()), keyed by what changes it: the
sbatch binary (path, size, mtime, inode), slurm.conf and the plugin stack beside it (plugstack.conf, and
plugstack.conf.d). A hit costs a few stat calls and one small read; `sbatch --help` runs once per key. The
cache is plain text, read only from a regular file of the user's own with one link (trust.open_regular), and
written atomically (safeio.write_atomic): garbage in it is a miss, never an option.
"""

from __future__ import annotations

import os

from .options import LONG, NO, OPTIONAL, PLUGIN_KEYS, REQUIRED

CACHE_FORMAT = "stune-sbatch-options 1"
# When sbatch cannot answer (no Slurm configuration here, a stand-in), the built-in table is used, and that
# is cached for a while too: a login node without Slurm must not pay a failing `sbatch --help` per submission.
UNANSWERED_TTL_S = 600
UNANSWERED = "built-in"
# The options any sbatch has: a `--help` text without them is not sbatch's (a stand-in, an error page).
CORE = frozenset(("partition", "nodes", "ntasks", "time", "job-name", "output"))
_ARG = {"n": NO, "r": REQUIRED, "o": OPTIONAL}
_ARG_CHAR = {v: k for k, v in _ARG.items()}
PLUGIN_HEADER = "Options provided by plugins:"


# ---- reading `sbatch --help` -----------------------------------------------------------------------------------


def parse_help(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """({long name: NO/REQUIRED/OPTIONAL}, {short letter: long name}) from `sbatch --help` output: every line
    that starts (after at most 8 spaces) with `-X, --name` or `--name`. Slurm prints `--name=ARG` for an
    option with an argument, `--name[=ARG]` for an optional one and `--name` for a flag (sbatch's own help
    and spank.c's printer of plugin options alike)."""
    longs: dict[str, int] = {}
    shorts: dict[str, str] = {}
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if len(line) - len(body) > 8 or not body.startswith("-"):
            continue
        short = ""
        if len(body) > 4 and body[1] != "-" and body[2:4] == ", ":
            short, body = body[1], body[4:]
        if not body.startswith("--") or len(body) < 3:
            continue
        word = body[2:].split(" ", 1)[0]
        cut = min([i for i in (word.find("="), word.find("[")) if i >= 0] or [len(word)])
        name = word[:cut]
        if not name or not name[0].isalnum() or not all(c.isalnum() or c in "-_" for c in name):
            continue
        has_arg = OPTIONAL if word[cut : cut + 2] == "[=" else REQUIRED if word[cut : cut + 1] == "=" else NO
        if longs.get(name) == OPTIONAL:  # `--exclusive[=user]`, then `--exclusive[=mcs]`: one option
            has_arg = OPTIONAL
        longs[name] = has_arg
        if short.isalnum():
            shorts[short] = name
    return longs, shorts


def parse_plugin_help(text: str) -> dict[str, tuple[int, str]]:
    """The SPANK options in `sbatch --help` output: the options listed after "Options provided by plugins:"."""
    _, header, section = text.partition(PLUGIN_HEADER)
    if not header:
        return {}
    return {name: (has_arg, name) for name, has_arg in parse_help(section)[0].items()}


def add_plugin_options(found: dict[str, tuple[int, str]]) -> None:
    """Teach the reader the site's plugin options: sbatch's getopt table holds them too (so abbreviations
    and ambiguity follow sbatch's)."""
    for name, entry in found.items():
        if name not in LONG:
            LONG[name] = entry
            PLUGIN_KEYS.add(name)


# ---- the cache ---------------------------------------------------------------------------------------------


def fingerprint(slurm, environ) -> str:
    """What the table depends on, as one line: the sbatch binary, slurm.conf, the plugin stack's files."""
    exe = slurm.executable("sbatch") if hasattr(slurm, "executable") else "sbatch"
    path = exe if "/" in exe else _on_path(exe, environ.get("PATH", ""))
    conf = environ.get("SLURM_CONF") or getattr(slurm, "conf", None) or "/etc/slurm/slurm.conf"
    conf_dir = os.path.dirname(conf) or "."
    stamped = (
        path,
        conf,
        os.path.join(conf_dir, "plugstack.conf"),
        os.path.join(conf_dir, "plugstack.conf.d"),
    )
    return " ".join([path or exe, *(_stamp(name) for name in stamped)])


def _on_path(name: str, path: str) -> str | None:
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _stamp(path: str | None) -> str:
    if not path:
        return "-"
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def cache_path(environ) -> str:
    from .. import cache_dir

    return os.path.join(cache_dir(environ), "sbatch-options.txt")


def format_cache(
    key: str, longs: dict[str, int] | None, shorts: dict[str, str], plugins: set[str], now: float = 0
) -> str:
    """The cache's text: the format, the key, then one line per option (`r- name`: required argument, not a
    plugin's; `op name`: optional, a plugin's; `s X name`: a short option), or `built-in TIME` when sbatch
    did not answer at TIME."""
    lines = [CACHE_FORMAT, key.replace("\n", " ")]
    if longs is None:
        return "\n".join([*lines, f"{UNANSWERED} {int(now)}"]) + "\n"
    lines += [
        f"{_ARG_CHAR[arg]}{'p' if name in plugins else '-'} {name}" for name, arg in sorted(longs.items())
    ]
    lines += [f"s {letter} {name}" for letter, name in sorted(shorts.items())]
    return "\n".join(lines) + "\n"


def parse_cache(text: str, key: str, now: float):
    """(longs, shorts, plugins) when `text` is a cache for `key`, UNANSWERED while a recent `built-in` entry
    holds, else None (garbage is a miss)."""
    lines = text.split("\n")
    if len(lines) < 3 or lines[0] != CACHE_FORMAT or lines[1] != key.replace("\n", " "):
        return None
    head, _, when = lines[2].partition(" ")
    if head == UNANSWERED:
        return UNANSWERED if when.isdigit() and 0 <= now - int(when) < UNANSWERED_TTL_S else None
    longs: dict[str, int] = {}
    shorts: dict[str, str] = {}
    plugins: set[str] = set()
    for line in lines[2:]:
        if not line:
            continue
        head, _, name = line.partition(" ")
        if head == "s":
            letter, _, name = name.partition(" ")
            if len(letter) != 1 or not name:
                return None
            shorts[letter] = name
        elif len(head) == 2 and head[0] in _ARG and name and " " not in name:
            longs[name] = _ARG[head[0]]
            if head[1] == "p":
                plugins.add(name)
        else:
            return None
    return (longs, shorts, plugins) if CORE.issubset(longs) else None


def read_cache(environ, key: str):
    """The cached table for `key`, or None. Read by trust.py's rules (a regular file of this user's, one link,
    no symlink, no FIFO, bounded; for root, nothing another user could have written, like the profile cache),
    which a hot path loads without the rest of safeio."""
    from ..trust import load_problem, open_regular, read_bounded

    path = cache_path(environ)
    if load_problem(path, missing_ok=True):
        return None
    try:
        fd, _ = open_regular(path, owner=os.geteuid())
    except OSError:
        return None
    if fd is None:
        return None
    try:
        data = read_bounded(fd, 1 << 18)
    except OSError:
        data = None
    finally:
        os.close(fd)
    if data is None:
        return None
    try:
        import time

        return parse_cache(data.decode("utf-8"), key, time.time())
    except UnicodeDecodeError:
        return None


def write_cache(environ, key: str, longs, shorts, plugins) -> None:
    """Best effort: a cache that cannot be written only costs one `sbatch --help` next time. `longs` None:
    sbatch did not answer (remembered for UNANSWERED_TTL_S)."""
    import time

    from ..safeio import write_atomic
    from ..trust import load_problem

    path = cache_path(environ)
    if load_problem(path, missing_ok=True):  # root would not read it back
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, format_cache(key, longs, shorts, plugins, time.time()), mode=0o600)
    except (OSError, ValueError):
        pass


def ask_sbatch(slurm, environ) -> str | None:
    """`sbatch --help`'s output, or None when sbatch cannot answer (no Slurm config, no sbatch)."""
    from ..errors import StuneError

    try:
        rc, out, _ = slurm.run_full(["sbatch", "--help"], timeout=10, env=dict(environ))
    except StuneError:
        return None
    return out if rc == 0 else None


def learn(slurm, environ, *, fresh: bool = False) -> str:
    """Lay the installed sbatch's option table over the built-in one (options.use_learned). From the cache when
    its key matches (unless `fresh`), else from `sbatch --help` (then cached). Returns how the table was had:
    "cached", "asked", or "built-in" when sbatch could not say, now or within UNANSWERED_TTL_S (the table is
    then Slurm 22.05's)."""
    from .options import use_learned

    key = fingerprint(slurm, environ)
    if not fresh:
        cached = read_cache(environ, key)
        if cached == UNANSWERED:
            return "built-in"
        if cached is not None:
            use_learned(*cached)
            return "cached"
    text = ask_sbatch(slurm, environ)
    longs, shorts = parse_help(text or "")
    if not text or not CORE.issubset(longs):  # no answer, or not sbatch's help
        write_cache(environ, key, None, {}, set())
        return "built-in"
    plugins = set(parse_help(text.partition(PLUGIN_HEADER)[2])[0]) if PLUGIN_HEADER in text else set()
    use_learned(longs, shorts, plugins)
    write_cache(environ, key, longs, shorts, plugins)
    return "asked"
