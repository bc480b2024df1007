"""No module of slurm_tune or stune_dev is over 450 lines (issue 23). A longer one is split by a clear boundary
(a cohesive group of functions or classes into a module whose docstring says what it holds), not squeezed:
sbatch/plan.py was 484 lines, admin/install.py 472, stune_dev/devcluster.py 592."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slurm_tune", "stune_dev")
MAX_LINES = 450


def test_no_module_in_slurm_tune_or_stune_dev_is_over_450_lines():
    modules = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    assert {p.relative_to(REPO).parts[0] for p in modules} == set(PACKAGES) and len(modules) > 100
    long = {
        str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines (split each by a clear boundary): {long}"
