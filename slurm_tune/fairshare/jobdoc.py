"""`stune-fairshare job JOBID`'s document ("was my job idle?"): what one job held and used, per GPU and over
time, what it was charged and why, and what to do about it; rendered as text or a PNG timeline. jobview.py
reads the job's sacct record and usage summary, or for a running job the sampler's accumulators on this
node (run it on the job's node, e.g. `srun --jobid JOBID --overlap stune-fairshare job JOBID`), and builds
it here."""

from __future__ import annotations

import numpy as np

from ..durations import clock
from ..text import counted
from ..usage.whyslow import why_text
from .report_render import _need, amount, time_unit

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values, width: int = 48) -> str:
    """Utilization percentages (None = not measured) as block characters, `width` at most ('·' unmeasured)."""
    values = list(values)
    if not values:
        return ""
    if len(values) > width:  # downsample by bucket means, keeping unmeasured buckets unmeasured
        edges = np.linspace(0, len(values), width + 1).astype(int)
        out = []
        for a, b in zip(edges[:-1], edges[1:]):
            chunk = [v for v in values[a:b] if v is not None]
            out.append(sum(chunk) / len(chunk) if chunk else None)
        values = out
    return "".join(
        "·" if v is None else SPARK[min(len(SPARK) - 1, max(0, int(v / 100 * len(SPARK))))] for v in values
    )


def job_doc(
    table,
    i: int,
    charges_row: dict,
    summary,
    live: list | None,
    alpha: float,
    timeline: list | None = None,
    idle_power_w: float = 100.0,
    alpha_source: str | None = None,
) -> dict:
    """One job: GPUs, held/used GPU-hours, eta per GPU, what was charged and why. `alpha_source`: the
    accountant.alpha_by entry that set `alpha` (alpha_rule()), None for the default."""
    account, user = table.assoc_keys[table.assoc[i]]
    eta = charges_row["eta"]
    doc = {
        "job_id": table.job_id[i],
        "user": user,
        "account": account,
        "partition": table.partition[i],
        "state": table.state_of(i),
        "gpus": float(table.gpus[i]),
        "elapsed_s": int(table.elapsed[i]),
        "held_gpu_h": charges_row["held_gpu_s"] / 3600.0,
        "eta": eta,
        "trusted": charges_row["trusted"],
        "source": charges_row["source"],
        "coverage": charges_row["coverage"],
        "per_gpu": [],
        "charged_x": None,
        "why": "",
        "hints": [],
        "timeline": timeline or [],
        "alpha": alpha,
        "alpha_source": alpha_source,
        "exempt": alpha == 0,
    }
    if eta is not None:
        doc["used_gpu_h"] = doc["held_gpu_h"] * eta
        doc["idle_gpu_h"] = doc["held_gpu_h"] - doc["used_gpu_h"]
    gpus = (
        live
        if live is not None
        else (
            [
                {"node": g.node, "gpu": g.gpu, "sm": g.sm, "mem": g.mem, "watts": g.watts}
                for g in summary.per_gpu
            ]
            if summary
            else []
        )
    )
    doc["per_gpu"] = gpus
    if table.gpus[i] <= 0:
        doc["why"] = "no GPUs: charged as Slurm charges"
    elif charges_row["trusted"] and alpha == 0:
        doc["charged_x"] = 1.0
        doc["why"] = (
            f"measured {100 * eta:.0f}% GPU utilization, but the job is exempt from idle charges "
            f"({alpha_source or 'accountant.alpha = 0'}): charged as Slurm charges, x1.00"
        )
    elif charges_row["trusted"]:
        doc["charged_x"] = 1 + alpha * (1 - eta)
        doc["why"] = (
            f"measured {100 * eta:.0f}% GPU utilization over {100 * charges_row['coverage']:.0f}% of "
            f"the held time: charged Slurm's usage x (1 + {alpha:g} x {1 - eta:.2f}) = "
            f"x{doc['charged_x']:.2f}"
        )
    elif charges_row["bad"]:
        doc["charged_x"] = 1.0
        doc["why"] = "the usage summary is damaged or out of range: not trusted, charged as Slurm charges"
    else:
        doc["charged_x"] = 1.0
        doc["why"] = (
            "not measured (no usage summary, or too little of the held time sampled): charged as "
            "Slurm charges"
        )
    doc["hints"] = usage_hints(summary, eta, idle_power_w) if summary is not None else []
    if summary is not None:
        doc["drops"], doc["noproc_gpu_s"] = summary.drops, summary.noproc
        doc["busy_share"] = summary.busy / summary.covered if summary.covered > 0 else None
        doc["busy_w"] = summary.busy_w
        doc["stalled"] = any("near-idle power" in h for h in doc["hints"])
        if not doc["timeline"]:
            doc["timeline"] = summary.timeline_percent()
    return doc


SAWTOOTH_PER_HOUR = 20  # utilization falls per GPU-hour of sampled time that suggest a data-starved loop
SAWTOOTH_MIN = 5
STALL_BUSY_SHARE = 0.5


