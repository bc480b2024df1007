"""What `stune-admin doctor` reports: findings, one per line, each an error, a warning or ok (with a fix)."""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING, OK = "error", "warning", "ok"


@dataclass
class Finding:
    severity: str
    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f"  -> {self.fix}" if self.fix and self.severity != OK else ""
        return f"{self.severity:7s} {self.subject}: {self.message}{fix}"
