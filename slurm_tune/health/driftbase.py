"""The drift family's finding (health/drift.py, driftpci.py, driftgpu.py): one setting on one subject, and
the health Result it becomes. Hot path (`stune-health check`): plain classes only (docs/speed.md)."""

from __future__ import annotations

from ..frozen import Record
from . import result


class Drift(Record):
    """One setting on one subject. setting: the doctor table's row (`cpu_governor`, `sysctl vm.swappiness`);
    what: how a message names it (`CPU governor`, `gpu3 power limit`); have / expected: short texts; fix:
    the command that puts it right; note: more words for the message (why, how to make it last)."""

    __slots__ = ("setting", "subject", "status", "what", "have", "expected", "fix", "note")
    setting: str
    subject: str
    status: str
    what: str
    have: str
    expected: str
    fix: str
    note: str

    def __init__(self, setting, subject, status, what, have, expected, fix="", note=""):
        Record.__init__(self, setting, subject, status, what, have, expected, fix, note)

    def result(self) -> result.Result:
        check = f"drift.{self.setting.split()[0]}"
        if self.status == result.DEGRADED:
            message = f"{self.what} {self.have}; expected {self.expected}; fix: {self.fix}"
            return result.degraded(
                check,
                self.subject,
                message + (f" {self.note}" if self.note else ""),
                f"{self.what} {self.have}: {self.fix}",
            )
        if self.status == result.UNKNOWN:
            return result.unknown(
                check, self.subject, f"{self.what}: {self.have}", f"{self.what}: {self.have}"
            )
        return result.ok(check, self.subject, f"{self.what} {self.have}; expected {self.expected}")


def ok(setting, subject, what, have, expected) -> Drift:
    return Drift(setting, subject, result.OK, what, have, expected)


def unknown(setting, subject, what, why, expected="") -> Drift:
    return Drift(setting, subject, result.UNKNOWN, what, why, expected)
