"""stune-devcluster without starting anything: which Slurm, where, and whose state dir; how it gets its Debian
packages; and that the dev tools (stune_dev) stay out of the production package."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from stune_dev import devcluster, host
from stune_dev.devcluster import ClusterError, DevCluster, Layout, SlurmInstall, _exports, main


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


def test_26_05_runs_from_debians_unpacked_packages_with_their_own_plugins_and_stepd(monkeypatch, tmp_path):
    monkeypatch.delenv("STUNE_SLURM_PREFIX", raising=False)
    assert SlurmInstall.choose("26.05").prefix == Path("/var/cache/stune/slurm-26.05.5")
    install = SlurmInstall("26.05", tmp_path / "p")
    layout = Layout(root=tmp_path / "c", port_base=29900)
    conf = DevCluster(layout, profiles_dir=tmp_path, install=install).render_slurm_conf().splitlines()
    dbd = DevCluster(layout, profiles_dir=tmp_path, install=install).render_slurmdbd_conf().splitlines()
    # Debian's binaries look for plugins and slurmstepd under /usr, where Debian 12's 22.05 ones are
    assert f"PluginDir={tmp_path}/p/lib/slurm" in conf and f"PluginDir={tmp_path}/p/lib/slurm" in dbd
    assert install.slurmd_argv("n2", layout.slurm_conf) == [
        f"{tmp_path}/p/sbin/slurmd",
        "-N",
        "n2",
        "-f",
        str(layout.slurm_conf),
        "-d",
        f"{tmp_path}/p/sbin/slurmstepd",
    ]
    packaged = SlurmInstall("22.05")
    assert packaged.slurmd_argv("n2", layout.slurm_conf) == [
        "slurmd",
        "-N",
        "n2",
        "-f",
        str(layout.slurm_conf),
    ]
    assert not any(
        line.startswith("PluginDir=")
        for line in DevCluster(layout, profiles_dir=tmp_path, install=packaged)
        .render_slurm_conf()
        .splitlines()
    )


def test_no_daemon_listens_on_every_address(tmp_path):
    """slurmd and slurmdbd bind to their own (loopback) address, slurmctld to its host name's; MariaDB is
    started with --bind-address=127.0.0.1."""
    cluster = DevCluster(
        Layout(root=tmp_path / "c", port_base=29900), profiles_dir=tmp_path, install=SlurmInstall("22.05")
    )
    assert "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny" in cluster.render_slurm_conf().splitlines()
    assert "CommunicationParameters=NoInAddrAny" in cluster.render_slurmdbd_conf().splitlines()


def test_an_unknown_series_is_refused():
    with pytest.raises(
        ClusterError, match=r"Slurm 23\.02 is not one the dev cluster runs; choose 22\.05, 26\.05, 24\.11"
    ):
        SlurmInstall.choose("23.02")


def test_a_state_dir_belongs_to_the_series_that_made_it(tmp_path):
    layout = Layout(root=tmp_path / "c", port_base=29900)
    DevCluster(layout, install=SlurmInstall("24.11", tmp_path / "p")).check_series()
    assert (layout.root / "slurm-series").read_text() == "24.11\n"
    DevCluster(layout, install=SlurmInstall("24.11", tmp_path / "p")).check_series()  # same series: fine
    with pytest.raises(
        ClusterError, match=r"holds a Slurm 24.11 cluster, not 22.05: use another STUNE_CLUSTER_DIR"
    ):
        DevCluster(layout, install=SlurmInstall("22.05")).check_series()
    old = Layout(root=tmp_path / "old", port_base=29900)  # made before the series were recorded
    (old.spool / "ctld").mkdir(parents=True)
    with pytest.raises(ClusterError, match=r"holds a Slurm 22\.05 cluster, not 24\.11"):
        DevCluster(old, install=SlurmInstall("24.11", tmp_path / "p")).check_series()


def test_env_points_shells_and_stune_at_the_built_slurm(tmp_path):
    layout = Layout(root=tmp_path, port_base=29900)
    built = DevCluster(layout, install=SlurmInstall("24.11", Path("/opt/s")))
    assert built.slurm_env() == {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf", "STUNE_SLURM_BIN": "/opt/s/bin"}
    assert (
        built.slurm.executable("sinfo") == "/opt/s/bin/sinfo"
        and built.slurm.executable("runuser") == "runuser"
    )
    assert _exports(built).splitlines() == [
        f"export SLURM_CONF={tmp_path}/etc/slurm.conf",
        "export STUNE_SLURM_BIN=/opt/s/bin",
        'export PATH=/opt/s/bin:"$PATH"',
    ]
    debian = DevCluster(layout, install=SlurmInstall("22.05"))
    assert _exports(debian) == f"export SLURM_CONF={tmp_path}/etc/slurm.conf"


def test_the_cli_takes_the_series(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("STUNE_CLUSTER_DIR", str(tmp_path))
    monkeypatch.setenv("STUNE_SLURM_PREFIX", "/opt/s")
    assert main(["--slurm", "24.11", "env"]) == 0
    assert "export STUNE_SLURM_BIN=/opt/s/bin" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--slurm", "21.08", "env"])


REPO = Path(__file__).resolve().parent.parent


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_production_module_or_hook_uses_the_dev_tools():
    """stune_dev uses slurm_tune, never the other way round: no slurm_tune module imports it (statically or
    by name), and no shipped hook or unit names it."""
    modules = sorted((REPO / "slurm_tune").rglob("*.py"))
    assert len(modules) > 50
    offenders = [
        str(m.relative_to(REPO))
        for m in modules
        if any(name.split(".")[0] == "stune_dev" for name in _imports_of(m)) or "stune_dev" in m.read_text()
    ]
    shipped = [p for d in ("prolog", "epilog", "contrib") for p in (REPO / d).rglob("*") if p.is_file()]
    offenders += [str(p.relative_to(REPO)) for p in shipped if b"stune_dev" in p.read_bytes()]
    assert offenders == []
    assert {"slurm_tune.errors", "slurm_tune.slurm"} <= _imports_of(REPO / "stune_dev" / "devcluster.py")


def test_a_missing_build_is_built_with_build_slurm_sh_and_a_failed_build_says_why(
    monkeypatch, tmp_path, capsys
):
    from stune_dev import layout

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "build-slurm.sh").write_text(
        'echo "args: $*" >&2; echo "E: no compiler" >&2; exit 1\n'
    )
    monkeypatch.setattr(layout, "REPO", repo)
    monkeypatch.setenv("STUNE_SLURM_PREFIX", str(tmp_path / "prefix"))
    install = SlurmInstall.choose("24.11")
    with pytest.raises(ClusterError, match=r"Slurm 24\.11 could not be built: E: no compiler"):
        install.ensure(install=True)
    assert f"devcluster: building Slurm 24.11 into {tmp_path / 'prefix'} (minutes)" in capsys.readouterr().err


def _fake_setup(repo: Path, body: str) -> Path:
    script = repo / "scripts" / "setup.sh"
    script.parent.mkdir(parents=True)
    script.write_text(f'#!/bin/bash\necho "args: $*" >> {repo}/calls\n{body}\n')
    return script


def test_ensure_packages_is_setup_sh_packages_step(monkeypatch, tmp_path, capsys):
    """The package list lives in scripts/setup.sh only: `up` runs its --packages step."""
    _fake_setup(tmp_path, "echo 'setup.sh: installing Debian packages: munge'")
    monkeypatch.setattr(host, "REPO", tmp_path)
    host.ensure_packages()
    assert (tmp_path / "calls").read_text() == "args: --packages\n"
    assert "devcluster: setup.sh: installing Debian packages: munge" in capsys.readouterr().err


def test_ensure_packages_reports_a_failed_install(monkeypatch, tmp_path):
    _fake_setup(tmp_path, "echo 'E: Unable to locate package slurmd' >&2; exit 100")
    monkeypatch.setattr(host, "REPO", tmp_path)
    with pytest.raises(
        ClusterError, match=r"setup.sh --packages failed \(exit 100\): E: Unable to locate package"
    ):
        host.ensure_packages()
    (tmp_path / "scripts" / "setup.sh").unlink()
    with pytest.raises(ClusterError, match=r"setup\.sh is missing: stune-devcluster runs from a checkout"):
        host.ensure_packages()


def test_setup_sh_refuses_an_unknown_argument():
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "--bogus"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown argument '--bogus'" in proc.stderr


def test_only_the_dev_tools_reconfigure_slurm_or_change_accounting(tmp_path):
    """`scontrol reconfigure` and `sacctmgr -i add ...` are the dev cluster's (and tests'), not the adapter's:
    production stune never builds them; the dev cluster runs them through the adapter's runner."""
    import ast

    from slurm_tune.slurm import Slurm

    assert not hasattr(Slurm, "reconfigure") and not hasattr(Slurm, "sacctmgr")
    words = {
        node.value
        for path in (REPO / "slurm_tune").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
    }
    assert "reconfigure" not in words

    class Runner:
        def __init__(self):
            self.calls = []

        def run(self, argv):
            self.calls.append(argv)
            return ""

    cluster = DevCluster.__new__(DevCluster)
    cluster.slurm = Runner()
    cluster.wait_nodes_ready = lambda: None
    cluster.reconfigure()
    cluster._sacctmgr(["add", "cluster", "stune"])
    assert cluster.slurm.calls == [["scontrol", "reconfigure"], ["sacctmgr", "-i", "add", "cluster", "stune"]]


