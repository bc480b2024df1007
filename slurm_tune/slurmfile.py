"""slurm.conf read as the admin wrote it: parameters (last one wins, as in Slurm), records (NodeName=...,
PartitionName=...), and the files it Includes. The one reader of the file: `stune-admin install` and
`doctor` (admin/slurmconf.py judges what it read), the cli_filter's render, and the TaskProlog, which asks for
a plain job whether this node's slurm.conf enables stune's cli_filter. That last is a hot path (docs/speed.md):
only `os` at module level; `glob` for an Include with a wildcard, `re` for a record line, each where used.
"""

from __future__ import annotations

import os

from .frozen import Record

RECORD_KEYS = frozenset(("nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"))
# Slurm's defaults for the settings judged here, when slurm.conf does not set them.
DEFAULTS = {
    "prologflags": "",
    "prioritytype": "priority/basic",
    "prioritycalcperiod": "5",
    "healthcheckinterval": "0",
    "healthchecknodestate": "ANY",
    "schedulerparameters": "",
    "accountingstoragetres": "",
    "accountingstorageenforce": "",
    "priorityweightfairshare": "0",
    "taskplugin": "",
}


class Setting(Record):
    """One parameter as written: key, value, the file and line it is on."""

    __slots__ = ("key", "value", "path", "line")
    key: str
    value: str
    path: str
    line: int


class SlurmConf:
    """Parameters (last one wins, as in Slurm) and records (NodeName=..., PartitionName=...)."""

    def __init__(self, path: str, text: str | None = None):
        """`text`: judge this text as the file at `path` (nothing is read)."""
        self.path = path
        self.params: dict[str, Setting] = {}
        self.every: dict[str, list[Setting]] = {}  # keys given more than once (SlurmctldHost for backups)
        self._record_lines: list[str] = []  # parsed at first use: the TaskProlog asks for one parameter only
        self.problems: list[str] = []
        self.text = ""
        self.found = False
        if text is not None:
            self.text, self.found = text, True
            self._parse(path, text, depth=0)
            return
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                self.text = fh.read()
            self.found = True
        except OSError as exc:
            self.problems.append(f"{path}: cannot read: {exc.strerror}")
            return
        self._parse(path, self.text, depth=0)

    def _parse(self, path: str, text: str, depth: int) -> None:
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            head, _, rest = line.partition(" ")
            if head.lower() == "include" and rest.strip():
                self._include(path, rest.strip(), depth)
                continue
            key, sep, value = line.partition("=")
            if not sep:
                continue
            key = key.strip()
            if key.lower() in RECORD_KEYS:
                self._record_lines.append(line)
            else:
                setting = Setting(key, value.strip(), path, number)
                self.params[key.lower()] = setting
                self.every.setdefault(key.lower(), []).append(setting)

    def _include(self, path: str, target: str, depth: int) -> None:
        if depth > 8:
            self.problems.append(f"{path}: Include nested too deep")
            return
        if "\0" in target:
            self.problems.append(f"{path}: Include names a path with a NUL byte")
            return
        target = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
        names = [target]
        if any(c in target for c in "*?["):
            import glob

            names = sorted(glob.glob(target)) or [target]
        for name in names:
            try:
                with open(name, encoding="utf-8", errors="replace") as fh:
                    self._parse(name, fh.read(), depth + 1)
            except OSError as exc:
                self.problems.append(f"{name}: Include cannot be read: {exc.strerror}")

    def get(self, key: str) -> str:
        s = self.params.get(key.lower())
        return s.value if s else DEFAULTS.get(key.lower(), "")

    def where(self, key: str) -> str:
        s = self.params.get(key.lower())
        return f"{s.path}:{s.line}" if s else f"{self.path} (not set)"

    @property
    def records(self) -> list[dict[str, str]]:
        return [_record(line) for line in self._record_lines]

    def partitions(self) -> dict[str, dict[str, str]]:
        return {r["PartitionName"]: r for r in self.records if "PartitionName" in r}

    def nodes(self) -> list[dict[str, str]]:
        return [r for r in self.records if "NodeName" in r]


def _record(line: str) -> dict[str, str]:
    import re

    rec = {}
    for token in re.findall(r'(\S+?=(?:"[^"]*"|\S*))', line):
        k, _, v = token.partition("=")
        rec[k] = v.strip('"')
    return rec
