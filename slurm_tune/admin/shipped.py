"""What the package ships for a site, and where `stune-admin install` places each piece.

The files live in prolog/, epilog/, hooks/ and contrib/ of the source tree; a wheel carries them as data files in
<prefix>/share/slurm-tune/ (setup.cfg). An editable install (the checkout) reads them from the tree.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass

from ..errors import StuneError

SHARE_NAME = "slurm-tune"
NODE, CONTROLLER = "node", "controller"
LOGIN = "login"  # a submission host: the profiles and the env file only (no piece below)
EVERY_ROLE = "every"  # a piece both roles need
HOOK_ENV = "hooks/stune-hook-env.sh"  # the shell hooks' shared preamble; they source it from ../ in the tree


@dataclass(frozen=True)
class Piece:
    """One shipped file: its path in the share tree, where it goes (a layout key + name), its mode, and
    which role needs it."""

    source: str  # relative to the share root, e.g. "prolog/10-stune-health"
    place: str  # Layout attribute naming the target directory
    name: str
    mode: int
    role: str
    what: str

    def needed_by(self, roles: set[str]) -> bool:
        return self.role in roles or (self.role == EVERY_ROLE and bool(roles & {NODE, CONTROLLER}))


PIECES = (
    Piece(
        HOOK_ENV,
        "slurm_etc",
        "stune-hook-env.sh",
        0o644,
        EVERY_ROLE,
        "the shell hooks' environment (sourced, not run)",
    ),
    Piece(
        "prolog/10-stune-health", "prolog_dir", "10-stune-health", 0o755, NODE, "Prolog: fast health checks"
    ),
    Piece(
        "prolog/20-stune-jobgpus",
        "prolog_dir",
        "20-stune-jobgpus",
        0o755,
        NODE,
        "Prolog: records the job's GPUs for the sampler",
    ),
    # the same script as the Prolog's (a link in the tree): slurmd tells it which one it is
    Piece(
        "epilog/10-stune-health", "epilog_dir", "10-stune-health", 0o755, NODE, "Epilog: full health checks"
    ),
    Piece(
        "epilog/20-stune-usage", "epilog_dir", "20-stune-usage", 0o755, NODE, "Epilog: the job's GPU usage"
    ),
    Piece(
        "epilog/30-stune-stage",
        "epilog_dir",
        "30-stune-stage",
        0o755,
        NODE,
        "Epilog: releases cache holds, evicts",
    ),
    Piece("prolog/stune-health-run", "slurm_etc", "stune-health-run", 0o755, NODE, "HealthCheckProgram"),
    Piece("prolog/stune-task-prolog", "slurm_etc", "stune-task-prolog", 0o755, NODE, "TaskProlog"),
    Piece(
        "contrib/systemd/stune-gpu-sampler.service",
        "unit_dir",
        "stune-gpu-sampler.service",
        0o644,
        NODE,
        "the GPU sampler (GPU nodes)",
    ),
    Piece(
        "contrib/systemd/stune-idle-policy.service",
        "unit_dir",
        "stune-idle-policy.service",
        0o644,
        NODE,
        "the opt-in idle-GPU policy (GPU nodes)",
    ),
    Piece(
        "contrib/systemd/stune-idle-policy.timer",
        "unit_dir",
        "stune-idle-policy.timer",
        0o644,
        NODE,
        "the idle-GPU policy's 5-minute timer",
    ),
    Piece(
        "contrib/systemd/stune-stage-init.service",
        "unit_dir",
        "stune-stage-init.service",
        0o644,
        NODE,
        "the cache tier's per-node set-up at boot (stune-stage init)",
    ),
    Piece(
        "epilog/stune-usage-slurmctld",
        "slurm_etc",
        "stune-usage-slurmctld",
        0o755,
        CONTROLLER,
        "EpilogSlurmctld",
    ),
    Piece(
        "contrib/systemd/stune-fairshare.service",
        "unit_dir",
        "stune-fairshare.service",
        0o644,
        CONTROLLER,
        "the accountant",
    ),
    Piece(
        "contrib/systemd/stune-fairshare.timer",
        "unit_dir",
        "stune-fairshare.timer",
        0o644,
        CONTROLLER,
        "the accountant's 5-minute timer",
    ),
)


def share_root() -> str:
    """The directory holding prolog/, epilog/ and contrib/: the installed data files, else the checkout."""
    candidates = [
        os.path.join(sysconfig.get_paths()["data"], "share", SHARE_NAME),
        os.path.join(sys.prefix, "share", SHARE_NAME),
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    ]
    for root in candidates:
        if all(os.path.isfile(os.path.join(root, p.source)) for p in PIECES):
            return root
    raise StuneError(
        f"the shipped hooks are not found (looked in {', '.join(candidates)}); "
        "reinstall slurm-tune from its wheel or sdist"
    )


def read_piece(root: str, piece: Piece) -> bytes:
    with open(os.path.join(root, piece.source), "rb") as fh:
        return fh.read()