def usage_hints(summary, eta, idle_power_w: float) -> list[str]:
    """What to do, in the playbook's order: GPU utilization first, then storage, and only then NCCL."""
    hints: list[str] = []
    if summary is None:
        return hints
    if eta is not None and eta < 0.1:
        hints.append(
            "the GPUs were idle almost all the time: release them (end the job, or ask for fewer GPUs) "
            "instead of holding them"
        )
    if summary.held > 0 and summary.noproc >= 0.25 * summary.held:
        hints.append(
            f"no process ran on the GPUs for {100 * summary.noproc / summary.held:.0f}% of the held "
            "time (counted as idle)"
        )
    hours = summary.covered / 3600.0
    if (
        summary.drops >= SAWTOOTH_MIN
        and hours > 0
        and summary.drops / hours >= SAWTOOTH_PER_HOUR
        and (eta is None or eta < 0.9)
    ):
        hints.append(
            f"GPU waits for data: utilization rose and dropped {summary.drops / hours:.0f} times per "
            "GPU-hour; stage the dataset (stune-sbatch --stage) or add data-loader workers before "
            "tuning NCCL"
        )
    if (
        summary.covered > 0
        and summary.busy >= STALL_BUSY_SHARE * summary.covered
        and summary.busy_w is not None
        and summary.busy_w < idle_power_w
    ):
        hints.append(
            f"~100% utilization at near-idle power ({summary.busy_w:.0f} W < {idle_power_w:g} W) for "
            f"{100 * summary.busy / summary.covered:.0f}% of the time: a hung collective (NCCL) or a spin "
            "loop; check that the job still makes progress"
        )
    return hints


def job_text(doc: dict) -> str:
    lines = [
        f"job {doc['job_id']} ({doc['user']}/{doc['account']}, {doc['partition']}): {doc['state']}, "
        f"{counted(doc['gpus'], 'GPU')} for {clock(doc['elapsed_s'])}"
    ]

    unit, scale = time_unit([doc["held_gpu_h"]])
    if doc["eta"] is not None:
        lines.append(
            f"  {unit} held {amount(doc['held_gpu_h'], scale)}, used {amount(doc['used_gpu_h'], scale)} "
            f"({100 * doc['eta']:.0f}%), idle {amount(doc['idle_gpu_h'], scale)}"
        )
    else:
        lines.append(f"  {unit} held {amount(doc['held_gpu_h'], scale)}, utilization not measured")
    for g in doc["per_gpu"]:
        sm = "unmeasured" if g.get("sm") is None else f"{g['sm']:.0f}%"
        watts = "" if g.get("watts") is None else f", {g['watts']:.0f} W"
        lines.append(f"  {g['node']} GPU {g['gpu']}: utilization {sm}{watts}")
    if doc["timeline"]:
        lines.append(f"  timeline |{sparkline(doc['timeline'])}| (utilization over the job, '·' unmeasured)")
    lines.append(f"  charge: {doc['why']}")
    lines.extend(f"  hint: {hint}" for hint in doc["hints"])
    lines.extend(why_text(doc))
    return "\n".join(lines) + "\n"


def timeline_png(doc: dict, path: str) -> None:
    """The job's GPU utilization over its run, with the network's share of line rate and the storage read
    rate (relative to its peak) on the same time axis where the sampler measured them."""
    matplotlib = _need("matplotlib", "the PNG chart")
    matplotlib.use("Agg")
    plt = _need("matplotlib.pyplot", "the PNG chart")
    fig, ax = plt.subplots(figsize=(8, 3), dpi=110)
    series = doc["timeline"]
    xs = [i for i, v in enumerate(series) if v is not None]
    ax.plot(xs, [series[i] for i in xs], drawstyle="steps-post", color="#4c72b0", label="GPU utilization")
    extra = doc.get("series") or {}
    peak = extra.get("storage_peak_bps")
    for key, label, color in (
        ("network", "network, % of line rate", "#dd8452"),
        ("storage", f"storage read, % of {peak / 1e9:.2f} GB/s" if peak else "storage read", "#55a868"),
    ):
        values = extra.get(key) or []
        shown = [i for i, v in enumerate(values) if v is not None]
        if shown:  # the same 48 steps over the job as the GPU timeline
            scale = len(series) / len(values) if series else 1.0
            ax.plot([i * scale for i in shown], [values[i] for i in shown], drawstyle="steps-post",
                    color=color, label=label)  # fmt: skip
    if extra.get("network") or extra.get("storage"):
        ax.legend(loc="upper right", fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% (GPU, network, storage)")
    ax.set_xlabel("time (share of the job)" if series else "no timeline recorded")
    ax.set_title(
        f"job {doc['job_id']}: {counted(doc['gpus'], 'GPU')}, "
        + ("not measured" if doc["eta"] is None else f"{100 * doc['eta']:.0f}% used")
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
