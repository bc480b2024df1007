"""The Slurm release, and the releases at which a command's output changes shape.

One adapter serves Slurm 22.05 through 25.x (docs/slurm-versions.md). The adapter reads the release once per
process (`sinfo --version`) and only for the methods whose command depends on it; each quirk below names the
first release that behaves the new way.
"""
from __future__ import annotations

from collections import namedtuple

from ..errors import SlurmError
from ..text import is_digits

# From 23.02, `sinfo --json` groups nodes by partition and state instead of listing them, and
# `scontrol --json show node` (data_parser) lists them: nodes() reads the latter.
NODES_FROM_SCONTROL_JSON = (23, 2)
# From 23.11, sacctmgr's Lineage path replaces lft as the association tree's order.
ASSOC_ORDER_BY_LINEAGE = (23, 11)


class SlurmVersion(namedtuple("SlurmVersion", "major minor micro release")):
    """A Slurm release; compares with tuples: `version >= (23, 2)`."""

    __slots__ = ()

    def __lt__(self, other):
        return tuple(self[:3]) < tuple(other)

    def __le__(self, other):
        return tuple(self[:3]) <= tuple(other)

    def __gt__(self, other):
        return tuple(self[:3]) > tuple(other)

    def __ge__(self, other):
        return tuple(self[:3]) >= tuple(other)

    def __str__(self):
        return self.release


def parse_version(text: str, argv: list[str] | None = None) -> SlurmVersion:
    """`sinfo --version` output ('slurm 24.11.5', 'slurm-wlm 22.05.8', 'slurm 25.05.0-0rc1') to a version."""
    words = text.split()
    if len(words) == 2 and words[0] in ("slurm", "slurm-wlm"):
        parts = words[1].split("-")[0].split(".")
        if len(parts) == 3 and all(is_digits(p) for p in parts):
            return SlurmVersion(int(parts[0]), int(parts[1]), int(parts[2]), words[1])
    raise SlurmError(argv or ["sinfo", "--version"], 0, f"cannot tell the Slurm release from {text.strip()[:80]!r}")


def document_release(doc) -> str | None:
    """The release a Slurm JSON document names in its meta (22.05: meta.Slurm, 23.02+: meta.slurm)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
        return None
    slurm = doc["meta"].get("slurm") or doc["meta"].get("Slurm")
    release = slurm.get("release") if isinstance(slurm, dict) else None
    return release if isinstance(release, str) else None
