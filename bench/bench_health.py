"""The health hooks' own cost, as whole processes, against LBNL NHC as sites run it and against the bare
interpreter start `python3 -I -S -c pass` (the same interpreter; no `site`, which the prolog hook does not load
either).

Goals (issue 23): `stune-health prolog` <= 0.5x the time of NHC on the same sysfs tree, and the shipped hook
as Slurm runs it <= 0.7x; `stune-health check` as README reports it (<= 2x the bare start). For this
checkout's editable install and for the wheel installed by a plain `pip install` into a fresh venv, side by
side; with `--before REV`, also the wheel of that revision (e.g. `main`), interleaved in the same rounds: the
before/after of a change.

- python -c pass: the same interpreter with `site` (a launcher's start), for reference;
- nhc (8 IB ports): LBNL NHC (`--nhc DIR`: its source checkout, https://github.com/mej/nhc; the rows are left
  out without it) as a site runs it from Slurm: `nhc` with its default 30 s watchdog, every `scripts/*.nhc`
  loaded, a config of `check_hw_ib 200 mlx5_N:1` for the 8 compute ports. Node marking is off
  (`ONLINE_NODE=:`), as stune's prolog makes no Slurm call either. NHC reads /sys/class/infiniband by absolute
  path: the bench's copy of `lbnl_hw.nhc` reads it under the same relocated sysfs root as stune (two lines
  changed, the same work);
- check-snapshot: `stune-health check --snapshot` judging an 8-GPU, 8-HCA snapshot (the DGX-A100 fixture:
  8 A100s, 8 ConnectX-6 ports plus the storage HCA) under the hdr profile, through the shipped launcher;
- prolog-8-ports: `stune-health prolog` (the launcher, with `site`) on a DGX-A100 sysfs tree: the 8
  required IB ports (state, rate, counters, firmware), the socket interface and the 8 GPUs on the PCI bus,
  with the node state read and written;
- prolog-hook: the same through the shipped hook `prolog/10-stune-health`, as Slurm runs it: Python started
  with -I -S, the env file's trust check, stune imported from the installation. This is the prolog's cost.

Every process runs with PYTHONDONTWRITEBYTECODE=1: only bytecode the install left is used (the checkout is
compiled first). No Slurm is needed: neither path makes a Slurm call. Wall-clock medians are reported (the
harness's), and the child's CPU time (user + system) beside them, which a loaded machine distorts less.

    .venv/bin/python bench/bench_health.py [--rounds N] [--nhc DIR] [--before REV]
"""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import healthkit
from common import BARE, compare, cpu_once, time_once, wheel_install

NHC = "nhc (8 IB ports)"


def option(name: str, default: str | None = None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def before_install(tmp: Path, rev: str) -> Path:
    """The wheel of revision `rev` of this repository, installed like the checkout's (common.wheel_install,
    which takes a wheel it finds built in its directory): the "before" of a before/after."""
    work = tmp / "before"
    src = work / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, stdout=subprocess.PIPE
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "dist"),
            str(src),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return wheel_install(work)


def nhc_install(source: Path, tmp: Path, root: Path, ports: list[str]) -> list[str]:
    """NHC from its source checkout, configured to check `ports` (mlx5_N:1) at 200 Gb/s under `root`: the
    argv that runs it as a site does (default watchdog), its log in tmp."""
    home = tmp / "nhc"
    scripts = home / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(source / "nhc", home / "nhc")
    for script in sorted((source / "scripts").glob("*.nhc")):
        text = script.read_text()
        if script.name == "lbnl_hw.nhc":  # the same sysfs tree as stune reads: relocated, same work
            text = text.replace("/sys/class/infiniband", "$NHC_SYSFS_ROOT/sys/class/infiniband")
            text = text.replace("arr=( $PORT )", "arr=( ${PORT#$NHC_SYSFS_ROOT} )")
        (scripts / script.name).write_text(text)
    mad = root / "sys/class/infiniband_mad"  # a node with OFED loaded has it; NHC's check_hw_ib requires it
    mad.mkdir(parents=True, exist_ok=True)
    (mad / "abi_version").write_text("5\n")
    argv = {}
    for name, checked in (("nhc", ports), ("nhc-missing-port", [*ports, "mlx5_99:1"])):
        conf = home / f"{name}.conf"
        conf.write_text("".join(f"* || check_hw_ib 200 {port}\n" for port in checked))
        argv[name] = [
            "/bin/bash",
            str(home / "nhc"),
            "-c",
            str(conf),
            "-D",
            str(home),
            "-l",
            str(home / f"{name}.log"),
            "ONLINE_NODE=:",
            "OFFLINE_NODE=:",
            f"RESULTFILE={home / 'nhc.status'}",
            f"NHC_SYSFS_ROOT={root}",
        ]
    # NHC judges this tree: the ports pass, a port the tree lacks fails, and nothing else is said
    ok = subprocess.run(argv["nhc"], capture_output=True, text=True)
    missing = subprocess.run(argv["nhc-missing-port"], capture_output=True, text=True)
    said = (home / "nhc.log").read_text() + ok.stdout + ok.stderr
    if ok.returncode or said or missing.returncode == 0 or "No IB port mlx5_99:1" not in missing.stdout:
        raise SystemExit(
            f"bench: NHC did not judge the tree: {ok.returncode} {said[-300:]!r} / "
            f"{missing.returncode} {missing.stdout[-300:]!r}"
        )
    return argv["nhc"]


