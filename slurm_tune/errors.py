"""The one error family stune raises, and the one table of exit statuses. Only entry points (`cli/`) turn errors
into messages and exit statuses; commands return the EXIT_ names below, never bare numbers (README's "Exit
status" section is rendered from TABLE). Kept here, with no imports, because every entry point, the prolog
included, already imports this module."""

from __future__ import annotations


class StuneError(Exception):
    """Base of every error stune raises on purpose. str() is one line, fit for a user."""


class ConfigError(StuneError):
    """A profile or config file is wrong. Names the file, line and key path."""

    def __init__(self, path: str, line: int | None, key: str, problem: str):
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


class NoProfileError(ConfigError):
    """No profile for the partition: not a mistake in a file, a partition stune does not tune. stune-sbatch
    then submits plainly and the TaskProlog stays silent; caught by this type, never by its words."""

    def __init__(self, directory: str, partition: str, known: str):
        self.partition = partition
        super().__init__(directory, None, "", f"no profile for partition {partition!r} (profiles: {known})")


class CorruptFileError(ConfigError):
    """A file stune wrote and reads back (a ledger, a state file, a history) holds what stune never writes: a
    number that is not finite or out of range, a wrong type. Names the file and the key; the file is kept."""


class FileWriteError(StuneError, OSError):
    """A file could not be written whole (a full disk, a quota, a read-only filesystem): one line naming the
    file. An OSError too (errno, strerror, filename), so code that catches OSError around a write still does."""

    def __init__(self, path: str, exc: OSError):
        OSError.__init__(self, exc.errno, exc.strerror or str(exc), str(path))

    def __str__(self) -> str:
        return f"{self.filename}: cannot write: {self.strerror}"


class UnsafePathError(StuneError):
    """A path root was asked to use is not safe: wrong type, owner, link count or permissions (trust.py's
    rules, enforced by safeio)."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


class SlurmError(StuneError):
    """A Slurm command failed or timed out. Carries the command, its exit code and Slurm's own message."""

    def __init__(self, command: list[str], returncode: int | None, message: str):
        self.command, self.returncode = list(command), returncode
        self.message = message.strip()
        code = "timed out" if returncode is None else f"failed (exit {returncode})"
        first = self.message.splitlines()[0] if self.message else "(no message)"
        super().__init__(f"{self.command[0] if self.command else 'slurm'} {code}: {first}")


class SlurmFormatError(SlurmError):
    """A Slurm command succeeded, but its output is in a layout stune does not know (a release that changed
    it, or a broken install). Names the whole command and the Slurm release, and says it is the format."""

    def __init__(self, command: list[str], release: str | None, problem: str):
        self.command, self.returncode, self.release = list(command), 0, release
        self.message = problem.strip()
        first = self.message.splitlines()[0] if self.message else "(no detail)"
        StuneError.__init__(
            self,
            f"output of `{' '.join(self.command)}` from Slurm {release or '(release unknown)'}"
            f" is not in a format stune knows: {first}",
        )


# ---- exit statuses ------------------------------------------------------------------------------------------

EXIT_OK = 0
EXIT_ERROR = 1  # a StuneError: bad input, a Slurm call failed, a file cannot be read; doctor found errors
EXIT_USAGE = 2  # a usage error (argparse's own status)
EXIT_ATTENTION = 3  # done, but something needs a person: an edited file kept, outliers, lemons
EXIT_UNKNOWN = 4  # health verdict: a check could not judge
EXIT_DEGRADED = 5  # health verdict: half-broken (kept out of multi-node jobs)
EXIT_FAIL = 6  # health verdict: broken
EXIT_BREAKER = 7  # `stune-health run`: the circuit breaker held back a drain
EXIT_HOOK_FAIL = 10  # a prolog/epilog failing the job on purpose (not 1: a Python that cannot start exits 1)
EXIT_INTERNAL = 70  # a bug in stune (EX_SOFTWARE); a hook exits 0 instead
EXIT_CANNOT_RUN = 126  # stune-bind: the command is not executable (the shell's convention)
EXIT_NOT_FOUND = 127  # stune-bind: the command is not found (the shell's convention)
EXIT_INTERRUPTED = 130  # Ctrl-C

# The health verdicts' exit statuses (`stune-health check`).
EXIT_BY_STATUS = {"ok": EXIT_OK, "unknown": EXIT_UNKNOWN, "degraded": EXIT_DEGRADED, "fail": EXIT_FAIL}

# (name, status, meaning, who uses it): README's table, row by row.
TABLE = (
    ("EXIT_OK", EXIT_OK, "done; a health check judged ok", "every command"),
    (
        "EXIT_ERROR",
        EXIT_ERROR,
        "an error, said in one line: bad input or profile, a Slurm call failed, a file "
        "cannot be read or written; `stune-admin doctor` found errors; `stune-stage "
        "status` found a broken tier",
        "every command",
    ),
    ("EXIT_USAGE", EXIT_USAGE, "usage error: an unknown option or a missing argument", "every command"),
    (
        "EXIT_ATTENTION",
        EXIT_ATTENTION,
        "done, but a person should look: `stune-admin install`/`uninstall` kept "
        "an edited file; `stune-sweep run`/`judge` found outliers, `stune-sweep scaling` a knee, a failure "
        "or a single-node curve that did not pass; `stune-validate run` a layer that did not pass (failed, "
        "unknown or unavailable), `stune-validate status` a stage that fails or needs attention; "
        "`stune-health lemons` found lemons",
        "stune-admin, stune-sweep, stune-validate, stune-health lemons",
    ),
    ("EXIT_UNKNOWN", EXIT_UNKNOWN, "health verdict unknown: a check could not judge", "stune-health check"),
    ("EXIT_DEGRADED", EXIT_DEGRADED, "health verdict degraded (half-broken)", "stune-health check"),
    ("EXIT_FAIL", EXIT_FAIL, "health verdict fail", "stune-health check"),
    ("EXIT_BREAKER", EXIT_BREAKER, "the circuit breaker held back a drain", "stune-health run"),
    (
        "EXIT_HOOK_FAIL",
        EXIT_HOOK_FAIL,
        "a hook fails the job on purpose (an enforced failure); every other "
        "outcome of a hook, a bug or a bad profile included, is 0",
        "stune-health prolog/epilog",
    ),
    (
        "EXIT_INTERNAL",
        EXIT_INTERNAL,
        "a bug in stune (EX_SOFTWARE; `STUNE_DEBUG=1` shows the traceback); hooks exit 0 instead",
        "every command but the hooks",
    ),
    (
        "EXIT_CANNOT_RUN",
        EXIT_CANNOT_RUN,
        "the command to run is not executable (as in a shell)",
        "stune-bind",
    ),
    ("EXIT_NOT_FOUND", EXIT_NOT_FOUND, "the command to run is not found (as in a shell)", "stune-bind"),
    ("EXIT_INTERRUPTED", EXIT_INTERRUPTED, "interrupted (Ctrl-C)", "every command"),
)


def markdown_table() -> str:
    """README's exit-status table (tests/test_convention_cli.py checks README holds exactly this)."""
    rows = ["| status | name | meaning | used by |", "| --- | --- | --- | --- |"]
    rows += [f"| {code} | `{name}` | {meaning} | {who} |" for name, code, meaning, who in TABLE]
    return "\n".join(rows) + "\n"