def test_build_slurm_names_the_series_it_offers(tmp_path):
    """25.11 is in no Debian suite: asked for it, build-slurm.sh says what it offers in one line, builds nothing."""
    script = Path(devcluster.REPO) / "scripts" / "build-slurm.sh"
    proc = subprocess.run(
        ["bash", str(script), "25.11"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "STUNE_SLURM_PREFIX": str(tmp_path / "p")},
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "build-slurm.sh: no build for Slurm 25.11 (26.05 or 24.11; 22.05 is Debian 12's packages)\n"
    )
    assert not (tmp_path / "p").exists()


def test_a_fragment_naming_a_program_that_is_gone_is_dropped_and_the_cause_is_in_the_error(tmp_path, capsys):
    """A test run cut off before its teardown leaves its fragment (EpilogSlurmctld in its temp dir); once pytest
    prunes that dir, slurmctld 23.02+ exits at start ("Invalid EpilogSlurmctld"): one CI run on 26.05 failed whole
    so. `up` drops such a fragment, saying so, and keeps the others."""
    layout = Layout(root=tmp_path / "c", port_base=29900)
    dev = DevCluster(layout, profiles_dir=tmp_path, install=SlurmInstall("22.05"))
    layout.fragments.mkdir(parents=True)
    script = tmp_path / "ctld"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    dev.set_fragment(
        "gone", f"EpilogSlurmctld={tmp_path}/pytest-7/epilog\nPrologFlags=Alloc", reconfigure=False
    )
    dev.set_fragment(
        "kept", f"PrologSlurmctld={script}  # ours\nProlog={tmp_path}/prolog.d/*", reconfigure=False
    )
    dev.set_fragment("plain", "SchedulerParameters=enable_user_top", reconfigure=False)
    script2 = tmp_path / "not-executable"
    script2.write_text("#!/bin/sh\n")
    dev.set_fragment("noexec", f"HealthCheckProgram={script2} HealthCheckInterval=60", reconfigure=False)
    assert dev.drop_broken_fragments() == ["gone", "noexec"]
    assert dev.fragments() == ["kept", "plain"]
    err = capsys.readouterr().err
    assert (
        f"dropped the slurm.conf fragment gone: EpilogSlurmctld={tmp_path}/pytest-7/epilog cannot be run"
        in err
    )
    assert dev.clear_fragments() == ["kept", "plain"] and dev.fragments() == []


