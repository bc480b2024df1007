"""Reading the submission history back (`stune-sbatch history`): load it, find a run, list, diff two runs.
history.py writes it, on the submission path; this module is not on that path.
"""

from __future__ import annotations

from ..errors import StuneError
from ..text import is_digits
from .history import history_path


class HistoryError(StuneError):
    """The history cannot be read, or a run named in `history diff` is not in it."""


class History(list):
    """The history's records, oldest first; `skipped` holds (line, why) of each line that was not one
    (torn by a crash or a full disk, or holding a number stune never writes), `path` the file."""

    def __init__(self, path: str, entries=(), skipped=()):
        super().__init__(entries)
        self.path, self.skipped = path, list(skipped)

    def warning(self) -> str | None:
        """One line about the skipped lines, or None when there were none."""
        if not self.skipped:
            return None
        line, why = self.skipped[0]
        n = len(self.skipped)
        return f"{self.path}: skipped {n} unreadable line{'s' if n != 1 else ''} (first: line {line}, {why})"


def load(environ=None) -> History:
    import json

    from ..readback import EPOCH_MAX, problem

    path = history_path(environ)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return History(path)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the history: {exc.strerror}") from None
    out = History(path)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            out.skipped.append((lineno, "torn: not a whole record"))  # a crash or a full disk: keep the rest
            continue
        if not isinstance(entry, dict):
            out.skipped.append((lineno, "not a record"))
            continue
        why = problem(entry["time"], 0, EPOCH_MAX) if entry.get("time") is not None else None
        if why:
            out.skipped.append((lineno, f"time: {why}"))
            continue
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
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if isinstance(stamp, (int, float)) else "?"
    )


def command_text(argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in argv or [])


def format_list(entries: list[dict], limit: int | None = None) -> str:
    shown = entries[-limit:] if limit else entries
    if not shown:
        return "no submissions recorded yet\n"
    from ..output import table

    return table(
        (
            (
                when(entry),
                str(entry.get("job_id") or "?"),
                str(entry.get("partition") or "?"),
                str(entry.get("digest") or "-")[:8],
                command_text(["stune-sbatch", *entry.get("argv", [])]),
            )
            for entry in shown
        ),
        ("when", "job", "partition", "digest", "command"),
    )


def diff(a: dict, b: dict) -> list[str]:
    """The lines that differ between two runs; an empty list when nothing that stune records changed."""
    out = []
    for key, label in (
        ("partition", "partition"),
        ("cluster", "cluster"),
        ("cwd", "directory"),
        ("script", "script"),
    ):
        if a.get(key) != b.get(key):
            out.append(f"{label}: {a.get(key)!r} -> {b.get(key)!r}")
    if a.get("script_sha256") and b.get("script_sha256") and a["script_sha256"] != b["script_sha256"]:
        out.append(
            f"script content changed: sha256 {a['script_sha256']} -> {b['script_sha256']}"
            + (f" ({b.get('script')})" if a.get("script") == b.get("script") else "")
        )
    if a.get("digest") != b.get("digest"):
        out.append(
            f"profile: {a.get('profile')} digest {a.get('digest')} -> {b.get('profile')} digest "
            f"{b.get('digest')} (the partition profile changed)"
        )
    if a.get("argv") != b.get("argv"):
        out.append(f"command: {command_text(a.get('argv'))}")
        out.append(f"     ->  {command_text(b.get('argv'))}")
    if a.get("added") != b.get("added"):
        out.append(
            f"options stune added: {' '.join(a.get('added') or []) or '-'} -> "
            f"{' '.join(b.get('added') or []) or '-'}"
        )
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
