"""Shared benchmark harness: interleaved runs of a subject and its baselines, medians, spread and ratios.

Every start-up figure is a ratio to BARE, the bare interpreter `python3 -I -S -c pass` (no `site`), timed in
the same run: `bare_start()` gives that command, so no bench picks another reference by accident.
`wheel_install()` builds this checkout's wheel and installs it with a plain `pip install` into a fresh
virtualenv as README installs it (without setuptools, or with it), so a bench can time the installed commands
beside the editable ones (docs/speed.md).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
BARE = "python3 -I -S -c pass"


def time_once(
    argv: list[str],
    env: dict | None = None,
    stdin: bytes | None = None,
    cwd: str | None = None,
    user: str | None = None,
) -> float:
    """The command's wall time; `user`: run as that user (the bench runs as root), as a user's command runs."""
    start = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, user=user
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"bench: {' '.join(argv[:4])} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}"
        )
    return elapsed


def cpu_once(
    argv: list[str], env: dict | None = None, cwd: str | None = None, user: str | None = None
) -> float:
    """The child's CPU seconds (user + system): less distorted than wall time by other load on the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, user=user
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(
            f"bench: {' '.join(argv[:4])} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}"
        )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bare_start(env: dict | None = None, cwd: str | None = None, python: str | None = None):
    """The baseline command BARE, of the interpreter the subjects run on (a venv's python is the same binary)."""
    argv = [python or sys.executable, "-I", "-S", "-c", "pass"]
    return lambda: time_once(argv, env=env, cwd=cwd)


def compare(
    name: str, commands: dict[str, callable], rounds: int = 30, warmup: int = 3, baseline: str | None = None
) -> dict:
    """Run each command (a zero-argument callable returning seconds) `rounds` times, interleaved so drift in
    machine load hits every command alike. Returns and saves {command: median seconds}, the quartiles, and
    ratios to the baseline (BARE when it is one of the commands, else the first)."""
    for _ in range(warmup):
        for fn in commands.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(rounds):
        for key, fn in commands.items():
            samples[key].append(fn())
    medians = {k: statistics.median(v) for k, v in samples.items()}
    base = baseline or (BARE if BARE in commands else next(iter(commands)))
    quartiles = {k: _quartiles(v) for k, v in samples.items()}
    result = {
        "name": name,
        "rounds": rounds,
        "baseline": base,
        "median_s": medians,
        "quartiles_s": quartiles,
        "ratio_to_baseline": {k: v / medians[base] for k, v in medians.items()},
        "host": os.uname().nodename,
        "python": sys.version.split()[0],
        "when": time.strftime("%F %T"),
        "load": os.getloadavg()[0],
    }
    report(result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def report(result: dict) -> None:
    print(
        f"\n{result['name']}  ({result['rounds']} interleaved rounds, medians and interquartile range; "
        f"baseline: {result['baseline']}; load {result.get('load', 0):.1f})"
    )
    width = max(len(k) for k in result["median_s"])
    base = result["median_s"][result["baseline"]]
    for key, med in result["median_s"].items():
        low, high = result["quartiles_s"][key]
        print(
            f"  {key:{width}s}  {med * 1000:9.2f} ms   x{result['ratio_to_baseline'][key]:.2f}"
            f"  (x{low / base:.2f}-x{high / base:.2f})"
        )


def own_cost(result: dict, subject: str, wrapped: str) -> float:
    """What `subject` adds to the command it wraps (stune-sbatch over sbatch), as a multiple of the baseline."""
    med = result["median_s"]
    return (med[subject] - med[wrapped]) / med[result["baseline"]]


def wheel_install(workdir: Path, keep_setuptools: bool = False) -> Path:
    """This checkout as a site installs it (README's "Installing on a real cluster"): the wheel built from the
    tree, installed by the pip of a fresh `python3 -m venv` (the distribution's pip, as an admin would use
    it), dependencies from the configured index, then setuptools removed (stune needs none; its .pth runs at
    every start). `keep_setuptools`: leave it, as a venv of Python 3.11 and older has it by default. Returns the
    venv's bin directory. Checks that pip left bytecode for the package, so a PYTHONDONTWRITEBYTECODE
    environment does not recompile it at every start."""
    dist, venv = workdir / "dist", workdir / ("venv-setuptools" if keep_setuptools else "venv")
    run = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "check": True}
    wheels = list(dist.glob("slurm_tune-*.whl"))
    if not wheels:
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
                str(dist),
                str(REPO),
            ],
            cwd=str(workdir),
            **run,
        )
        wheels = list(dist.glob("slurm_tune-*.whl"))
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], **run)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheels[0])], **run)
    if not keep_setuptools:
        subprocess.run([str(venv / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], **run)
    site = next(venv.glob("lib/python3*/site-packages"))
    missing = [
        str(p)
        for p in (site / "slurm_tune").rglob("*.py")
        if not (p.parent / "__pycache__" / f"{p.stem}.{sys.implementation.cache_tag}.pyc").exists()
    ]
    if missing:
        raise SystemExit(f"bench: pip installed no bytecode for {missing[:3]} ...")
    return venv / "bin"