def test_a_daemon_that_exits_is_reported_with_the_error_that_caused_it(tmp_path):
    log_file = tmp_path / "slurmctld.log"
    log_file.write_text(
        "[t] started\n[t] error: Invalid EpilogSlurmctld(`/tmp/x`): No such file or directory\n"
        "[t] error: Couldn't load specified plugin name for prep/script\n[t] error: prep_g_init: cannot create\n"
        "[t] fatal: failed to initialize prep plugin\n"
    )
    assert host.log_tail(log_file) == (
        "[t] error: Invalid EpilogSlurmctld(`/tmp/x`): No such file or directory | "
        "[t] error: Couldn't load specified plugin name for prep/script | [t] error: prep_g_init: cannot create | "
        "[t] fatal: failed to initialize prep plugin"
    )
    assert host.log_tail(tmp_path / "none.log") == ""


# ---- the Ascend and AMD partitions (issue 26) -----------------------------------------------------------
def test_every_node_has_npus_beside_its_gpus_and_the_default_partition_stays_nvidias(tmp_path):
    layout = Layout(root=tmp_path / "c", port_base=29900)
    cluster = DevCluster(layout, profiles_dir=REPO / "partitions", install=SlurmInstall("22.05"))
    conf = cluster.render_slurm_conf().splitlines()
    assert "GresTypes=gpu,npu" in conf and "AccountingStorageTRES=gres/gpu,gres/npu" in conf
    assert all("Gres=gpu:4,npu:4 " in line for line in conf if line.startswith("NodeName="))
    assert cluster.render_gres_conf().splitlines()[1:] == [
        f"NodeName=n[1-3] Name=gpu File={layout.dev}/nvidia[0-3]",
        f"NodeName=n[1-3] Name=npu File={layout.dev}/davinci[0-3]",
    ]
    parts = dict(cluster.partitions())
    assert list(parts) == ["hdr", "roce", "vpc", "amd", "ascend"]  # a node's first partition stays hdr
    assert [name for name, default in parts.items() if default] == ["hdr"]  # not amd, first by name
    lines = [line.split()[0] for line in conf if line.startswith("PartitionName=")]
    assert lines == [f"PartitionName={name}" for name in parts]
    assert cluster.site_settings()["STUNE_ACCEL_TOOLS"] == f"{layout.root}/nodes/%n/accel-tools"


