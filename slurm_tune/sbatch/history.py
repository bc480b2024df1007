"""Per-user history of stune-sbatch submissions: where it lives and how a submission is recorded. Reading
it back, and the diff that answers "why is my training slower", are historyview.py's.

One JSON object per line in `$STUNE_HISTORY`, else `${XDG_STATE_HOME:-~/.local/state}/stune/sbatch-history.jsonl`
(mode 0600): time, job id, partition, the argv as typed, the sbatch argv stune ran, the job's effective
environment, the profile file and digest, and a SHA-256 of the script's content. Writing is on the
submission path, so records are encoded with slurm_tune.fastjson (no json import); reading uses json.

The environment is the job's, minus what only describes the login session (`_`, OLDPWD, SSH_*, ...); values
of variables whose names say they hold secrets (TOKEN, SECRET, PASSWORD, ...) are stored as a short hash, so a
changed secret still shows in a diff without being written down.
"""

from __future__ import annotations

import os

from .. import fastjson

FORMAT = 1
# Variables that describe the login session, not the job: left out so two submissions from different
# shells compare equal.
NOISE = frozenset(
    (
        "_",
        "OLDPWD",
        "PWD",
        "SHLVL",
        "TERM",
        "COLORTERM",
        "DISPLAY",
        "LS_COLORS",
        "PS1",
        "PS2",
        "PS4",
        "PROMPT_COMMAND",
        "MAIL",
        "WINDOWID",
        "COLUMNS",
        "LINES",
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_SESSION_ID",
        "XDG_SESSION_TYPE",
        "XDG_SESSION_CLASS",
        "XDG_RUNTIME_DIR",
        "HISTFILE",
        "HISTSIZE",
        "HISTCONTROL",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "KRB5CCNAME",
        "GPG_AGENT_INFO",
        "TERM_PROGRAM",
        "TERM_PROGRAM_VERSION",
        "LESSOPEN",
        "LESSCLOSE",
        "SECURITYSESSIONID",
    )
)
NOISE_PREFIXES = ("BASH_FUNC_",)
SECRET_WORDS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
)


def history_path(environ=None) -> str:
    environ = os.environ if environ is None else environ
    explicit = environ.get("STUNE_HISTORY")
    if explicit:
        return explicit
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "stune", "sbatch-history.jsonl")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


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


def record(entry: dict, environ=None) -> str:
    """Append one submission to the user's history, whole or not at all (safeio.append_whole: a full disk
    leaves no torn record); returns the file. Raises OSError (FileWriteError, naming the file, when the
    record could not be written)."""
    path = history_path(environ)
    line = (fastjson.dumps(dict(entry, v=FORMAT)) + "\n").encode()  # ASCII: odd bytes become \udcXX escapes
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except (
            FileNotFoundError
        ):  # the first submission: its directory is made then, not checked at every one
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            fd = os.open(path, flags, 0o600)
    except OSError as exc:
        from ..errors import FileWriteError

        raise FileWriteError(path, exc) from None
    try:
        from ..safeio import append_whole

        append_whole(fd, line, path)
    finally:
        os.close(fd)
    return path
