"""stune-admin install / uninstall against a temporary root, the Slurm lines it asks for, the shipped files,
the TaskProlog wrapper, and the wheel (built, installed into a fresh venv outside the checkout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from slurm_tune.admin import shipped
from slurm_tune.admin.slurmconf import SlurmConf, diff_against, recommended_block, requirements, with_reason
from slurm_tune.cli.admin import main

REPO = Path(__file__).resolve().parent.parent


def run_admin(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_install_places_everything_then_a_second_run_changes_nothing(tmp_path, capsys):
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all")
    assert rc == 0, out
    for piece in shipped.PIECES:
        where = {
            "prolog_dir": "etc/slurm/prolog.d",
            "epilog_dir": "etc/slurm/epilog.d",
            "slurm_etc": "etc/slurm",
            "unit_dir": "etc/systemd/system",
        }[piece.place]
        path = tmp_path / where / piece.name
        assert path.is_file(), path
        assert path.stat().st_mode & 0o777 == piece.mode
    env = (tmp_path / "etc/default/stune").read_text()
    assert f"STUNE_STATE_DIR={tmp_path}/var/lib/stune/health" in env
    assert f"STUNE_BIN={Path(sys.executable).parent}" in env
    # hooks and units are pointed at this install's env file and bin dir
    assert (
        f"STUNE_ENV_FILE:-{tmp_path}/etc/default/stune"
        in (tmp_path / "etc/slurm/prolog.d/10-stune-health").read_text()
    )
    unit = (tmp_path / "etc/systemd/system/stune-gpu-sampler.service").read_text()
    assert f"ExecStart={Path(sys.executable).parent}/stune-gpu-sampler run" in unit
    assert f"EnvironmentFile=-{tmp_path}/etc/default/stune" in unit
    assert not list((tmp_path / "etc/systemd/system").glob("*.wants"))  # installed, not enabled
    spool = tmp_path / "var/spool/stune/usage"
    assert spool.is_dir() and spool.stat().st_mode & 0o7777 in (0o2775, 0o755)
    assert "PrologFlags=Alloc" in out and "ConstrainDevices=yes" in out
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all")
    assert rc == 0 and "nothing changed" in out and "placed" not in out


def test_an_edited_file_is_kept_with_its_diff_until_force(tmp_path, capsys):
    run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "node")
    env = tmp_path / "etc/default/stune"
    env.write_text(env.read_text() + "STUNE_HEALTH_PARTITION=hdr\n")
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "node")
    assert rc == 3
    assert "kept (edited by an admin" in out and "-STUNE_HEALTH_PARTITION=hdr" in out
    assert "STUNE_HEALTH_PARTITION=hdr" in env.read_text()
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "node", "--force")
    assert rc == 0 and "replaced (--force)" in out
    assert "\nSTUNE_HEALTH_PARTITION=hdr" not in env.read_text()


def test_a_file_stune_placed_is_updated_and_a_missing_one_restored(tmp_path, capsys):
    run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "node")
    hook = tmp_path / "etc/slurm/prolog.d/10-stune-health"
    hook.unlink()
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "node")
    assert rc == 0 and f"placed: {hook}" in out and hook.exists()


def test_dry_run_writes_nothing(tmp_path, capsys):
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--dry-run", "--role", "all")
    assert rc == 0 and "would be placed" in out and "nothing was written" in out
    assert list(tmp_path.iterdir()) == []


def test_uninstall_removes_exactly_what_install_placed(tmp_path, capsys):
    mine = tmp_path / "etc/slurm/prolog.d/50-site-own"
    mine.parent.mkdir(parents=True)
    mine.write_text("#!/bin/sh\n")
    run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all")
    (tmp_path / "var/lib/stune/health/state.json").write_text("{}")  # data a hook wrote
    rc, out = run_admin(capsys, "uninstall", "--prefix", str(tmp_path))
    assert rc == 0 and "left in place" in out, out  # the state dir holds data: kept, said
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == [
        "etc/slurm/prolog.d/50-site-own",
        "var/lib/stune/health/state.json",
    ]


def test_set_rejects_a_bad_name(tmp_path, capsys):
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all", "--set", "bad name=1")
    assert rc == 1 and "--set" in out and "Traceback" not in out


def test_requirements_and_diff_against_a_live_slurm_conf(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=x\nSchedulerParameters=bf_interval=5\nPrologFlags=Contain\n"
        "Prolog=/etc/slurm/prolog.d/*\nPriorityCalcPeriod=10\n"
        'PartitionName=gpu Nodes=n[1-2] TRESBillingWeights="CPU=1.0,GRES/gpu=4"\n'
    )
    parsed = SlurmConf(str(conf))
    paths = {
        "prolog_dir": "/etc/slurm/prolog.d",
        "epilog_dir": "/etc/slurm/epilog.d",
        "health_run": "/etc/slurm/stune-health-run",
        "task_prolog": "/etc/slurm/stune-task-prolog",
        "epilog_slurmctld": "/etc/slurm/stune-usage-slurmctld",
    }
    needs = {n.key: n for n in requirements(parsed, paths)}
    assert needs["Prolog"].ok and not needs["Epilog"].ok
    assert not needs["PrologFlags"].ok and needs["PrologFlags"].line == "PrologFlags=Contain,Alloc"
    assert needs["SchedulerParameters"].line == "SchedulerParameters=bf_interval=5,nohold_on_prolog_fail"
    assert not needs["PriorityCalcPeriod"].ok and needs["PriorityCalcPeriod"].severity == "warning"
    diff = diff_against(str(conf), parsed.text, list(needs.values()))
    assert "\n-PrologFlags=Contain\n" in diff and "\n+PrologFlags=Contain,Alloc    " in diff
    assert "+Epilog=/etc/slurm/epilog.d/*" in diff
    assert parsed.partitions()["gpu"]["TRESBillingWeights"] == "CPU=1.0,GRES/gpu=4"


def test_the_taskprolog_wrapper_reads_the_env_file(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "stune-task-prolog"
    fake.write_text('#!/bin/sh\necho "export SEEN=$STUNE_PARTITIONS"\n')
    fake.chmod(0o755)
    env_file = tmp_path / "stune"
    env_file.write_text(f"STUNE_BIN={bin_dir}\nSTUNE_PARTITIONS=/site/profiles\n")
    out = subprocess.run(
        [str(REPO / "prolog/stune-task-prolog")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "STUNE_ENV_FILE": str(env_file)},
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout == "export SEEN=/site/profiles\n"


def test_the_shipped_pieces_exist_in_the_tree_and_setup_cfg_ships_them():
    cfg = (REPO / "setup.cfg").read_text()
    for piece in shipped.PIECES:
        assert (REPO / piece.source).is_file()
        assert piece.source in cfg, piece.source
    placed = {piece.source for piece in shipped.PIECES}
    for hook in list((REPO / "prolog").iterdir()) + list((REPO / "epilog").iterdir()):
        assert f"{hook.parent.name}/{hook.name}" in cfg, f"{hook} is not shipped in the wheel"
        if hook.suffix != ".md":  # a new hook must be placed by stune-admin install too (shipped.PIECES)
            assert f"{hook.parent.name}/{hook.name}" in placed, f"{hook} is not placed by stune-admin install"


def test_wheel_installs_outside_the_checkout_and_installs_a_site(tmp_path):
    """Build the wheel from a clean copy, install it into a fresh venv, and run install/doctor/uninstall
    from there against a temporary root: what a site gets from an index."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build")
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    wheel = next(wheels.glob("slurm_tune-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for piece in shipped.PIECES:
        assert any(n.endswith(f"/data/share/slurm-tune/{piece.source}") for n in names), piece.source
    # the dev tools stay in the checkout: nothing of stune_dev, and no stune-devcluster command
    assert not [n for n in names if n.startswith("stune_dev/") or "stune_dev" in n], names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "stune_dev" not in zipfile.ZipFile(wheel).read(entry_points).decode()
    subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta; build_meta.build_sdist('sdist')"],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    import tarfile

    with tarfile.open(next((src / "sdist").glob("*.tar.gz"))) as sdist:
        sdist_names = sdist.getnames()
    for piece in shipped.PIECES:
        assert any(n.endswith(f"/{piece.source}") for n in sdist_names), piece.source
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300
    )
    subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # the hot commands' launchers point at the venv's interpreter and import no re; pip left bytecode
    # (docs/speed.md)
    for command in ("stune-sbatch", "stune-task-prolog", "stune-health"):
        launcher = (venv / "bin" / command).read_text()
        assert launcher.startswith(f"#!{venv}/bin/python") and "import re" not in launcher, launcher
    site = next(venv.glob("lib/python3*/site-packages"))
    assert list((site / "slurm_tune/cli/__pycache__").glob("sbatch.*.pyc"))
    # the installed hot commands run from the wheel, and write no file of code anywhere (issue 23 removed the
    # code cache): stune's cache directory holds only the profile cache and sbatch's option table
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (fake / "sbatch").chmod(0o755)
    cache = tmp_path / "cache"
    submit_env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STUNE_CACHE_DIR": str(cache),
        "STUNE_PARTITIONS": str(REPO / "partitions"),
        "STUNE_HISTORY": str(tmp_path / "history.jsonl"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for _ in range(2):
        submitted = subprocess.run(
            [str(venv / "bin/stune-sbatch"), "-p", "roce", "--parsable", "-H", "--wrap", "true"],
            capture_output=True,
            text=True,
            env=submit_env,
            cwd=tmp_path,
            timeout=120,
        )
        assert submitted.returncode == 0 and submitted.stdout.strip() == "4242", submitted.stderr
    outputs = set()
    for _ in range(2):
        judged = subprocess.run(
            [
                str(venv / "bin/stune-health"),
                "check",
                "--snapshot",
                str(REPO / "tests/fixtures/snapshots/dgx-a100-ib.json"),
                "--partition",
                "hdr",
            ],
            capture_output=True,
            text=True,
            env=submit_env,
            cwd=tmp_path,
            timeout=120,
        )
        assert judged.returncode == 0 and judged.stdout.startswith("gpu-a017 (hdr, policy "), judged.stderr
        outputs.add(judged.stdout)
    assert len(outputs) == 1
    cached = sorted(p.name for p in cache.iterdir())
    assert cached and all(name.startswith(("profiles", "sbatch-options")) for name in cached), cached
    assert not (site / "slurm_tune/codecache.py").exists()
    root = tmp_path / "root"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    admin = str(venv / "bin/stune-admin")
    first = subprocess.run(
        [admin, "install", "--prefix", str(root), "--role", "all"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    hook = root / "etc/slurm/prolog.d/10-stune-health"
    assert hook.read_bytes() == (REPO / "prolog/10-stune-health").read_bytes().replace(
        b"/etc/default/stune}", f"{root}/etc/default/stune}}".encode()
    )
    assert f"STUNE_BIN={venv}/bin" in (root / "etc/default/stune").read_text()
    second = subprocess.run(
        [admin, "install", "--prefix", str(root), "--role", "all"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert second.returncode == 0 and "nothing changed" in second.stdout
    # doctor, without a cluster: it names what is missing, and does not hang on the absent Slurm
    (root / "etc/slurm/slurm.conf").write_text(
        f"ClusterName=none\nSlurmctldHost=nowhere\nProlog={root}/etc/slurm/prolog.d/*\n"
    )
    doctor = subprocess.run(
        [admin, "doctor", "--prefix", str(root), "--role", "all", "--json", "--timeout", "5"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert doctor.returncode == 1, doctor.stderr
    findings = json.loads(doctor.stdout)["findings"]
    keys = {f["subject"] for f in findings if f["severity"] == "error"}
    assert {"PrologFlags", "TaskProlog", "profiles"} <= keys, keys
    assert any(f["subject"] == "Prolog" and f["severity"] == "ok" for f in findings)
    assert any(f["subject"] == "Prolog: fast health checks" and f["severity"] == "ok" for f in findings)
    assert not (venv / "bin/stune-devcluster").exists()
    no_dev = subprocess.run(
        [str(venv / "bin/python"), "-c", "import stune_dev"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert no_dev.returncode != 0 and "No module named 'stune_dev'" in no_dev.stderr, no_dev.stderr
    gone = subprocess.run(
        [admin, "uninstall", "--prefix", str(root)], capture_output=True, text=True, env=env, timeout=120
    )
    assert gone.returncode == 0, gone.stdout
    assert [p for p in root.rglob("*") if p.is_file()] == [
        root / "etc/slurm/slurm.conf"
    ]  # the admin's file stays


def test_roles_are_detected_from_slurm_conf(tmp_path, monkeypatch):
    from slurm_tune.admin import install as inst

    monkeypatch.setattr(inst.socket, "gethostname", lambda: "ctl2.example.org")
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nNodeName=gpu[01-16] Gres=gpu:8\n")
    roles, why = inst.detect_roles(SlurmConf(str(conf)))
    assert roles == {"controller"} and "ctl2" in why  # a backup controller is a controller too
    monkeypatch.setattr(inst.socket, "gethostname", lambda: "gpu07")
    assert inst.detect_roles(SlurmConf(str(conf)))[0] == {"node"}
    monkeypatch.setattr(inst.socket, "gethostname", lambda: "login1")
    monkeypatch.setattr(inst.os.path, "exists", lambda p: False)
    roles, why = inst.detect_roles(SlurmConf(str(conf)))
    assert roles == set() and "neither a node nor the controller" in why


def test_install_without_a_detected_role_asks_for_one(tmp_path, capsys, monkeypatch):
    from slurm_tune.cli import admin_install

    monkeypatch.setattr(
        admin_install, "detect_roles", lambda conf: (set(), "login1 is neither a node nor the controller")
    )
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path))
    assert rc == 1 and "pass --role node, controller or all" in out
    assert list(tmp_path.iterdir()) == []


def test_set_moves_the_directories_install_creates(tmp_path, capsys):
    shared = tmp_path / "shared/stune/usage"
    rc, out = run_admin(
        capsys,
        "install",
        "--prefix",
        str(tmp_path / "root"),
        "--role",
        "all",
        f"--set=STUNE_USAGE_SPOOL={shared}",
        f"--set=STUNE_STATE_DIR={tmp_path}/nodes/%n/health",
    )
    assert rc == 0, out
    assert shared.is_dir() and not (tmp_path / "root/var/spool/stune/usage").exists()
    assert not (tmp_path / "nodes").exists()  # per-node: the hooks create it
    env = (tmp_path / "root/etc/default/stune").read_text()
    assert f"STUNE_USAGE_SPOOL={shared}\n" in env and f"STUNE_STATE_DIR={tmp_path}/nodes/%n/health\n" in env


def test_the_diff_weighs_gpus_on_gpu_partitions_only(tmp_path):
    from slurm_tune.admin.slurmconf import gpu_partitions, partition_needs

    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "NodeName=gpu[01-04] Gres=gpu:a100:8 CPUs=64\nNodeName=cpu[01-02] CPUs=64\n"
        'PartitionName=a100 Nodes=gpu[01-04] TRESBillingWeights="CPU=1.0" # GPU nodes\n'
        "PartitionName=cpu Nodes=cpu[01-02] Default=YES\n"
        "PartitionName=all Nodes=ALL\n"
    )
    parsed = SlurmConf(str(conf))
    assert gpu_partitions(parsed) == ["a100", "all"]
    diff = diff_against(str(conf), parsed.text, partition_needs(parsed, gpu_partitions(parsed)))
    assert (
        '+PartitionName=a100 Nodes=gpu[01-04] TRESBillingWeights="CPU=1.0,GRES/gpu=8.0" # GPU nodes\n' in diff
    )
    assert (
        '+PartitionName=all Nodes=ALL TRESBillingWeights="CPU=1.0,Mem=0.25G,GRES/gpu=8.0" # on each GPU '
        "partition: the GPU weight the accountant charges by\n"
    ) in diff
    assert "+PartitionName=cpu" not in diff and "-PartitionName=cpu" not in diff


def test_enable_is_refused_with_a_prefix(tmp_path, capsys):
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all", "--enable")
    assert rc == 1 and "--enable starts this host's units: only without --prefix" in out
    assert list(tmp_path.iterdir()) == []


DEFAULT_PATHS = {
    "prolog_dir": "/etc/slurm/prolog.d",
    "epilog_dir": "/etc/slurm/epilog.d",
    "health_run": "/etc/slurm/stune-health-run",
    "task_prolog": "/etc/slurm/stune-task-prolog",
    "epilog_slurmctld": "/etc/slurm/stune-usage-slurmctld",
}


def test_install_prints_every_slurm_line_the_features_need_with_its_reason(tmp_path, capsys):
    """Against a slurm.conf without stune's settings: every line (PriorityCalcPeriod=1 included: Slurm's
    default 5 minutes delays SiteFactor in sprio) is printed, each with its reason as a comment."""
    conf = tmp_path / "etc/slurm/slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=x\nNodeName=n1 Gres=gpu:4\nPartitionName=gpu Nodes=n1\n")
    rc, out = run_admin(
        capsys, "install", "--prefix", str(tmp_path), "--role", "all", "--slurm-conf", str(conf)
    )
    assert rc == 0, out
    needs = requirements(
        SlurmConf(str(conf)),
        {k: v.replace("/etc/slurm", str(tmp_path / "etc/slurm")) for k, v in DEFAULT_PATHS.items()},
        "all",
    )
    keys = {n.key for n in needs}
    assert {"PriorityCalcPeriod", "TaskPlugin", "PrologFlags", "EpilogSlurmctld"} <= keys
    assert [n.key for n in needs if n.ok] == ["HealthCheckNodeState"]  # Slurm's default ANY suits stune
    for need in needs:
        assert (f"\n+{with_reason(need.line, need.why)}\n" in out) is not need.ok, need.key
    assert "+PriorityCalcPeriod=1 " in out and "# minutes; the default 5" in out
    assert 'TRESBillingWeights="CPU=1.0,Mem=0.25G,GRES/gpu=8.0" # on each GPU partition' in out
    assert "+ConstrainDevices=yes" in out and "# a job opens only the GPUs" in out
    # a 1-minute period (any spelling) is not asked for again; the default 5 is
    for value, ok in (("1", True), ("00:01:00", True), ("5", False)):
        parsed = SlurmConf(str(conf), text=f"PriorityCalcPeriod={value}\n")
        assert {n.key: n.ok for n in requirements(parsed, DEFAULT_PATHS)}["PriorityCalcPeriod"] is ok, value
    assert not {n.key: n.ok for n in requirements(SlurmConf(str(conf), text=""), DEFAULT_PATHS)}[
        "PriorityCalcPeriod"
    ]


def test_readmes_slurm_conf_block_is_what_install_prints():
    """README's slurm.conf block and install's lines have one home (slurmconf.requirements): the block is
    recommended_block() for the default paths, line for line."""
    readme = (REPO / "README.md").read_text()
    head = "install. Then add to slurm.conf:\n\n```\n"
    start = readme.index(head) + len(head)
    block = readme[start : readme.index("```\n", start)]
    assert block == recommended_block(DEFAULT_PATHS)
    assert "PriorityCalcPeriod=1 " in block and "TaskPlugin=task/cgroup" in block


def test_dry_run_says_exactly_what_the_real_run_does(tmp_path, capsys):
    """One line per folder, with the mode the real run gives it (the spool's parents 0755, not the spool's
    2775), and the same files."""
    rc, dry = run_admin(capsys, "install", "--prefix", str(tmp_path), "--dry-run", "--role", "all")
    assert rc == 0
    rc, real = run_admin(capsys, "install", "--prefix", str(tmp_path), "--role", "all")
    assert rc == 0
    would = [
        line.replace("would create: ", "", 1)
        for line in dry.splitlines()
        if line.startswith("would create: ")
    ]
    created = [line.replace("created: ", "", 1) for line in real.splitlines() if line.startswith("created: ")]
    assert len(would) == len(set(would)) and sorted(would) == sorted(created)
    assert f"{tmp_path}/var/spool/stune/ (0755)" in would
    placed = sorted(line.split(": ", 1)[1] for line in real.splitlines() if line.startswith("placed: "))
    assert (
        sorted(line.split(": ", 1)[1] for line in dry.splitlines() if line.startswith("would be placed: "))
        == placed
    )


def test_prefix_moves_the_accountants_ledger(tmp_path, capsys, monkeypatch):
    """docs/admin.md: --prefix relocates every path, the accountant's ledger included (the env file says
    where; its units read it). Without --prefix fairshare.yaml's accountant.state_dir is left to rule."""
    from slurm_tune.admin.doctor import read_env_file
    from slurm_tune.fairshare.accountant import ledger_path
    from slurm_tune.usage.config import load_config

    monkeypatch.delenv("STUNE_FAIRSHARE_STATE_DIR", raising=False)
    monkeypatch.setenv("STUNE_FAIRSHARE_CONFIG", str(tmp_path / "fairshare.yaml"))
    (tmp_path / "fairshare.yaml").write_text("accountant:\n  alpha: 1.0\n")
    rc, out = run_admin(capsys, "install", "--prefix", str(tmp_path / "root"), "--role", "controller")
    assert rc == 0, out
    env = read_env_file(str(tmp_path / "root/etc/default/stune"))
    assert env["STUNE_FAIRSHARE_STATE_DIR"] == f"{tmp_path}/root/var/lib/stune/fairshare"
    assert (tmp_path / "root/var/lib/stune/fairshare").is_dir()
    config = load_config()
    assert ledger_path(config, env).startswith(f"{tmp_path}/root/var/lib/stune/fairshare/")
    assert ledger_path(config, {}).startswith("/var/lib/stune/fairshare/")
    from slurm_tune.admin.install import Layout, env_settings

    assert "STUNE_FAIRSHARE_STATE_DIR" not in env_settings(Layout(), {})


def test_slurm_conf_alone_puts_the_hooks_beside_it(tmp_path, capsys):
    """--slurm-conf (Debian's /etc/slurm-llnl, say) without Prolog/Epilog globs: the preamble, the non-glob
    hooks and prolog.d/epilog.d go beside it, and the printed lines name them there."""
    from slurm_tune.admin.install import Layout

    layout = Layout(prefix="/", slurm_conf="/etc/slurm-llnl/slurm.conf")
    assert layout.slurm_etc == "/etc/slurm-llnl" and layout.prolog_dir == "/etc/slurm-llnl/prolog.d"
    assert layout.hook_paths()["health_run"] == "/etc/slurm-llnl/stune-health-run"
    assert Layout().slurm_etc == "/etc/slurm"
    conf = tmp_path / "etc/slurm-llnl/slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=x\n")
    rc, out = run_admin(
        capsys, "install", "--prefix", str(tmp_path), "--slurm-conf", str(conf), "--role", "all"
    )
    assert rc == 0, out
    etc = conf.parent
    for name in (
        "stune-hook-env.sh",
        "stune-health-run",
        "stune-task-prolog",
        "stune-usage-slurmctld",
        "prolog.d/20-stune-jobgpus",
        "epilog.d/20-stune-usage",
    ):
        assert (etc / name).is_file(), name
    assert not (tmp_path / "etc/slurm").exists()
    assert f'hook_env="{etc}/stune-hook-env.sh"' in (etc / "prolog.d/20-stune-jobgpus").read_text()
    assert f"+HealthCheckProgram={etc}/stune-health-run " in out and f"+Prolog={etc}/prolog.d/* " in out
    # a slurm.conf outside --prefix (the local cluster's) leaves everything under the prefix
    other = Layout(prefix=str(tmp_path / "site"), slurm_conf=str(conf))
    assert other.slurm_etc == f"{tmp_path}/site/etc/slurm"


def test_login_node_install_places_profiles_and_env_file_only(tmp_path, capsys, monkeypatch):
    """`install --login`: what stune-sbatch needs on a submission host (the profile directory, with the
    examples beside it, and the env file), nothing else; the profiles then read there."""
    rc, out = run_admin(capsys, "install", "--login", "--prefix", str(tmp_path))
    assert rc == 0, out
    assert "login node (--login)" in out and f"into {tmp_path}/etc/stune/partitions" in out
    assert "Slurm needs these lines" not in out and "units installed" not in out
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    examples = sorted(f"etc/stune/examples/{p.name}" for p in (REPO / "partitions").glob("*.yaml"))
    assert files == sorted(["etc/default/stune", "var/lib/stune/install-manifest.json", *examples])
    assert (tmp_path / "etc/stune/partitions").is_dir()
    env = (tmp_path / "etc/default/stune").read_text()
    assert f"STUNE_PARTITIONS={tmp_path}/etc/stune/partitions" in env and "STUNE_USAGE_SPOOL" not in env
    shutil.copy(REPO / "partitions/hdr.yaml", tmp_path / "etc/stune/partitions/hdr.yaml")
    monkeypatch.setenv("STUNE_PARTITIONS", str(tmp_path / "etc/stune/partitions"))
    rc, out = run_admin(capsys, "check-profiles")
    assert rc == 0 and "1 profile(s) OK" in out, out
    rc, out = run_admin(capsys, "install", "--login", "--prefix", str(tmp_path))
    assert rc == 0 and "nothing changed" in out
    rc, out = run_admin(capsys, "install", "--login", "--enable", "--dry-run")
    assert rc == 1 and "a login node runs no stune unit" in out
    rc, out = run_admin(capsys, "uninstall", "--prefix", str(tmp_path))
    assert rc == 0 and not (tmp_path / "etc/default/stune").exists()


def test_without_a_slurm_conf_install_still_prints_the_gpu_partitions_weight(tmp_path):
    """No slurm.conf found: no partition is known, yet the GPU weight line (which doctor later requires) is
    printed for each GPU partition with its reason, as README's block has it."""
    from slurm_tune.admin.install import Layout, slurm_diffs
    from slurm_tune.admin.slurmconf import SlurmConf

    conf = SlurmConf(str(tmp_path / "etc/slurm/slurm.conf"))
    assert not conf.found
    text = slurm_diffs(Layout(prefix=str(tmp_path)), conf, "all")
    assert "not found; stune needs these lines" in text
    assert 'PartitionName=... TRESBillingWeights="CPU=1.0,Mem=0.25G,GRES/gpu=8.0"' in text
