"""The names of stune's commands, for the modules that print one and would otherwise import each other
for it (cli/health.py and its help text, cli/health_help.py; sbatch/submit.py and sbatch/dryrun.py;
cli/admin.py and cli/admin_install.py)."""

from __future__ import annotations

ADMIN = "stune-admin"
HEALTH = "stune-health"
SBATCH = "stune-sbatch"
