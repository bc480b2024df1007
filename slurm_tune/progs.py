"""The names of stune's commands, for the modules that print one and would otherwise import each other
for it (cli/health.py and its help text, cli/health_help.py; sbatch/submit.py and sbatch/dryrun.py)."""

from __future__ import annotations

HEALTH = "stune-health"
SBATCH = "stune-sbatch"
