"""The recovery settings of a submission: --requeue, and the checkpoint signal only where the batch script can
take it (a trap, `recovery.signal_when: always` or --checkpoint-signal), with a warning when the time limit is
shorter than the signal's lead."""

from __future__ import annotations

from ..text import is_digits
from .directives import split_directive
from .options import Effective
from .setting import NOTE, OPTION, WARNING, Setting, origin


def recovery_settings(
    profile,
    eff: Effective,
    script: str | None = None,
    opt_in: bool = False,
    multi: bool = False,
    requeue_option=None,
) -> list[Setting]:
    """--requeue and the checkpoint signal. The signal goes only to a batch script that traps it (or when the
    profile's recovery.signal_when is `always`, or --checkpoint-signal asks for it): bash's default action for
    SIGUSR1 is to exit, so an untrapped signal would end FAILED a job that plain sbatch completes.
    `requeue_option(expedite)` (the adapter's, asked only for a multi-node job under recovery.expedite) gives
    the release's --requeue word."""
    out = []
    rec = profile.recovery
    if rec.requeue:
        mine = eff.given("requeue", "no-requeue")
        value, note, keys = None, "", ["recovery.requeue"]
        if mine is None and multi and rec.expedite and requeue_option is not None:
            value, note = _expedite(requeue_option)
            keys.append("recovery.expedite")
        out.append(
            Setting(
                OPTION,
                "--requeue",
                value,
                origin(profile, *keys),
                mine is None,
                f"kept your --{mine.key} ({mine.where})" if mine else note,
            )
        )
    if not rec.signal:
        return out
    value = f"B:{rec.signal}@{rec.signal_seconds}"
    source = origin(profile, "recovery.signal", "recovery.signal_seconds")
    mine = eff.get("signal")
    if mine is not None:
        out.append(
            Setting(
                OPTION, "--signal", value, source, False, f"kept your --signal={mine.value} ({mine.where})"
            )
        )
        seconds = signal_seconds(mine.value)
        if seconds is not None:
            out.extend(_short_limit(eff, seconds, f"your --signal={mine.value}"))
        return out
    trap = trapped_at(script, rec.signal)
    when = getattr(rec, "signal_when", "trapped")
    if trap is None and when != "always" and not opt_in:
        out.append(
            Setting(
                NOTE,
                "signal",
                None,
                source + "; " + origin(profile, "recovery.signal_when"),
                True,
                f"not added: the script does not trap {rec.signal} (bash would exit on it); trap it, "
                "or pass --checkpoint-signal, to get it",
            )
        )
        return out
    why = (
        f"your script traps it ({trap})"
        if trap is not None
        else "--checkpoint-signal"
        if opt_in
        else "recovery.signal_when: always"
    )
    out.append(
        Setting(
            OPTION,
            "--signal",
            value,
            source,
            True,
            f"SIG{rec.signal} to the batch shell {rec.signal_seconds}s before the time limit, to "
            f"checkpoint: {why}",
        )
    )
    out.extend(_short_limit(eff, rec.signal_seconds, f"--signal={value}"))
    return out


def _expedite(requeue_option) -> tuple[str | None, str]:
    """(the --requeue value, why) for a multi-node job under recovery.expedite."""
    from ..errors import StuneError

    try:
        word = requeue_option(True)
    except StuneError as exc:
        return None, f"plain --requeue: cannot tell the Slurm release ({exc})"
    if word == "--requeue=expedite":
        return "expedite", (
            "a multi-node job: when an epilog or a node fails, Slurm requeues it at once, first in the queue, "
            "on its held nodes"
        )
    return None, "plain --requeue: --requeue=expedite needs Slurm 25.11.3 or later"


def _short_limit(eff: Effective, seconds: int, what: str) -> list[Setting]:
    """A warning when the time limit is no longer than the signal's lead: the signal comes at once."""
    limit = eff.get("time")
    if limit is None:
        return []
    total = time_limit_seconds(limit.value)
    if total is None or total > seconds:
        return []
    return [
        Setting(
            WARNING,
            "signal",
            None,
            f"-t {limit.value} ({limit.where})",
            True,
            f"the time limit ({total}s) is not longer than the {seconds}s of {what}: the signal is sent "
            "as soon as the job starts (Slurm may send it up to 60s early)",
        )
    ]


def trapped_at(script: str | None, signal: str) -> str | None:
    """Where a batch script traps `signal` (`line N`), else None. Reads `trap HANDLER SIG...` commands
    anywhere in the script; `trap - SIG` (back to the default action) does not count."""
    if not script:
        return None
    wanted = signal.upper().removeprefix("SIG")
    number = _SIGNAL_NUMBERS.get(wanted)
    for lineno, line in enumerate(script.split("\n"), 1):
        if "trap" not in line:
            continue
        for command in _commands(line):
            if len(command) < 3 or command[0] != "trap":
                continue
            args = command[1:]
            if args[0] == "--":
                args = args[1:]
            if len(args) < 2 or args[0].startswith("-"):
                continue  # trap -p / -l / `trap - SIG` resets to the default
            for spec in args[1:]:
                spec = spec.upper().removeprefix("SIG")
                if spec == wanted or (number is not None and spec == number):
                    return f"line {lineno}"
    return None


_SIGNAL_NUMBERS = {"USR1": "10", "USR2": "12", "TERM": "15", "INT": "2", "HUP": "1", "QUIT": "3"}


def _commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line, as words (quotes group; `;`, `&&`, `||`, `&`, `|` split)."""
    words = split_directive(
        line.replace(";", " ; ").replace("&", " & ").replace("|", " | ").replace("{", " { ")
    )
    out: list[list[str]] = [[]]
    for word in words:
        if word in (";", "&", "|", "{", "then", "do", "else"):
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def signal_seconds(value: str | None) -> int | None:
    """The lead time of an sbatch --signal value `[{R}][B:]SIG[@sig_time]` (default 60 s)."""
    if value is None:
        return None
    _, at, seconds = value.partition("@")
    if not at:
        return 60
    return int(seconds) if is_digits(seconds) else None


def time_limit_seconds(text: str | None) -> int | None:
    """A --time value by Slurm's rules (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; durations.parse_slurm); None for
    no limit (0, INFINITE, UNLIMITED) or garbage (sbatch itself says what is wrong with it)."""
    from ..durations import DurationError, parse_slurm

    if not text:
        return None
    try:
        return (
            parse_slurm(text) or None
        )  # sbatch: "a time limit of zero requests that no time limit be imposed"
    except DurationError:
        return None
