"""Shared fixtures. The local Slurm cluster is started once per test session and shared by every test."""

from __future__ import annotations

import hashlib
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
_KEEP = ("STUNE_CLUSTER_", "STUNE_KEEP_CLUSTER", "STUNE_SLURM", "STUNE_DEBUG")  # STUNE_SLURM* picks the Slurm
for _name in [n for n in os.environ if n.startswith("STUNE_") and not n.startswith(_KEEP)]:
    del os.environ[_name]
os.environ["STUNE_ENV_FILE"] = "/nonexistent/stune-tests/default-stune"
os.environ["STUNE_PARTITIONS"] = str(REPO / "partitions")
# Submission history goes to a session directory, not to the tester's own ~/.local/state.
os.environ.setdefault("XDG_STATE_HOME", tempfile.mkdtemp(prefix="stune-tests-state-"))
# The stune commands under test are the ones installed beside this interpreter (.venv/bin); jobs inherit it.
os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"


def _slurm_install():
    """The Slurm the cluster tests run on: STUNE_SLURM (22.05, Debian's packages, or 24.11, the build of
    scripts/build-slurm.sh). A built one's commands go first on PATH for the tests and their jobs, and
    STUNE_SLURM_BIN tells stune's own commands (Slurm.from_env) where they are."""
    from stune_dev.devcluster import SlurmInstall

    install = SlurmInstall.choose()
    if install.bin_dir:
        os.environ["PATH"] = f"{install.bin_dir}:{os.environ['PATH']}"
        os.environ["STUNE_SLURM_BIN"] = install.bin_dir
    return install


SLURM_INSTALL = _slurm_install()
_RELEASE_USED: list[str] = []


def pytest_configure(config):
    """Temp dirs under a base of this cluster's own, not /tmp/pytest-of-root: every other pytest run by root
    on the machine re-creates that one with mode 0700, which locks the test users' jobs out of their output
    directories mid-run ("Could not open stdout file ... Permission denied")."""
    if config.option.basetemp is None and os.geteuid() == 0:
        name = os.path.basename(os.environ.get("STUNE_CLUSTER_DIR", "/var/tmp/stune-cluster").rstrip("/"))
        # one base per checkout too: pytest empties its base at start, so a run in another worktree (even one
        # without the cluster) would delete this run's files under it
        checkout = hashlib.sha256(str(config.rootpath).encode()).hexdigest()[:8]
        config.option.basetemp = os.path.join(tempfile.gettempdir(), f"stune-pytest-{name}-{checkout}")


def pytest_report_header(config):
    where = SLURM_INSTALL.prefix or "Debian packages"
    return (
        f"slurm: {SLURM_INSTALL.series} ({where}); cluster {os.environ.get('STUNE_CLUSTER_DIR', '(default dir)')}"
        f" port base {os.environ.get('STUNE_CLUSTER_PORT_BASE', '(default)')}"
    )


def pytest_terminal_summary(terminalreporter):
    if _RELEASE_USED:
        terminalreporter.write_line(f"cluster tests ran on Slurm {_RELEASE_USED[0]}")
    else:
        terminalreporter.write_line("no cluster test ran (no Slurm release used)")


# Test modules that run the installed Slurm's own commands (sbatch --help, scontrol --version) without the
# cluster: with the cluster tests, what a second Slurm release is tested on (scripts/test.sh's `slurm` scope).
# The rest read captured output or nothing of Slurm's, the same on every release.
SLURM_COMMAND_MODULES = frozenset(
    {
        "test_clifilter.py",
        "test_convention_cli.py",
        "test_devcluster.py",
        "test_sbatch_dryrun.py",
        "test_sbatch_history.py",
        "test_sbatch_options.py",
        "test_sbatch_plugins.py",
        "test_steps_history.py",
    }
)


def pytest_collection_modifyitems(config, items):
    """A test that needs the cluster must say so: `-m "not cluster"` must never boot Slurm. The modules that
    run Slurm's commands are marked `slurm`."""
    for item in items:
        if item.path.name in SLURM_COMMAND_MODULES:
            item.add_marker(pytest.mark.slurm)
    unmarked = [
        item.nodeid
        for item in items
        if "cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("cluster") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use the cluster fixture but are not marked `cluster`: " + ", ".join(unmarked)
        )


@pytest.fixture(scope="session")
def cluster():
    """The local 3-node cluster (n1..n3, 4 GPUs each). Started if needed; stopped at the end only if this
    session started it. Skips nothing: a cluster that cannot start fails the tests that need it."""
    from stune_dev.devcluster import DevCluster

    dev = DevCluster(install=SLURM_INSTALL)
    was_running = all(dev.status().values())
    # slurm.conf fragments are tests' own: one here now was left by an interrupted run (a CI run on 26.05 once
    # failed whole on an EpilogSlurmctld in a temp dir long gone), so the session starts without them
    left = dev.clear_fragments()
    dev.up(install=True)
    if left and was_running:  # settings slurmctld reads only at start (EpilogSlurmctld) go with a restart
        dev.restart_controller()
    os.environ.update(dev.slurm_env())
    release = str(dev.slurm.version())
    # The run must be on the Slurm it was asked for: a lost STUNE_SLURM once ran "the 24.11 suite" on 22.05.
    assert release.startswith(SLURM_INSTALL.series + "."), (
        f"asked for Slurm {SLURM_INSTALL.series}, but the cluster's commands are Slurm {release}"
    )
    _RELEASE_USED.append(release)
    yield dev
    if not was_running and not os.environ.get("STUNE_KEEP_CLUSTER"):
        dev.down()


@pytest.fixture
def slurm(cluster, shared_tmp, monkeypatch):
    """A fresh adapter on the cluster; after the test, its jobs are cancelled and its nodes resumed.
    The test runs in a temp dir its jobs can write to, so slurm-N.out files land there."""
    from slurm_tune.slurm import Slurm
    from stune_dev.devcluster import NODES

    monkeypatch.chdir(shared_tmp)
    handle = Slurm(conf=str(cluster.layout.slurm_conf), timeout=20, bin_dir=cluster.install.bin_dir)
    yield handle
    restore_cluster(handle, NODES)


@pytest.fixture
def unix_user():
    """`unix_user(name)`: the pwd entry of one of the dev cluster's unprivileged test users, made when missing
    (as `stune-devcluster up` makes them), so a test that acts as a second user needs no cluster first."""
    import pwd

    from stune_dev.host import ensure_unix_users

    def get(name: str) -> pwd.struct_passwd:
        if os.geteuid() != 0:
            pytest.skip("making the test users takes root")
        ensure_unix_users()
        return pwd.getpwnam(name)

    return get


@pytest.fixture
def shared_tmp(tmp_path):
    """A temp dir the unprivileged test users can write to (job output files)."""
    tmp_path.chmod(0o777)
    for parent in tmp_path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o001)
    return tmp_path