def main() -> int:
    rounds = int(option("--rounds", "30"))
    # An editable checkout has bytecode only where something compiled it (PYTHONDONTWRITEBYTECODE below).
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-health-"))
    bins = {"editable": Path(sys.executable).parent, "wheel": wheel_install(tmp)}
    before = option("--before")
    if before:
        bins[f"wheel, {before}"] = before_install(tmp, before)
    root = healthkit.tree(tmp / "root", "hdr")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.update(
        STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
        STUNE_SYSFS_ROOT=str(root),
        STUNE_STATE_DIR=str(tmp / "state"),
        STUNE_HEALTH_PARTITION="hdr",
        SLURMD_NODENAME="n1",
    )
    # A node in service has had an epilog or periodic run: NVML's GPU list and the counter baselines are known.
    env["STUNE_GPU_SNAPSHOT"] = str(healthkit.gpu_file(tmp / "gpus.json"))
    snapshot = str(REPO / "tests/fixtures/snapshots/dgx-a100-ib.json")
    py = str(bins["editable"] / "python")
    runs = {BARE: ([py, "-I", "-S", "-c", "pass"], env), "python -c pass": ([py, "-c", "pass"], env)}
    nhc = option("--nhc")
    if nhc:
        runs[NHC] = (nhc_install(Path(nhc), tmp, root, [f"mlx5_{i}:1" for i in range(8)]), env)
    for kind, bindir in bins.items():
        # one profile cache per install: the cache is keyed by the validating code's path
        kind_env = dict(env, STUNE_CACHE_DIR=str(tmp / f"cache-{kind}"))
        time_once([str(bindir / "stune-health"), "epilog"], env=kind_env)
        defaults = tmp / f"stune-{kind}.env"
        defaults.write_text(
            "".join(
                f"{k}={kind_env[k]}\n"
                for k in (
                    "STUNE_PARTITIONS",
                    "STUNE_CACHE_DIR",
                    "STUNE_SYSFS_ROOT",
                    "STUNE_STATE_DIR",
                    "STUNE_HEALTH_PARTITION",
                    "STUNE_GPU_SNAPSHOT",
                )
            )
            + f"STUNE_BIN={bindir}\n"
        )
        hook_env = {
            "STUNE_ENV_FILE": str(defaults),
            "SLURMD_NODENAME": "n1",
            "SLURM_JOB_ID": "1",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        health = str(bindir / "stune-health")
        # a revision's own hook script beside its wheel (the before's, from its source)
        hook = (tmp / "before/src" if kind == f"wheel, {before}" else REPO) / "prolog/10-stune-health"
        runs.update(
            {
                f"check-snapshot ({kind})": (
                    [health, "check", "--snapshot", snapshot, "--partition", "hdr"],
                    kind_env,
                ),
                f"prolog-8-ports ({kind})": ([health, "prolog"], kind_env),
                f"prolog-hook ({kind})": ([str(hook)], hook_env),
            }
        )
    wall = compare(
        "bench_health",
        {k: (lambda a=a, e=e: time_once(a, env=e)) for k, (a, e) in runs.items()},
        rounds=rounds,
    )
    cpu = compare(
        "bench_health_cpu",
        {k: (lambda a=a, e=e: cpu_once(a, e)) for k, (a, e) in runs.items()},
        rounds=rounds,
    )
    print()
    for kind in bins:
        key = f"check-snapshot ({kind})"
        print(
            f"stune-health check --snapshot ({kind}) vs the bare interpreter start: "
            f"x{wall['ratio_to_baseline'][key]:.2f} wall, x{cpu['ratio_to_baseline'][key]:.2f} CPU (goal: <= 2.00)"
        )
        for key, goal in ((f"prolog-8-ports ({kind})", 0.5), (f"prolog-hook ({kind})", 0.7)):
            line = (
                f"{key} vs the bare start: x{wall['ratio_to_baseline'][key]:.2f} wall, "
                f"x{cpu['ratio_to_baseline'][key]:.2f} CPU"
            )
            if nhc:  # the time Slurm waits for: wall (NHC's watchdog sleeps and its children are not its CPU)
                ratio = wall["median_s"][key] / wall["median_s"][NHC]
                line += (
                    f"; vs NHC: x{ratio:.2f} wall (goal: <= {goal}: {'meets' if ratio <= goal else 'MISSES'})"
                )
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
