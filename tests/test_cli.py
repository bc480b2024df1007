"""Every command is installed, and answers --help with its usage instead of failing obscurely."""

from __future__ import annotations

import shutil
import subprocess

import pytest

COMMANDS = {  # command: words its --help output must contain
    "stune-sbatch": "Usage: sbatch",  # a drop-in: sbatch's own help
    "stune-health": "stune-health capture",
    "stune-stage": "usage: stune-stage",
    "stune-fairshare": "usage: stune-fairshare",
    "stune-admin": "usage: stune-admin",
    "stune-devcluster": "usage: stune-devcluster",
    "stune-env": "eval",
    "stune-bind": "NUMA node",
    "stune-gpu-sampler": "usage: stune-gpu-sampler",
}


@pytest.mark.parametrize("command", [*COMMANDS, "stune-task-prolog"])
def test_command_is_installed(command):
    assert shutil.which(command), f"{command} is not on PATH: run scripts/setup.sh (pip install -e .)"


def _shows_usage(command: str, words: str) -> None:
    proc = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert words in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command, words", [(c, w) for c, w in COMMANDS.items() if c != "stune-sbatch"])
def test_help_shows_usage(command, words):
    _shows_usage(command, words)


@pytest.mark.cluster
def test_sbatch_help_is_sbatchs_own(cluster):  # sbatch wants a slurm.conf even for --help
    _shows_usage("stune-sbatch", COMMANDS["stune-sbatch"])
