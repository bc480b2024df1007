"""Import-weight checks that give the same answer on every machine, and the hot paths' import rule as data
(docs/speed.md states the rule; tests/test_imports.py applies it to every hot entry point).

The code runs in a fresh interpreter started without `site` (`-I -S`, as the prolog hook starts it) with only
this checkout on sys.path, and the modules the bare interpreter loads by itself are not counted. So neither
how stune is installed (a default `pip install -e` registers a finder that imports pathlib and re at every
interpreter start; the `compat` mode does not) nor anything else in site-packages changes the result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_MARK = "--stune-modules--"

# What no hot path may load (docs/speed.md): each costs the bare start a noticeable share by itself (re ~0.8x,
# json ~0.8x through re, yaml several x, numpy and pynvml tens of ms) or pulls in such modules.
HEAVY = frozenset(
    {
        "re",
        "json",
        "subprocess",
        "typing",
        "dataclasses",
        "enum",
        "argparse",
        "socket",
        "threading",
        "collections",
        "shutil",
        "tempfile",
        "hashlib",
        "datetime",
        "shlex",
        "fnmatch",
        "pathlib",
        "yaml",
        "numpy",
        "matplotlib",
        "pynvml",
        "rich",
        "prometheus_client",
        # the profile schema and its validation: only a profile cache miss needs them (profilestore)
        "slurm_tune.profiles",
        "slurm_tune.profilecheck",
        "slurm_tune.schema",
    }
)


def _run(code: str, env: dict | None) -> set[str]:
    script = (
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{code}\n"
        f"print({_MARK!r}, ' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        capture_output=True,
        text=True,
        env=dict(os.environ) if env is None else env,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith(_MARK))
    return set(line[len(_MARK) :].split())


def loaded_by(code: str, env: dict | None = None) -> set[str]:
    """Modules that running `code` adds to what a bare `python -I -S` has loaded."""
    return _run(code, env) - _run("pass", env)
