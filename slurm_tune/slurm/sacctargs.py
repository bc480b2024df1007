"""How stune asks sacct: the field list with its one free-text field last, and the command line around it
(used by Slurm.sacct and Slurm.sacct_dump, accounting.py)."""

from __future__ import annotations

# sacct fields whose text is free (may hold '|'); at most one is allowed, and it is always asked for last.
FREE_TEXT_FIELDS = frozenset(
    f.lower()
    for f in (
        "AdminComment",
        "Comment",
        "SystemComment",
        "JobName",
        "Constraints",
        "Reason",
        "WorkDir",
        "SubmitLine",
        "Reservation",
        "WCKey",
    )
)


def free_text_last(fields: list[str]) -> list[str]:
    """The sacct field list with its one free-text field (if any) moved last: it is split off with a bounded
    split, so a '|' inside a comment cannot shift the columns."""
    free = [f for f in fields if f.lower() in FREE_TEXT_FIELDS]
    if len(free) > 1:
        raise ValueError(f"at most one free-text sacct field, got {free}")
    return [f for f in fields if f not in free] + free


def sacct_argv(ordered: list[str], flags: list[str], allocations: bool, start, end) -> list[str]:
    """`sacct -P` for the fields `ordered` (free_text_last's order): allocations only (-X) unless asked, in the
    time window [start, end] when given."""
    argv = ["sacct", "-P", "--noconvert", *flags, f"--format={','.join(ordered)}"]
    if allocations:
        argv.append("-X")
    if start is not None:
        argv.append(f"--starttime={start}")
    if end is not None:
        argv.append(f"--endtime={end}")
    return argv
