"""The health hooks' own cost, as whole processes, against a bare `python -c pass` on the same interpreter.

Goal (issue 3): each <= 2x the bare interpreter start. For scale, LBNL NHC's bash `check_hw_ib` for 8 ports
is about 60 ms as a whole process on these machines.

- check-snapshot: `stune-health check --snapshot` judging an 8-GPU, 8-HCA snapshot (the DGX-A100 fixture:
  8 A100s, 8 ConnectX-6 ports plus the storage HCA) under the hdr profile;
- prolog-8-ports: `stune-health prolog` on a DGX-A100 sysfs tree: the 8 required IB ports (state, rate,
  counters, firmware), the socket interface and the 8 GPUs on the PCI bus, with the node state read and
  written;
- prolog-hook: the same through the shipped sh wrapper `prolog/10-stune-health`, as Slurm runs it.

No Slurm is needed: neither path makes a Slurm call.

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

from common import compare, time_once  # noqa: E402

import healthkit  # noqa: E402


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 30
    # An installed package ships bytecode; this checkout may run with PYTHONDONTWRITEBYTECODE.
    compileall.compile_dir(str(REPO / "slurm_tune"), quiet=1)
    bindir = Path(sys.executable).parent
    tmp = Path(tempfile.mkdtemp(prefix="bench-health-"))
    root = healthkit.tree(tmp / "root", "hdr")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(STUNE_PARTITIONS=os.environ.get("STUNE_PARTITIONS", str(REPO / "partitions")),
               STUNE_CACHE_DIR=str(tmp / "cache"), STUNE_SYSFS_ROOT=str(root), STUNE_STATE_DIR=str(tmp / "state"),
               STUNE_HEALTH_PARTITION="hdr", SLURMD_NODENAME="n1")
    # A node in service has had an epilog or periodic run: NVML's GPU list and the counter baselines are known.
    env["STUNE_GPU_SNAPSHOT"] = str(healthkit.gpu_file(tmp / "gpus.json"))
    time_once([str(bindir / "stune-health"), "epilog"], env=env)
    defaults = tmp / "stune.env"
    defaults.write_text("".join(f"{k}={env[k]}\n" for k in ("STUNE_PARTITIONS", "STUNE_CACHE_DIR", "STUNE_SYSFS_ROOT",
                                                            "STUNE_STATE_DIR", "STUNE_HEALTH_PARTITION",
                                                            "STUNE_GPU_SNAPSHOT"))
                        + f"STUNE_BIN={bindir}\n")
    hook_env = {"STUNE_ENV_FILE": str(defaults), "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1"}
    snapshot = str(REPO / "tests/fixtures/snapshots/dgx-a100-ib.json")
    py, health = str(bindir / "python"), str(bindir / "stune-health")
    commands = {
        "python3 -I -S -c pass": lambda: time_once([py, "-I", "-S", "-c", "pass"], env=env),
        "python -c pass": lambda: time_once([py, "-c", "pass"], env=env),
        "check-snapshot": lambda: time_once([health, "check", "--snapshot", snapshot, "--partition", "hdr"], env=env),
        "prolog-8-ports": lambda: time_once([health, "prolog"], env=env),
        "prolog-hook": lambda: time_once([str(REPO / "prolog/10-stune-health")], env=hook_env),
    }
    result = compare("bench_health", commands, rounds=rounds, baseline="python3 -I -S -c pass")
    worst = max(v for k, v in result["ratio_to_baseline"].items() if not k.startswith("python"))
    print(f"\nworst ratio to the bare interpreter: x{worst:.2f} (goal: <= 2.00)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
