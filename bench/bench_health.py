"""The health hooks' own cost, as whole processes, against the bare interpreter start `python3 -I -S -c pass`
(the same interpreter; no `site`, which the prolog hook does not load either).

Goal (issues 3, 10 and 14): the prolog and `stune-health check` <= 2x the bare interpreter start, for this checkout's editable install
and for the wheel installed by a plain `pip install` into a fresh venv, side by side. For scale, LBNL NHC's
bash `check_hw_ib` for 8 ports is about 60 ms as a whole process on these machines.

- python -c pass: the same interpreter with `site` (a launcher's start), for reference;
- check-snapshot: `stune-health check --snapshot` judging an 8-GPU, 8-HCA snapshot (the DGX-A100 fixture:
  8 A100s, 8 ConnectX-6 ports plus the storage HCA) under the hdr profile, through the shipped launcher with
  stune's code cache (docs/speed.md; the warm-up rounds write it into each install's cache directory, as a
  node's first run would);
- check-snapshot, no code cache: the same through a launcher without the cache: what the cache saves (A/B);
- prolog-8-ports: `stune-health prolog` (the launcher, with `site`) on a DGX-A100 sysfs tree: the 8
  required IB ports (state, rate, counters, firmware), the socket interface and the 8 GPUs on the PCI bus,
  with the node state read and written;
- prolog-hook: the same through the shipped hook `prolog/10-stune-health`, as Slurm runs it: Python started
  with -I -S, the env file's trust check, stune imported from the installation. This is the prolog's cost.

Every process runs with PYTHONDONTWRITEBYTECODE=1: only bytecode the install left is used (the checkout is
compiled first). No Slurm is needed: neither path makes a Slurm call. Wall-clock medians are reported (the
harness's), and the child's CPU time (user + system) beside them, which a loaded machine distorts less.

    .venv/bin/python bench/bench_health.py [--rounds N]
"""
from __future__ import annotations

import compileall
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from common import BARE, compare, cpu_once, time_once, wheel_install  # noqa: E402

import healthkit  # noqa: E402


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 30
    # An editable checkout has bytecode only where something compiled it (PYTHONDONTWRITEBYTECODE below).
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-health-"))
    bins = {"editable": Path(sys.executable).parent, "wheel": wheel_install(tmp)}
    root = healthkit.tree(tmp / "root", "hdr")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.update(STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
               STUNE_SYSFS_ROOT=str(root), STUNE_STATE_DIR=str(tmp / "state"),
               STUNE_HEALTH_PARTITION="hdr", SLURMD_NODENAME="n1")
    # A node in service has had an epilog or periodic run: NVML's GPU list and the counter baselines are known.
    env["STUNE_GPU_SNAPSHOT"] = str(healthkit.gpu_file(tmp / "gpus.json"))
    snapshot = str(REPO / "tests/fixtures/snapshots/dgx-a100-ib.json")
    py = str(bins["editable"] / "python")
    runs = {BARE: ([py, "-I", "-S", "-c", "pass"], env), "python -c pass": ([py, "-c", "pass"], env)}
    for kind, bindir in bins.items():
        # one profile cache per install: the cache is keyed by the validating code's path
        kind_env = dict(env, STUNE_CACHE_DIR=str(tmp / f"cache-{kind}"))
        time_once([str(bindir / "stune-health"), "epilog"], env=kind_env)
        defaults = tmp / f"stune-{kind}.env"
        defaults.write_text("".join(f"{k}={kind_env[k]}\n" for k in (
            "STUNE_PARTITIONS", "STUNE_CACHE_DIR", "STUNE_SYSFS_ROOT", "STUNE_STATE_DIR", "STUNE_HEALTH_PARTITION",
            "STUNE_GPU_SNAPSHOT")) + f"STUNE_BIN={bindir}\n")
        hook_env = {"STUNE_ENV_FILE": str(defaults), "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1",
                    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "PYTHONDONTWRITEBYTECODE": "1"}
        health = str(bindir / "stune-health")
        # the shipped launcher less the code cache (codecache.py): what the cache saves
        no_cache = tmp / f"stune-health-no-code-cache-{kind}"
        no_cache.write_text(f"#!{bindir / 'python'}\nimport sys\nfrom slurm_tune.cli.health import main\n"
                            "sys.exit(main())\n")
        no_cache.chmod(0o755)
        check = ["check", "--snapshot", snapshot, "--partition", "hdr"]
        runs.update({
            f"check-snapshot ({kind})": ([health, *check], kind_env),
            f"check-snapshot, no code cache ({kind})": ([str(no_cache), *check], kind_env),
            f"prolog-8-ports ({kind})": ([health, "prolog"], kind_env),
            f"prolog-hook ({kind})": ([str(REPO / "prolog/10-stune-health")], hook_env),
        })
    wall = compare("bench_health", {k: (lambda a=a, e=e: time_once(a, env=e)) for k, (a, e) in runs.items()},
                   rounds=rounds)
    cpu = compare("bench_health_cpu", {k: (lambda a=a, e=e: cpu_once(a, e)) for k, (a, e) in runs.items()},
                  rounds=rounds)
    print()
    for kind in bins:
        key = f"check-snapshot ({kind})"
        print(f"stune-health check --snapshot ({kind}) vs the bare interpreter start: "
              f"x{wall['ratio_to_baseline'][key]:.2f} wall, x{cpu['ratio_to_baseline'][key]:.2f} CPU (goal: <= 2.00; "
              f"x{cpu['ratio_to_baseline'][f'check-snapshot, no code cache ({kind})']:.2f} CPU without the code cache)")
        key = f"prolog-hook ({kind})"
        print(f"the prolog as Slurm runs it ({kind}) vs the bare interpreter start: "
              f"x{wall['ratio_to_baseline'][key]:.2f} wall, x{cpu['ratio_to_baseline'][key]:.2f} CPU (goal: <= 2.00)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
