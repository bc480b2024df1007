"""`stune-fairshare job JOBID`: one job's record from sacct, its usage summary, or for a running job the
sampler's live accumulators (node-local: readable where the job runs, or through a `%n` usage dir)."""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import StuneError
from ..hostlist import expand_hostlist
from ..text import is_digits
from ..thisnode import expand
from ..usage import accum, spool, whyslow
from ..usage import summary as summary_mod
from ..usage.config import usage_dirs
from . import charges as charges_mod
from . import explain as explain_mod
from . import jobdoc
from . import sacct as sacct_mod


def check_job_id(job_id: str) -> str:
    """A job id as sacct takes it: `12345`, or `12345_7` for an array task. Anything else is refused here in one
    line, before sacct (whose own message for `abc` is a fatal error about its -j option)."""
    head, sep, task = job_id.partition("_")
    if not (is_digits(head) and (not sep or is_digits(task))) or len(job_id) > 40:
        raise StuneError(
            f"job {job_id!r}: not a Slurm job id (a number like 12345, or 12345_7 for an array task)"
        )
    return job_id


def _table(slurm, job_id: str):
    check_job_id(job_id)
    rows = slurm.sacct(list(sacct_mod.FIELDS), job_ids=[job_id])
    if not rows:
        raise StuneError(f"job {job_id}: not found in sacct (too old, or not a job id)")
    text = (
        "\n".join(
            ["|".join(sacct_mod.FIELDS)] + ["|".join(r.get(f, "") for f in sacct_mod.FIELDS) for r in rows]
        )
        + "\n"
    )
    table = sacct_mod.parse(text, "sacct")
    if not table.n:
        raise StuneError(f"job {job_id}: sacct's record could not be read")
    return table


def live_summary(slurm, config, table, i: int):
    """A running job's summary from the sampler's accumulators on every node of the job whose usage directory
    is readable from here (this node, or all of them through a `%n` usage dir); None when none is."""
    try:
        job = slurm.job(int(table.job_id_raw[i]))
    except (StuneError, ValueError):
        return None
    template, _ = usage_dirs(config, expand=False)
    nodes = expand_hostlist(job.nodes or "")
    docs = []
    now = time.time()
    for node in nodes:
        local = expand(template, node)
        if not os.path.exists(spool.acc_file(local, table.job_id_raw[i])):
            continue
        try:
            doc = spool.node_summary(local, table.job_id_raw[i], node, None, now)
        except (OSError, accum.AccumulatorError):
            continue
        if doc is not None:
            docs.append(doc)
    return summary_mod.merge(docs, expected_nodes=len(nodes)) if docs else None


def job_view(slurm, config, job_id: str) -> dict:
    table = _table(slurm, job_id)
    i = table.n - 1  # the latest run of a requeued job
    owner = table.assoc_keys[table.assoc[i]][1]
    if not explain_mod.may_see(owner):
        raise explain_mod.NotYours(f"job {job_id} belongs to another user: users see only their own jobs")
    acc = config.accountant
    live = live_summary(slurm, config, table, i) if table.state_of(i) == "RUNNING" else None
    if live is not None:
        # the accountant's rules on the live numbers: the summary the epilog would store now
        table.has_summary[i], table.held_s[i], table.used_s[i], table.covered_s[i] = (
            True,
            live.held,
            live.used,
            live.covered,
        )
    _eta, eta_seen, coverage, trusted, source = charges_mod.measured_eta(table, acc.coverage_min)
    bad = bool(table.bad_summary[i]) if table.bad_summary is not None else False
    row = {
        "eta": None if np.isnan(eta_seen[i]) else float(eta_seen[i]),
        "trusted": bool(trusted[i]),
        "coverage": float(coverage[i]),
        "source": {0: "none", 1: "stune", 2: "slurm-gpuutil"}[int(source[i])]
        + (" (live)" if live is not None else ""),
        "held_gpu_s": float(table.gpus[i] * table.elapsed[i]),
        "bad": bad,
    }
    summary = live if live is not None else summary_mod.parse(table.admin_comment[i])
    if summary is not None and bad:
        summary = None
    alpha = charges_mod.alpha_per_row(table, acc.alpha, acc.alpha_by)
    alpha = float(alpha[i]) if isinstance(alpha, np.ndarray) else float(alpha)
    doc = jobdoc.job_doc(
        table,
        i,
        row,
        summary,
        None,
        alpha,
        idle_power_w=config.report.idle_power_w,
        alpha_source=explain_mod.alpha_rule(acc.alpha_by, table, i),
    )
    doc.update(
        whyslow.why_sections(summary, "" if live is not None else table.admin_comment[i], table.partition[i])
    )
    if live is not None:
        doc["bottleneck"]["lines"].append(
            "(running: network, storage, transport and throughput come when it ends)"
        )
    return doc
