"""Synthetic stored records for the comparison and acceptance tests: check results, validation layers and
scaling curves of NVIDIA, AMD and Ascend partitions, in the store's formats."""

from __future__ import annotations

from pathlib import Path

from slurm_tune.active import store

REPO = Path(__file__).resolve().parent.parent
NV = {"driver": "535.104.05", "cuda": "12.2", "nccl": "2.19.3", "hca_fw": "20.31.1014", "kernel": "5.15.0"}
AMD = {
    "driver": "",
    "cuda": "",
    "nccl": "2.21.5",
    "hca_fw": "",
    "kernel": "5.15.0",
    "vendor": "amd",
    "rocm": "6.2.0",
    "amdgpu_driver": "6.8.5",
}
ASCEND = {
    "driver": "",
    "cuda": "",
    "nccl": "",
    "hca_fw": "",
    "kernel": "5.10.0",
    "vendor": "ascend",
    "npu_driver": "24.1.rc2",
    "npu_firmware": "7.5.0.1.129",
    "cann": "8.0.RC2",
}
UNITS = {"numeric": "", "dcgm_diag": "", "ib_write_bw": "Gb/s", "iperf3": "Gb/s"}


def result(partition, check, subject, value, at, sweep="s1", fp=None, status="ok", run=0) -> dict:
    return {
        "at": at,
        "sweep": sweep,
        "partition": partition,
        "check": check,
        "subject": subject,
        "nodes": subject.split("+"),
        "hca": None,
        "run": run,
        "status": status,
        "value": value,
        "unit": UNITS.get(check, "GB/s"),
        "detail": "",
        "fingerprint": dict(fp or NV),
        "job": "1",
    }


def sweeps(partition, nodes, checks, start, fp=None, n_sweeps=3, runs=3, slow=(), fps=None) -> list[dict]:
    """`checks`: check -> value (None: a pass/fail check that passes); `slow`: nodes at 0.7x in 2 of 3
    runs; `fps`: node -> its own fingerprint."""
    out = []
    at = start
    for s in range(n_sweeps):
        for node in nodes:
            for check, value in checks.items():
                for run in range(runs):
                    v = value
                    if v is not None and node in slow and run != 1:
                        v = value * 0.7
                    fp_node = (fps or {}).get(node, fp)
                    out.append(result(partition, check, node, v, at, f"s{s}", fp_node, run=run))
                    at += 1.0
        at += 3600
    return out


def validate(partition, layer, node, status, at, fp=None, **extra) -> dict:
    r = {
        "at": at,
        "partition": partition,
        "layer": layer,
        "node": node,
        "job": "7",
        "status": status,
        "detail": extra.pop("detail", ""),
        "fingerprint": dict(fp or NV, torch="2.3.1", device="H100", backend="cuda"),
    }
    r.update(extra)
    # what stune-validate's writer always puts in (validate/records.py checks it)
    if layer == "converge":
        r.setdefault("losses", [2.3, 1.9, 1.7])
        r.setdefault("max_dev", 0.0)
        r.setdefault("band", 0.05)
    elif layer == "training":
        r.setdefault("metrics", {})
    return r


def op(name, dtype, status="pass", max_rel=1e-4, tol_rel=1e-2) -> dict:
    return {
        "op": name,
        "dtype": dtype,
        "status": status,
        "max_abs": max_rel,
        "max_rel": max_rel,
        "tol_abs": tol_rel,
        "tol_rel": tol_rel,
        "ref": "cpu-fp64",
    }


def curve(partition, scope, effs, at, verdict="pass", knee=None, check="nccl_allreduce", fp=None) -> dict:
    return {
        "at": at,
        "partition": partition,
        "sweep": "c1",
        "scope": scope,
        "check": check,
        "unit": "GB/s",
        "points": [
            {"n": n, "nodes": [], "value": 100.0 * e, "status": "ok", "efficiency": e, "detail": ""}
            for n, e in effs.items()
        ],
        "baseline": 100.0,
        # the keys the writer (scaling_judge.py) always gives a knee
        "knee": None if knee is None else {"nodes_added": [], "switches": [], "pairs": [], **knee},
        "verdict": verdict,
        "fingerprint": dict(fp or NV),
    }


def put(directory, partition, results=(), validate=(), scaling=()) -> None:
    for kind, records in (("results", results), ("validate", validate), ("scaling", scaling)):
        if records:
            store.append(str(directory), partition, list(records), kind=kind)
