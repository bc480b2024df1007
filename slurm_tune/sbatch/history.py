"""Per-user history of stune-sbatch submissions, and the diff that answers "why is my training slower".

One JSON object per line in `$STUNE_HISTORY`, else `${XDG_STATE_HOME:-~/.local/state}/stune/sbatch-history.jsonl`
(mode 0600): time, job id, partition, the argv as typed, the sbatch argv stune ran, the job's effective
environment, the profile file and digest, and a SHA-256 of the script's content. Writing is on the submission path, so records are encoded with
slurm_tune.fastjson (no json import); reading uses json.

The environment is the job's, minus what only describes the login session (`_`, OLDPWD, SSH_*, ...); values
of variables whose names say they hold secrets (TOKEN, SECRET, PASSWORD, ...) are stored as a short hash, so a
changed secret still shows in a diff without being written down.
"""
from __future__ import annotations

import os

from .. import fastjson
from ..errors import StuneError
from ..text import is_digits

FORMAT = 1
# Variables that describe the login session, not the job: left out so two submissions from different
# shells compare equal.
NOISE = frozenset(("_", "OLDPWD", "PWD", "SHLVL", "TERM", "COLORTERM", "DISPLAY", "LS_COLORS", "PS1", "PS2",
                   "PS4", "PROMPT_COMMAND", "MAIL", "WINDOWID", "COLUMNS", "LINES", "SSH_AUTH_SOCK",
                   "SSH_AGENT_PID", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "DBUS_SESSION_BUS_ADDRESS",
                   "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_RUNTIME_DIR", "HISTFILE",
                   "HISTSIZE", "HISTCONTROL", "TMUX", "TMUX_PANE", "STY", "KRB5CCNAME", "GPG_AGENT_INFO",
                   "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "LESSOPEN", "LESSCLOSE", "SECURITYSESSIONID"))
NOISE_PREFIXES = ("BASH_FUNC_",)
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY",
                "CREDENTIAL")


class HistoryError(StuneError):
    """The history cannot be read, or a run named in `history diff` is not in it."""


def history_path(environ=None) -> str:
    environ = os.environ if environ is None else environ
    explicit = environ.get("STUNE_HISTORY")
    if explicit:
        return explicit
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "stune", "sbatch-history.jsonl")


def is_secret(name: str) -> bool:
    upper = name.upper()
    for word in SECRET_WORDS:
        if word in upper:
            return True
    return False


def sha256(data: bytes):
    """hashlib.sha256 without hashlib's OpenSSL load (2-7 ms on the submission path, paid by every user whose
    environment holds a token): the interpreter's built-in module where it has one (3.11: _sha256, 3.12+:
    _sha2)."""
    for name in ("_sha256", "_sha2"):
        try:
            return __import__(name).sha256(data)
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256(data)


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    out = {}
    for name in sorted(env):
        if name in NOISE or name.startswith(NOISE_PREFIXES):
            continue
        value = env[name]
        if is_secret(name):
            value = "<secret sha256:" + sha256(value.encode("utf-8", "replace")).hexdigest()[:12] + ">"
        out[name] = value
    return out


# ---- writing (hot path) --------------------------------------------------------------------------------------

def record(entry: dict, environ=None) -> str:
    """Append one submission to the user's history; returns the file. Raises OSError."""
    path = history_path(environ)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    line = (fastjson.dumps(dict(entry, v=FORMAT)) + "\n").encode()  # ASCII: odd bytes become \udcXX escapes
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash: end it, keep ours whole
            line = b"\n" + line
        os.write(fd, line)  # one write on an O_APPEND file: concurrent submissions do not interleave
    finally:
        os.close(fd)
    return path


# ---- reading -------------------------------------------------------------------------------------------------

def load(environ=None) -> list[dict]:
    import json

    path = history_path(environ)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the history: {exc.strerror}") from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn line from a crash: skip it, keep the rest
        if isinstance(entry, dict):
            entry["_line"] = lineno
            out.append(entry)
    return out


def find(entries: list[dict], ref: str) -> dict:
    """A run by job id (the latest submission with it), or by position: -1 is the latest, -2 the one before."""
    ref = ref.strip()
    if ref.startswith("-") and is_digits(ref[1:]):
        k = int(ref[1:])
        if not 1 <= k <= len(entries):
            raise HistoryError(f"there is no run {ref}: the history holds {len(entries)}")
        return entries[-k]
    job = ref.split(";")[0].split(".")[0]
    for entry in reversed(entries):
        if str(entry.get("job_id")) == job:
            return entry
    raise HistoryError(f"job {ref} is not in the history (see `stune-sbatch history`)")


def when(entry: dict) -> str:
    import time

    stamp = entry.get("time")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if isinstance(stamp, (int, float)) else "?"


def command_text(argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in argv or [])


def format_list(entries: list[dict], limit: int | None = None) -> str:
    shown = entries[-limit:] if limit else entries
    if not shown:
        return "no submissions recorded yet\n"
    from ..output import table

    return table(((when(entry), str(entry.get("job_id") or "?"), str(entry.get("partition") or "?"),
                   str(entry.get("digest") or "-")[:8], command_text(["stune-sbatch", *entry.get("argv", [])]))
                  for entry in shown), ("when", "job", "partition", "digest", "command"))


def diff(a: dict, b: dict) -> list[str]:
    """The lines that differ between two runs; an empty list when nothing that stune records changed."""
    out = []
    for key, label in (("partition", "partition"), ("cluster", "cluster"), ("cwd", "directory"),
                       ("script", "script")):
        if a.get(key) != b.get(key):
            out.append(f"{label}: {a.get(key)!r} -> {b.get(key)!r}")
    if a.get("script_sha256") and b.get("script_sha256") and a["script_sha256"] != b["script_sha256"]:
        out.append(f"script content changed: sha256 {a['script_sha256']} -> {b['script_sha256']}"
                   + (f" ({b.get('script')})" if a.get("script") == b.get("script") else ""))
    if a.get("digest") != b.get("digest"):
        out.append(f"profile: {a.get('profile')} digest {a.get('digest')} -> {b.get('profile')} digest "
                   f"{b.get('digest')} (the partition profile changed)")
    if a.get("argv") != b.get("argv"):
        out.append(f"command: {command_text(a.get('argv'))}")
        out.append(f"     ->  {command_text(b.get('argv'))}")
    if a.get("added") != b.get("added"):
        out.append(f"options stune added: {' '.join(a.get('added') or []) or '-'} -> "
                   f"{' '.join(b.get('added') or []) or '-'}")
    env_a, env_b = a.get("env") or {}, b.get("env") or {}
    changed = []
    for name in sorted(set(env_a) | set(env_b)):
        if name not in env_b:
            changed.append(f"  - {name}={env_a[name]}")
        elif name not in env_a:
            changed.append(f"  + {name}={env_b[name]}")
        elif env_a[name] != env_b[name]:
            changed.append(f"  ~ {name}: {env_a[name]!r} -> {env_b[name]!r}")
    if changed:
        out.append(f"environment ({len(changed)} variable{'s' if len(changed) != 1 else ''} differ):")
        out.extend(changed)
    return out
