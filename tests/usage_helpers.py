"""Snapshot GPU sources for driving the sampler: real `stune-health capture` files with utilization set."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_tune import safeio

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "snapshots" / "dgx-a100-ib.json"


def write_snapshot(
    path,
    sm: float | None,
    *,
    gpus: int = 4,
    mem: float | None = 30.0,
    power: float | None = 250.0,
    mem_used: int | None = 32 << 30,
    procs: int | None = None,
) -> str:
    """A copy of the DGX A100 capture with `gpus` GPUs all reading `sm` % SM utilization (None: no answer).
    Written atomically, so a running sampler never reads half a file."""
    snap = json.loads(FIXTURE.read_text())
    devices = copy.deepcopy(snap["gpus"]["devices"][:gpus])
    for dev in devices:
        dev["utilization"] = None if sm is None else {"gpu": sm, "memory": mem}
        dev["memory"] = None if mem_used is None else {"used": mem_used, "total": dev["memory"]["total"]}
        dev["power_w"] = power
        if procs is not None:  # the sampler's process check (None: unknown, as in a health capture)
            dev["processes"] = [{"pid": 1000 + i} for i in range(procs)]
    snap["gpus"]["devices"] = devices
    snap["gpus"]["count"] = len(devices)
    safeio.write_atomic(str(path), json.dumps(snap), mode=0o644)  # the sampler may be reading it
    return str(path)


def hermetic_env(tmp_path, **extra) -> dict:
    """An environment for hooks and CLIs under test that no installed stune can change: no inherited STUNE_*
    or SLURM_* variable, an empty hook environment file instead of /etc/default/stune, no fair-share config
    from /etc/stune (a missing file named explicitly is refused, so an empty one is given)."""
    env_file = Path(tmp_path) / "stune.env"
    env_file.touch()
    config = Path(tmp_path) / "fairshare-empty.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUNE_", "SLURM_"))}
    env.update(
        {
            "STUNE_ENV_FILE": str(env_file),
            "STUNE_FAIRSHARE_CONFIG": str(config),
            "SLURM_CONF": str(Path(tmp_path) / "no-slurm.conf"),
        }
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_sampler(
    snapshot: Path | None, local_dir: Path, env: dict, log: Path, *extra: str
) -> subprocess.Popen:
    """One `stune-gpu-sampler run` as a node's unit runs it, on a snapshot GPU source (None: the node's live
    backend) at 0.2 s ticks (`extra`: more options), its stderr in `log`."""
    return subprocess.Popen(
        [
            f"{os.path.dirname(sys.executable)}/stune-gpu-sampler",
            "run",
            *(["--gpu-snapshot", str(snapshot)] if snapshot is not None else []),
            "--local-dir",
            str(local_dir),
            "--interval",
            "0.2",
            *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),  # the sampler writes it; this copy is closed with the test process
    )


def stop_samplers(procs: Iterable[subprocess.Popen]) -> None:
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


@contextmanager
def accounting_hooks(
    cluster,
    root: Path,
    fragment: str,
    *,
    spool: Path,
    config: Path,
    store_log: Path,
    settings: dict[str, str] | None = None,
    ctld_env: dict[str, str] | None = None,
    conf: str = "",
) -> Iterator[Path]:
    """The usage pipeline's hooks on the dev cluster for one test module: `stune-admin install` with this
    module's spool and fair-share config (and `settings`) in the env file, EpilogSlurmctld running
    epilog/stune-usage-slurmctld with the same (and `ctld_env`), `PrologFlags=Alloc` (and `conf`'s lines) in
    the slurm.conf fragment `fragment`; slurmctld restarted, as EpilogSlurmctld is read only at its start.
    Afterwards the site's env file back, the fragment gone (even when the rest fails: a later run's slurmctld
    would not start on it) and slurmctld restarted. Yields the EpilogSlurmctld script."""
    from helpers import slurm_exports, slurm_path

    repo, venv_bin = Path(__file__).resolve().parent.parent, os.path.dirname(sys.executable)
    cluster.install_stune(
        STUNE_USAGE_SPOOL=str(spool), STUNE_FAIRSHARE_CONFIG=str(config), **(settings or {})
    )
    ctld = root / "epilog-slurmctld"
    more = "".join(f" {k}={v}" for k, v in (ctld_env or {}).items())
    ctld.write_text(
        f"#!/bin/sh\nexport PATH={slurm_path(f'{venv_bin}:/usr/bin:/bin')} {slurm_exports()} "
        f"STUNE_BIN={venv_bin} STUNE_FAIRSHARE_CONFIG={config} STUNE_USAGE_SPOOL={spool} "
        f"STUNE_USAGE_DIR=/nonexistent STUNE_USAGE_LOG={store_log}{more}\n"
        f"exec {repo}/epilog/stune-usage-slurmctld\n"
    )
    ctld.chmod(0o755)
    cluster.set_fragment(fragment, f"EpilogSlurmctld={ctld}\nPrologFlags=Alloc\n{conf}", reconfigure=False)
    cluster.restart_controller()
    try:
        yield ctld
    finally:
        try:
            cluster.install_stune()  # the site's own env file back
        finally:
            cluster.set_fragment(fragment, None, reconfigure=False)
            cluster.restart_controller()
