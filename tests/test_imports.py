"""The hot paths' import rule (docs/speed.md), checked for every hot entry point, and the launchers that
carry the hot commands (bin/, setup.cfg `scripts`).

Each entry point runs its real work in a fresh `python -I -S` with only this checkout on sys.path
(tests/importcheck.py), so the answer is the same under any kind of install.
"""

from __future__ import annotations

import configparser
import importlib
import os
import stat
import sys
from pathlib import Path

import healthkit as kit
import hwtrees
import pytest
from importcheck import HEAVY, loaded_by

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCHERS = REPO / "bin"

# Known breaches of the rule, each with its cost, until the module that causes it is changed. An entry here
# is a measured miss reported in README's Speed table, not a licence.
KNOWN = {
    # collections for namedtuple records: ~0.2x of a bare start (collections itself, then each class)
}


@pytest.fixture
def world(tmp_path):
    """One node and one submission host: a DGX-A100 and a RoCE sysfs tree, GPU snapshot, state and cache
    directories, the repo's profiles, and an `sbatch` stand-in on PATH (what stune imports does not depend
    on which sbatch answers; the cluster tests submit to the real one)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho 4242\n")
    (fake / "sbatch").chmod(0o755)
    hwtrees.h100_roce(tmp_path / "roce")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUNE_", "SLURM"))}
    env.update(
        PATH=f"{fake}:{env.get('PATH', '/usr/bin:/bin')}",
        STUNE_PARTITIONS=str(REPO / "partitions"),
        STUNE_CACHE_DIR=str(tmp_path / "cache"),
        STUNE_HISTORY=str(tmp_path / "history.jsonl"),
        STUNE_SYSFS_ROOT=str(kit.tree(tmp_path / "root", "hdr")),
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
        STUNE_STATE_DIR=str(tmp_path / "state"),
        STUNE_HEALTH_PARTITION="hdr",
        SLURMD_NODENAME="n7",
        STUNE_ENV_FILE="/dev/null",
    )
    return {"env": env, "tmp": tmp_path}


def _taskprolog_env(world):
    return dict(
        world["env"],
        SLURM_JOB_PARTITION="roce",
        SLURM_LOCALID="0",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="n[1-2]",
        SLURMD_NODENAME="n1",
        STUNE_SYSFS_ROOT=str(world["tmp"] / "roce"),
    )


SNAPSHOT = REPO / "tests/fixtures/snapshots/dgx-a100-ib.json"
# name: (code that does the entry point's real work, env maker)
ENTRY_POINTS = {
    "prolog hook": (
        f"from slurm_tune.health.prologhook import main\nassert main(None, {str(BIN)!r}) == 0",
        lambda w: w["env"],
    ),
    "stune-health prolog": (
        "from slurm_tune.cli.health import main\nassert main(['prolog']) == 0",
        lambda w: w["env"],
    ),
    "stune-health check": (
        "from slurm_tune.cli.health import main\n"
        f"assert main(['check', '--snapshot', {str(SNAPSHOT)!r}, '--partition', 'hdr']) == 0",
        lambda w: w["env"],
    ),
    "stune-sbatch": (
        "from slurm_tune.cli.sbatch import main\n"
        "assert main(['-p', 'roce', '--parsable', '-H', '--wrap', 'true']) == 0",
        lambda w: w["env"],
    ),
    # a user's tokens are recorded as digests: without hashlib (its OpenSSL load costs ~0.4x of a bare start)
    "stune-sbatch (tokens in the environment)": (
        "from slurm_tune.cli.sbatch import main\n"
        "assert main(['-p', 'roce', '--parsable', '-H', '--wrap', 'true']) == 0",
        lambda w: dict(w["env"], HF_TOKEN="hf_abc", WANDB_API_KEY="0" * 40),
    ),
    "stune-task-prolog": (
        "from slurm_tune.cli.taskprolog import main\nassert main([]) == 0",
        _taskprolog_env,
    ),
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_hot_entry_point_follows_the_import_rule(world, name):
    code, make_env = ENTRY_POINTS[name]
    env = make_env(world)
    loaded_by(code, env)  # the first run fills the profile cache, as every run after a node's first finds it
    loaded = loaded_by(code, env)
    assert any(m.startswith("slurm_tune.") for m in loaded), "the entry point did not run"
    breaches = (loaded & HEAVY) - KNOWN.get(name, set())
    assert not breaches, (
        f"{name} imports {sorted(breaches)}: import them where they are needed (docs/speed.md)"
    )
    stale = KNOWN.get(name, set()) - loaded
    assert not stale, f"{name} no longer imports {sorted(stale)}: remove it from KNOWN"


def test_the_prolog_makes_no_slurm_call_nor_nvml_and_the_hook_skips_the_cli_layer(world):
    hook = loaded_by(ENTRY_POINTS["prolog hook"][0], world["env"])
    assert "slurm_tune.health.node" in hook and "slurm_tune.cli.health" not in hook
    cli = loaded_by(ENTRY_POINTS["stune-health prolog"][0], world["env"])
    assert not (hook | cli) & {"slurm_tune.slurm", "slurm_tune.hw.nvml"}


def test_judging_a_snapshot_loads_no_hook_no_slurm_and_no_nvml_code(world):
    check = loaded_by(ENTRY_POINTS["stune-health check"][0], world["env"])
    assert {"slurm_tune.health.offline", "slurm_tune.health.judge"} <= check
    assert not check & {
        "slurm_tune.health.node",
        "slurm_tune.health.prologhook",
        "slurm_tune.health.collect",
        "slurm_tune.slurm",
        "slurm_tune.hw.nvml",
    }


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def test_each_hot_command_ships_as_a_launcher_pip_points_at_its_interpreter():
    cfg = _setup_cfg()
    scripts = cfg["options"]["scripts"].split()
    console = {
        line.split("=")[0].strip()
        for line in cfg["options.entry_points"]["console_scripts"].splitlines()
        if line.strip()
    }
    assert sorted(scripts) == sorted(f"bin/{p.name}" for p in LAUNCHERS.iterdir())
    tested = {name.split()[0] for name in ENTRY_POINTS if name.startswith("stune-")}
    for script in scripts:
        path = REPO / script
        name = path.name
        assert name not in console, (
            f"{name} is both a launcher and a console script: pip would write one over the other"
        )
        assert path.stat().st_mode & stat.S_IXUSR
        lines = path.read_text().splitlines()
        # `#!python` exactly: setuptools and pip replace it with the installing interpreter (and drop any flags)
        assert lines[0] == "#!python"
        code = [line for line in lines[1:] if line and not line.startswith("#")]
        module = code[-2].split()[1]
        # the template: nothing between the interpreter's start and the command (no code cache: issue 23)
        assert code == ["import sys", f"from {module} import main", "sys.exit(main())"], (
            f"{script}: not the template"
        )
        assert name in tested, f"{name}: a hot command without an entry in ENTRY_POINTS"
        assert callable(importlib.import_module(module).main)
