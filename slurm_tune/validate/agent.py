"""What runs inside a validation job (`stune-validate agent --spec JSON`), on its node: each layer's script
(opsuite.py, trainrun.py) by the node's PyTorch interpreter, under the layer's deadline (the whole process
group is killed at it), read back (scriptout.py), with the node's fingerprint added; one
`STUNE-VALIDATE-RECORD {json}` line per layer, which stune-validate run reads from the job's output file and
judges (judge.py). The spec comes from `run` on the command line, so the node needs no profile.

The interpreter: the spec's `python` (validate.python, else active.tools.python), else this one. It needs
torch (torch_npu on Ascend), not stune: the scripts are run by path. A configured interpreter that is not an
executable file, or one without torch, is `unavailable` with what to install, never a failure.
"""

from __future__ import annotations

import os
import time

from ..active.agent import fingerprint, run_bounded
from ..active.checks import tool_path
from ..output import compact_json
from . import scriptout
from .records import MEASURED

RECORD_MARK = "STUNE-VALIDATE-RECORD "
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"ops": "opsuite.py", "converge": "trainrun.py"}


def _argv(python: str, layer: str, spec: dict) -> list[str]:
    argv = [python, os.path.join(HERE, SCRIPTS[layer]), "--seed", str(spec["seed"]), "--json"]
    if layer == "converge":
        argv += ["--steps", str(spec["steps"]), "--cold-steps", str(spec["cold_steps"])]
    return argv


def base_record(spec: dict, layer: str, node: str, job: str, fp: dict) -> dict:
    r = {
        "at": round(time.time(), 3),
        "partition": spec.get("partition", ""),
        "layer": layer,
        "node": node,
        "job": job,
        "status": "unknown",
        "detail": "",
        "fingerprint": fp,
        "seed": spec["seed"],
    }
    if layer == "ops":
        r["ops"] = []
    else:
        r.update(losses=[], steps=spec["steps"], band=spec["band"], reference=None, max_dev=None)
    return r


def record_from(base: dict, status: str, reading: dict | None, detail: str) -> dict:
    """The layer's record from the script's reading: the versions into the fingerprint, the operators
    `measured` (judged on the submitting host)."""
    if reading is None:
        return dict(base, status=status, detail=detail)
    fp = dict(base["fingerprint"], **{k: reading[k] for k in ("torch", "device", "backend")})
    fp["accel"] = reading["accel_version"]
    if reading["backend"] == "cuda" and not fp.get("cuda"):
        fp["cuda"] = reading["accel_version"][:20]
    r = dict(base, fingerprint=fp, seed=reading["seed"], detail="measured, not judged yet")
    if base["layer"] == "ops":
        r["ops"] = [dict(e, status=MEASURED) if e["status"] == "ok" else e for e in reading["ops"]]
    else:
        r.update({k: reading[k] for k in scriptout.CONVERGE_KEYS})
    return r


def run_layer(spec: dict, layer: str, python: str, env: dict, base: dict) -> dict:
    timeout = float(spec["timeouts"][layer])
    out, code = run_bounded(_argv(python, layer, spec), timeout, env)
    if code is None:
        return dict(base, detail=f"the {layer} script was killed at its deadline ({timeout:.0f}s)")
    if code == 127 and out.startswith(b"cannot start"):
        return dict(base, status="unavailable", detail=out.decode("utf-8", "replace")[:300])
    status, reading, detail = scriptout.parse(out, layer)
    return record_from(base, status, reading, detail)


def run_spec(spec: dict, emit=print, environ=None) -> int:
    environ = dict(os.environ if environ is None else environ)
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    job = environ.get("SLURM_JOB_ID", "")
    fp = fingerprint(environ, spec.get("accelerator") or "nvidia")
    configured = spec.get("python")
    python = tool_path({"python": configured} if configured else {}, "python")
    for layer in spec["layers"]:
        base = base_record(spec, layer, node, job, fp)
        if python is None:
            r = dict(
                base,
                status="unavailable",
                detail=f"{configured} ({spec.get('python_from') or 'validate.python'}) is not an executable "
                "file: install a Python with torch there (torch_npu on Ascend)",
            )
        else:
            r = run_layer(spec, layer, python, environ, base)
        emit(RECORD_MARK + compact_json(r))
    return 0
