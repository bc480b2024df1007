"""What a check returns: frozen.Record subclasses, not namedtuples or dataclasses: this module is on the
prolog path (the hot-path rule, docs/speed.md)."""

from __future__ import annotations

from ..frozen import Record

OK, WARNING, UNKNOWN, DEGRADED, FAIL = "ok", "warning", "unknown", "degraded", "fail"
# Worst first when sorting; a verdict is its worst result. Unknown ranks below degraded: a check that could
# not tell must never weigh more than one that saw a real (if mild) problem. A warning is a finding about the
# policy, not the node (e.g. no firmware rule matched an HCA): shown everywhere, but the node stays ok.
RANK = {OK: 0, WARNING: 0, UNKNOWN: 1, DEGRADED: 2, FAIL: 3}
STATUSES = (OK, WARNING, UNKNOWN, DEGRADED, FAIL)


class Result(Record):
    """One finding.

    check:   the check's name, family first (`ib.state`, `gpu.ecc`, `versions.hca_firmware`).
    subject: what was looked at (`mlx5_2/1`, `gpu3 0000:47:00.0`, `node`).
    status:  ok, degraded, fail or unknown.
    message: one human line: what was seen, and what was expected.
    reason:  a short form for a Slurm drain reason or node comment (`mlx5_2/1 state DOWN`); for unknown, what
             could not be read (`mlx5_0/1 unreadable state '1: DWN'`); '' when ok.
    """

    __slots__ = ("check", "subject", "status", "message", "reason")
    check: str
    subject: str
    status: str
    message: str
    reason: str

    def __init__(self, check: str, subject: str, status: str, message: str, reason: str = ""):
        Record.__init__(self, check, subject, status, message, reason)

    def line(self) -> str:
        return f"{self.status:8s} {self.check:22s} {self.subject}: {self.message}"

    def as_dict(self) -> dict:
        return self._asdict()


def ok(check: str, subject: str, message: str) -> Result:
    return Result(check, subject, OK, message, "")


def warning(check: str, subject: str, message: str) -> Result:
    return Result(check, subject, WARNING, message, "")


def unknown(check: str, subject: str, message: str, reason: str = "") -> Result:
    """Could not tell. The reason says what could not be read (by default the subject and the message), so
    an unknown verdict is never silent in the text, JSON or Prometheus outputs."""
    return Result(check, subject, UNKNOWN, message, reason or f"{subject}: {message}")


def degraded(check: str, subject: str, message: str, reason: str) -> Result:
    return Result(check, subject, DEGRADED, message, reason)


def fail(check: str, subject: str, message: str, reason: str) -> Result:
    return Result(check, subject, FAIL, message, reason)


def worst(results) -> str:
    status = OK
    for r in results:
        if RANK[r.status] > RANK[status]:
            status = r.status
    return status


class Verdict(Record):
    """All results of one evaluation. `reason` summarises the worst results for Slurm, e.g.
    `mlx5_2/1 state DOWN` or `mlx5_2/1 state DOWN (+2 more)`."""

    __slots__ = ("status", "results", "reason")
    status: str
    results: list[Result]
    reason: str


REASON_MAX = 120  # Slurm keeps long reasons, but sinfo/squeue columns and pagers do not


def make_verdict(results: list) -> Verdict:
    status = worst(results)
    reason = ""
    if status in (FAIL, DEGRADED, UNKNOWN):
        worst_ones = [r for r in results if r.status == status]
        reason = worst_ones[0].reason or worst_ones[0].message
        if len(worst_ones) > 1:
            reason += f" (+{len(worst_ones) - 1} more)"
        if len(reason) > REASON_MAX:
            reason = reason[: REASON_MAX - 3] + "..."
    return Verdict(status, results, reason)
