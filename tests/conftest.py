"""Shared fixtures. The local Slurm cluster is started once per test session and shared by every test."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import restore_cluster

REPO = Path(__file__).resolve().parent.parent
# Hermetic: stune settings from the tester's shell (or an admin's /etc/default/stune) never reach a test. Only
# the ones that say which cluster and Slurm to use are kept; a hook a test runs without its own env file
# reads none.
_KEEP = ("STUNE_CLUSTER_", "STUNE_KEEP_CLUSTER", "STUNE_SLURM_BIN", "STUNE_DEBUG")
for _name in [n for n in os.environ if n.startswith("STUNE_") and not n.startswith(_KEEP)]:
    del os.environ[_name]
os.environ["STUNE_ENV_FILE"] = "/nonexistent/stune-tests/default-stune"
os.environ["STUNE_PARTITIONS"] = str(REPO / "partitions")
# Submission history goes to a session directory, not to the tester's own ~/.local/state.
os.environ.setdefault("XDG_STATE_HOME", tempfile.mkdtemp(prefix="stune-tests-state-"))
# The stune commands under test are the ones installed beside this interpreter (.venv/bin); jobs inherit it.
os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def cluster():
    """The local 3-node cluster (n1..n3, 4 GPUs each). Started if needed; stopped at the end only if this
    session started it. Skips nothing: a cluster that cannot start fails the tests that need it."""
    from slurm_tune.devcluster import DevCluster

    dev = DevCluster()
    was_running = all(dev.status().values())
    dev.up(install=True)
    os.environ["SLURM_CONF"] = str(dev.layout.slurm_conf)
    yield dev
    if not was_running and not os.environ.get("STUNE_KEEP_CLUSTER"):
        dev.down()


@pytest.fixture
def slurm(cluster, shared_tmp, monkeypatch):
    """A fresh adapter on the cluster; after the test, its jobs are cancelled and its nodes resumed.
    The test runs in a temp dir its jobs can write to, so slurm-N.out files land there."""
    from slurm_tune.devcluster import NODES
    from slurm_tune.slurm import Slurm

    monkeypatch.chdir(shared_tmp)
    handle = Slurm(conf=str(cluster.layout.slurm_conf), timeout=20)
    yield handle
    restore_cluster(handle, NODES)


@pytest.fixture
def shared_tmp(tmp_path):
    """A temp dir the unprivileged test users can write to (job output files)."""
    tmp_path.chmod(0o777)
    for parent in tmp_path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o001)
    return tmp_path
