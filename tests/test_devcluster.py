"""stune-devcluster's Slurm choice, without starting anything: which Slurm, where, and whose state dir."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_tune.devcluster import DevCluster, Layout, SlurmInstall, _exports, main
from slurm_tune.errors import ClusterError


def test_the_default_is_debians_22_05(monkeypatch):
    monkeypatch.delenv("STUNE_SLURM", raising=False)
    install = SlurmInstall.choose()
    assert (install.series, install.prefix, install.bin_dir) == ("22.05", None, None)
    assert install.daemon("slurmctld") == "slurmctld" and install.built


def test_24_11_runs_from_its_build_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("STUNE_SLURM", "24.11")
    monkeypatch.setenv("STUNE_SLURM_PREFIX", str(tmp_path))
    install = SlurmInstall.choose()
    assert install.series == "24.11" and install.bin_dir == f"{tmp_path}/bin"
    assert install.daemon("slurmd") == f"{tmp_path}/sbin/slurmd"
    assert install.env({"PATH": "/usr/bin"})["PATH"] == f"{tmp_path}/bin:{tmp_path}/sbin:/usr/bin"
    assert not install.built
    with pytest.raises(ClusterError, match=r"Slurm 24.11 is not built in .*: run .*build-slurm.sh"):
        install.ensure(install=False)
    (tmp_path / ".stune-built").touch()
    assert install.built
    install.ensure(install=False)
    monkeypatch.delenv("STUNE_SLURM_PREFIX")
    assert SlurmInstall.choose("24.11").prefix == Path("/var/cache/stune/slurm-24.11.5")


def test_an_unknown_series_is_refused():
    with pytest.raises(ClusterError, match="Slurm 23.02 is not one the dev cluster runs; choose 22.05, 24.11"):
        SlurmInstall.choose("23.02")


def test_a_state_dir_belongs_to_the_series_that_made_it(tmp_path):
    layout = Layout(root=tmp_path / "c", port_base=29900)
    DevCluster(layout, install=SlurmInstall("24.11", tmp_path / "p")).check_series()
    assert (layout.root / "slurm-series").read_text() == "24.11\n"
    DevCluster(layout, install=SlurmInstall("24.11", tmp_path / "p")).check_series()  # same series: fine
    with pytest.raises(ClusterError, match=r"holds a Slurm 24.11 cluster, not 22.05: use another STUNE_CLUSTER_DIR"):
        DevCluster(layout, install=SlurmInstall("22.05")).check_series()
    old = Layout(root=tmp_path / "old", port_base=29900)  # made before the series were recorded
    (old.spool / "ctld").mkdir(parents=True)
    with pytest.raises(ClusterError, match="holds a Slurm 22.05 cluster, not 24.11"):
        DevCluster(old, install=SlurmInstall("24.11", tmp_path / "p")).check_series()


def test_env_points_shells_and_stune_at_the_built_slurm(tmp_path):
    layout = Layout(root=tmp_path, port_base=29900)
    built = DevCluster(layout, install=SlurmInstall("24.11", Path("/opt/s")))
    assert built.slurm_env() == {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf", "STUNE_SLURM_BIN": "/opt/s/bin"}
    assert built.slurm.executable("sinfo") == "/opt/s/bin/sinfo" and built.slurm.executable("runuser") == "runuser"
    assert _exports(built).splitlines() == [f"export SLURM_CONF={tmp_path}/etc/slurm.conf",
                                            "export STUNE_SLURM_BIN=/opt/s/bin", 'export PATH=/opt/s/bin:"$PATH"']
    debian = DevCluster(layout, install=SlurmInstall("22.05"))
    assert _exports(debian) == f"export SLURM_CONF={tmp_path}/etc/slurm.conf"


def test_the_cli_takes_the_series(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("STUNE_CLUSTER_DIR", str(tmp_path))
    monkeypatch.setenv("STUNE_SLURM_PREFIX", "/opt/s")
    assert main(["--slurm", "24.11", "env"]) == 0
    assert "export STUNE_SLURM_BIN=/opt/s/bin" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--slurm", "21.08", "env"])
