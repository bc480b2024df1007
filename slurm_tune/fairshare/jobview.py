"""`stune-fairshare job JOBID`: one job's record from sacct, its usage summary, or for a running job the
sampler's live accumulators (node-local: readable where the job runs, or through a `%n` usage dir)."""
from __future__ import annotations

import numpy as np

from ..errors import StuneError
from ..thisnode import expand_node
from ..usage import accum, spool
from ..usage import summary as summary_mod
from . import charges as charges_mod
from . import explain as explain_mod
from . import sacct as sacct_mod


def _table(slurm, job_id: str):
    rows = slurm.sacct(list(sacct_mod.FIELDS), job_ids=[job_id])
    if not rows:
        raise StuneError(f"job {job_id}: not found in sacct (too old, or not a job id)")
    text = "\n".join(["|".join(sacct_mod.FIELDS)] + ["|".join(r.get(f, "") for f in sacct_mod.FIELDS)
                                                     for r in rows]) + "\n"
    table = sacct_mod.parse(text, "sacct")
    if not table.n:
        raise StuneError(f"job {job_id}: sacct's record could not be read")
    return table


def live_gpus(slurm, config, table, i: int) -> list[dict] | None:
    """Per-GPU means from the sampler's accumulators of a running job, on every node of the job whose usage
    directory is readable from here; None when none is."""
    from .config import usage_dirs

    try:
        job = slurm.job(int(table.job_id_raw[i]))
    except (StuneError, ValueError):
        return None
    from ..slurm import expand_hostlist

    template, _ = usage_dirs(config, expand=False)
    out = []
    for node in expand_hostlist(job.nodes or ""):
        path = spool.acc_file(expand_node(template, node), table.job_id_raw[i])
        try:
            _, gpus = accum.read(path)
        except (OSError, accum.AccumulatorError):
            continue
        for g in gpus:
            out.append({"node": node, "gpu": str(int(g["gpu_id"])),
                        "sm": 100.0 * g["sm_sum"] / g["sm_dt"] if g["sm_dt"] > 0 else None,
                        "mem": 100.0 * g["mem_sum"] / g["mem_dt"] if g["mem_dt"] > 0 else None,
                        "watts": g["pw_sum"] / g["pw_dt"] if g["pw_dt"] > 0 else None,
                        "sm_sum": g["sm_sum"], "sm_dt": g["sm_dt"]})
    return out or None


def job_view(slurm, config, job_id: str) -> dict:
    table = _table(slurm, job_id)
    i = table.n - 1  # the latest run of a requeued job
    owner = table.assoc_keys[table.assoc[i]][1]
    if not explain_mod.may_see(owner):
        raise explain_mod.NotYours(f"job {job_id} belongs to another user: users see only their own jobs")
    acc = config.accountant
    live = live_gpus(slurm, config, table, i) if table.state_of(i) == "RUNNING" else None
    if live:
        # the accountant's rules on the live numbers: a summary made from what the sampler holds now
        used = sum(g["sm_sum"] for g in live)
        covered = sum(g["sm_dt"] for g in live)
        held = float(table.gpus[i] * table.elapsed[i])
        table.has_summary[i], table.held_s[i], table.used_s[i], table.covered_s[i] = True, held, used, covered
        for g in live:
            g.pop("sm_sum"), g.pop("sm_dt")
    eta, eta_seen, coverage, trusted, source = charges_mod.measured_eta(table, acc.coverage_min)
    bad = bool(table.bad_summary[i]) if table.bad_summary is not None else False
    row = {"eta": None if np.isnan(eta_seen[i]) else float(eta_seen[i]), "trusted": bool(trusted[i]),
           "coverage": float(coverage[i]), "source": {0: "none", 1: "stune", 2: "slurm-gpuutil"}[int(source[i])]
           + (" (live)" if live else ""), "held_gpu_s": float(table.gpus[i] * table.elapsed[i]), "bad": bad}
    summary = summary_mod.parse(table.admin_comment[i]) if not live else None
    alpha = charges_mod.alpha_per_row(table, acc.alpha, acc.alpha_by)
    alpha = float(alpha[i]) if isinstance(alpha, np.ndarray) else float(alpha)
    doc = explain_mod.job_doc(table, i, row, summary, live, alpha)
    return doc