def test_a_nodes_npu_state_and_amd_replay_are_written_for_its_tools(tmp_path, monkeypatch):
    from stune_dev import accel

    monkeypatch.setattr(accel, "STANDINS", tmp_path / "standins")
    layout = Layout(root=tmp_path / "c", port_base=29900)
    cluster = DevCluster(layout, profiles_dir=REPO / "partitions", install=SlurmInstall("22.05"))
    assert cluster.install_accel_tools() == []  # no stand-ins shipped: the states all the same
    (tmp_path / "standins").mkdir()
    for tool in accel.TOOLS:
        (tmp_path / "standins" / tool).write_text("#!/bin/sh\necho stand-in\n")
    assert cluster.install_accel_tools() == list(accel.TOOLS)
    tools = layout.accel_tools("n2")
    assert os.access(tools / "npu-smi", os.X_OK) and os.access(tools / "hccn_tool", os.X_OK)
    state = cluster.npu_state("n2")
    assert [n["health"] for n in state["npus"]] == ["OK"] * 4 and state["ports"]["3"]["link"] == "UP"
    assert state["ports"]["0"]["ip"] != cluster.npu_state("n3")["ports"]["0"]["ip"]  # rank tables need it
    state["npus"][1]["health"] = "Warning"
    cluster.write_npu_state("n2", state)
    assert cluster.npu_state("n2")["npus"][1]["health"] == "Warning"
    cluster.write_npu_state("n2")  # back to healthy
    assert cluster.npu_state("n2")["npus"][1]["health"] == "OK"

    replay = layout.gpu_replay("n1")
    cluster.set_accel_replay("n1", accel.amd_section(util=10.0))
    assert json.loads(replay.read_text())["accel"]["vendor"] == "amd"
    cluster.set_accel_replay("n1", None)
    assert not replay.exists()  # nothing else was in it
    replay.write_text(json.dumps({"gpus": {"devices": []}}))
    cluster.set_accel_replay("n1", accel.amd_section())
    cluster.set_accel_replay("n1", None)
    assert json.loads(replay.read_text()) == {"gpus": {"devices": []}}  # NVIDIA's section untouched
