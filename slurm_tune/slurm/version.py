"""The Slurm release, and the releases at which a command's output changes shape.

One adapter serves Slurm 22.05 through 26.05 (docs/slurm-versions.md). The adapter reads the release once per
process (`sinfo --version`) and only for the methods whose command depends on it; each quirk below names the
first release that behaves the new way.
"""

from __future__ import annotations

import sys
from collections import namedtuple

from ..errors import SlurmFormatError
from ..streams import say
from ..text import is_digits

# The oldest and the newest series the whole test suite runs on (scripts/test.sh); the adapter says once per
# process when the cluster runs a newer one.
OLDEST_TESTED = (22, 5)
NEWEST_TESTED = (26, 5)
_WARNED: set[str] = set()

# From 23.02, `sinfo --json` groups nodes by partition and state instead of listing them, and
# `scontrol --json show node` (data_parser) lists them: nodes() reads the latter.
NODES_FROM_SCONTROL_JSON = (23, 2)
# From 23.11, sacctmgr's Lineage path replaces lft as the association tree's order.
ASSOC_ORDER_BY_LINEAGE = (23, 11)
# From 25.11.3, `sbatch --requeue=expedite` (SlurmctldParameters=enable_expedited_requeue): Slurm requeues such a
# job itself, at once, first in the queue and on its held nodes, when an epilog fails or a node fails, and holds
# it (REQUEUE_HOLD) when it failed while every epilog passed. 25.11.0-25.11.2 requeue it after exit 0 as well
# (fixed by SchedMD's 66f074b4df), so stune offers it from 25.11.3 on.
EXPEDITED_REQUEUE = (25, 11, 3)


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
    raise SlurmFormatError(
        argv or ["sinfo", "--version"], None, f"cannot tell the Slurm release from {text.strip()[:80]!r}"
    )


def warn_if_untested(version: SlurmVersion, stream=None) -> bool:
    """Say once per process, on stderr, that `version` is of a series newer than the newest stune is tested
    on (its output may have changed shape). True when it said so now."""
    if tuple(version[:2]) <= NEWEST_TESTED or version.release in _WARNED:
        return False

    _WARNED.add(version.release)
    return say(
        sys.stderr if stream is None else stream,
        f"stune: Slurm {version.release} is newer than {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]:02d}, the newest "
        f"release stune is tested on; an output stune does not know is reported as an error naming "
        f"the command",
    )


def document_release(doc) -> str | None:
    """The release a Slurm JSON document names in its meta (22.05: meta.Slurm, 23.02+: meta.slurm)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
        return None
    slurm = doc["meta"].get("slurm") or doc["meta"].get("Slurm")
    release = slurm.get("release") if isinstance(slurm, dict) else None
    return release if isinstance(release, str) else None
