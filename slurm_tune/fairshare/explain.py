"""What a user reads: `stune-fairshare explain [USER]` ("why is my priority low?") and
`stune-fairshare job JOBID` ("was my job idle?").

Both build a plain dict (the --json output) and render it as a few lines of text. `explain` comes from an
accountant run (the same numbers `apply` uses); `job` reads one job's sacct record and its usage summary, or,
for a running job, the sampler's accumulators on this node (run it on the job's node, e.g. with
`srun --jobid JOBID --overlap stune-fairshare job JOBID`). Users see only their own jobs and associations;
root sees all.
"""

from __future__ import annotations

import os
import pwd
import time

import numpy as np

from ..durations import clock, compact
from ..errors import StuneError
from ..text import counted
from .accountant import site_factor_target

SPARK = "▁▂▃▄▅▆▇█"


class NotYours(StuneError):
    """A user asked about another user's job or priority."""


def current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def may_see(owner: str, who: str | None = None) -> bool:
    """root sees everything; anyone else only their own."""
    return os.getuid() == 0 or owner == (who or current_user())


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


# ---- explain --------------------------------------------------------------------------------------------
def explain(result, config, user: str, pending: list | None = None) -> dict:
    """Why `user`'s priority is what it is: per association, Slurm's and stune's fair share, the SiteFactor
    (the penalty in priority points), the jobs that cost the most idle GPU-hours, and the account's usage
    (Fair Tree compares accounts first: a colleague's idle GPUs in the same account lower you too)."""
    table, ch = result.table, result.charges
    weight = result.settings.weight_fairshare
    alpha = config.accountant.alpha
    keys = [k for k in result.tree.index if k[1] == user] if hasattr(result.tree, "index") else []
    keys = [k for k in keys if result.shares_slurm.factor(*k) is not None] or [
        k for k in table.assoc_keys if k[1] == user
    ]
    if not keys:
        raise StuneError(f"{user}: no fair-share association found (sacctmgr show assoc where user={user})")
    all_users = [k for k in result.shares_stune.factors]
    sshare = {(r.account, r.user): r.fairshare for r in (result.sshare or []) if r.user}
    ran = table.ran & (table.gpus > 0)
    held_h = ch.held_gpu_s / 3600.0
    idle_h = np.where(ch.trusted, held_h * (1.0 - ch.eta), 0.0)
    doc = {
        "user": user,
        "as_of": result.as_of,
        "algorithm": result.settings.algorithm,
        "weight_fairshare": weight,
        "alpha": alpha,
        "site_line": [round(v, 3) for v in result.site_line],
        "half_life_s": float(result.settings.half_life_s),
        "window_s": int(result.as_of - since_of(result)),
        "exempt_rules": exempt_rules(config.accountant.alpha_by),
        "associations": [],
        "pending": [],
        "warnings": list(result.warnings),
    }
    code = {k: i for i, k in enumerate(table.assoc_keys)}
    for account, name in keys:
        f_slurm, f_stune = (
            result.shares_slurm.factor(account, name),
            result.shares_stune.factor(account, name),
        )
        entry = {
            "account": account,
            "fairshare_slurm": f_slurm,
            "fairshare_stune": f_stune,
            "fairshare_sshare": sshare.get((account, name)),
            "site_factor": None,
            "rank_slurm": _rank(result.shares_slurm.factors, (account, name)),
            "rank_stune": _rank(result.shares_stune.factors, (account, name)),
            "users": len(all_users),
            "usage_slurm": result.usage_slurm.get((account, name), 0.0),
            "usage_stune": result.usage_stune.get((account, name), 0.0),
        }
        if f_slurm is not None and f_stune is not None:
            entry["site_factor"] = site_factor_target(config, weight, f_slurm, f_stune, result.site_line)
        rows = np.flatnonzero(ran & (table.assoc == code.get((account, name), -1)))
        entry["held_gpu_h"] = float(held_h[rows].sum())
        measured = rows[ch.trusted[rows]]
        entry["used_gpu_h"] = float((held_h[measured] * ch.eta[measured]).sum())
        entry["idle_gpu_h"] = float(idle_h[rows].sum())
        entry["unmeasured_gpu_h"] = float(held_h[rows[~ch.trusted[rows]]].sum())
        # what idle time cost: idle GPU-hours x the job's alpha. A job whose alpha is 0 (accountant.alpha_by)
        # cost nothing, however idle: it is named apart, as exempt, never among the costly ones
        alphas = np.array([_alpha_of(ch, i) for i in rows.tolist()], dtype=float)
        cost = idle_h[rows] * alphas
        charged = rows[(cost > 0)]
        top = charged[np.argsort(-cost[cost > 0], kind="stable")][:5]
        entry["top_idle_jobs"] = [
            {
                "job_id": table.job_id[i],
                "gpus": float(table.gpus[i]),
                "held_gpu_h": float(held_h[i]),
                "eta": float(ch.eta[i]) if ch.trusted[i] else None,
                "idle_gpu_h": float(idle_h[i]),
                "charged_x": float(1 + _alpha_of(ch, i) * (1 - ch.eta[i])),
                "end": int(table.end[i]),
            }
            for i in top.tolist()
        ]
        exempt = rows[(alphas == 0) & (idle_h[rows] > 0)]
        entry["exempt_idle_gpu_h"] = float(idle_h[exempt].sum())
        entry["exempt_jobs"] = [
            {
                "job_id": table.job_id[i],
                "idle_gpu_h": float(idle_h[i]),
                "rule": alpha_rule(config.accountant.alpha_by, table, i),
            }
            for i in exempt[np.argsort(-idle_h[exempt], kind="stable")][:5].tolist()
        ]
        siblings = {
            u: (result.usage_slurm.get((a, u), 0.0), result.usage_stune.get((a, u), 0.0))
            for a, u in result.usage_stune
            if a == account
        }
        entry["account_usage_slurm"] = sum(v[0] for v in siblings.values())
        entry["account_usage_stune"] = sum(v[1] for v in siblings.values())
        entry["account_users"] = len(siblings)
        doc["associations"].append(entry)
    for row in pending or []:
        if row.user == user:
            doc["pending"].append(
                {
                    "job_id": row.job_id,
                    "priority": row.priority,
                    "fairshare": row.fairshare,
                    "site_factor": row.site,
                    "age": row.age,
                    "partition": row.partition,
                }
            )
    return doc


def since_of(result) -> int:
    """Where the usage shown starts: the run's window, else its first job."""
    if result.window_start is not None:
        return int(result.window_start)
    table = result.table
    if not table.n:
        return int(result.as_of)
    end = np.where(table.end >= 0, table.end, result.as_of)  # a running job has no end yet
    return int((end - table.elapsed).min())


def _alpha_by(alpha_by) -> dict:
    return alpha_by.to_dict() if hasattr(alpha_by, "to_dict") else dict(alpha_by or {})


def alpha_rule(alpha_by, table, i: int) -> str | None:
    """The accountant.alpha_by entry that sets job i's idle penalty, in the order the charges apply them (QOS,
    then partition, then account), e.g. `QOS debug, accountant.alpha_by.qos.debug = 0`; None: the default."""
    by = _alpha_by(alpha_by)
    qos = table.qos_names[table.qos[i]] if len(table.qos_names) else ""
    names = (
        ("qos", "QOS", qos),
        ("partition", "partition", str(table.partition[i]).split(",", 1)[0]),
        ("account", "account", table.assoc_keys[table.assoc[i]][0]),
    )
    for key, label, name in names:
        entries = by.get(key) or {}
        if name in entries:
            return f"{label} {name}, accountant.alpha_by.{key}.{name} = {entries[name]:g}"
    return None


def exempt_rules(alpha_by) -> list[str]:
    """The QOS, partitions and accounts never charged for idle GPUs (alpha 0), e.g. ['QOS debug']."""
    by = _alpha_by(alpha_by)
    return [
        f"{label} {name}"
        for key, label in (("qos", "QOS"), ("partition", "partition"), ("account", "account"))
        for name, value in sorted((by.get(key) or {}).items())
        if value == 0
    ]


def _alpha_of(ch, i: int) -> float:
    return float(ch.alpha[i]) if isinstance(ch.alpha, np.ndarray) else float(ch.alpha)


def _rank(factors: dict, key) -> int | None:
    if key not in factors:
        return None
    mine = factors[key]
    return 1 + sum(1 for v in factors.values() if v > mine)


def explain_text(doc: dict) -> str:
    """In plain words: what you used, where Slurm and stune rank you, what that does to your pending jobs,
    which jobs cost you the most, and what you can do about it."""
    from .report import amount, time_unit

    assocs = doc["associations"]
    unit, scale = time_unit(
        [a["held_gpu_h"] for a in assocs] + [j["held_gpu_h"] for a in assocs for j in a["top_idle_jobs"]]
    )
    alpha = doc["alpha"]
    lines = [f"{doc['user']}: why your priority is what it is (as of {_when(doc['as_of'])})"]
    for a in assocs:
        lines.append(f"  account {a['account']}:")
        eff = (
            ""
            if a["held_gpu_h"] <= a["unmeasured_gpu_h"]
            else f" ({100 * a['used_gpu_h'] / max(a['held_gpu_h'] - a['unmeasured_gpu_h'], 1e-12):.0f}%)"
        )
        lines.append(
            f"    your GPU time over the last {compact(doc['window_s'])}, in {unit}: held "
            f"{amount(a['held_gpu_h'], scale)}, used {amount(a['used_gpu_h'], scale)}{eff}, idle "
            f"{amount(a['idle_gpu_h'], scale)}, not measured {amount(a['unmeasured_gpu_h'], scale)}"
        )
        if a["fairshare_slurm"] is not None and a["fairshare_stune"] is not None:
            lines.append(
                f"    Slurm alone ranks you {a['rank_slurm']} of {counted(a['users'], 'user')} (fair share "
                f"{_f(a['fairshare_slurm'])}, 0 to 1, higher runs sooner); with idle GPU time charged, "
                f"stune ranks you {a['rank_stune']} of {a['users']} ({_f(a['fairshare_stune'])})"
            )
        site = a["site_factor"]
        if site is None:
            lines.append(
                "    no fair-share factor for this association: stune leaves your jobs' priority alone"
            )
        elif site == 0:
            lines.append(
                "    no penalty: your pending jobs keep the priority Slurm gives them (SiteFactor 0)"
            )
        else:
            lines.append(
                f"    so your pending jobs get {-site} priority points fewer than Slurm alone gives them "
                f"(SiteFactor {site})"
            )
        lines.append(
            f"    a GPU held but idle is charged {1 + alpha:g}x its time, a fully used one 1x (idle "
            f"penalty {alpha:g}, accountant.alpha)"
        )
        if a["top_idle_jobs"]:
            lines.append(f"    the jobs whose idle GPUs cost you the most ({unit}):")
            for j in a["top_idle_jobs"]:
                eta = "not measured" if j["eta"] is None else f"{100 * j['eta']:.0f}% used"
                lines.append(
                    f"      job {j['job_id']}: {counted(j['gpus'], 'GPU')}, {amount(j['held_gpu_h'], scale)} "
                    f"held, {eta}, {amount(j['idle_gpu_h'], scale)} idle: charged x{j['charged_x']:.2f}"
                )
        for j in a.get("exempt_jobs", []):
            rule = f" ({j['rule']})" if j["rule"] else ""
            lines.append(
                f"    job {j['job_id']}: {amount(j['idle_gpu_h'], scale)} idle {unit}, not charged: "
                f"exempt from idle charges{rule}"
            )
        if doc["algorithm"] == "fair_tree" and a["account_users"] > 1:
            share = a["usage_stune"] / a["account_usage_stune"] if a["account_usage_stune"] > 0 else 0.0
            lines.append(
                f"    Slurm's Fair Tree compares account {a['account']} with the other accounts first, so "
                f"the {a['account_users']} users' GPU time in it counts for you too (yours is "
                f"{100 * share:.0f}% of it)"
            )
    for p in doc["pending"]:
        lines.append(
            f"  pending job {p['job_id']} ({p['partition']}): priority {p['priority']} = fair share "
            f"{p['fairshare']} + age {p['age']} + SiteFactor {p['site_factor']} (+ other factors)"
        )
    penalized = any(a["site_factor"] for a in assocs)
    if penalized or any(a["idle_gpu_h"] > 0 for a in assocs):
        lines.append("  what you can do:")
        lines.append(
            "    - end jobs whose GPUs sit idle, and ask only for the GPUs your code uses (--gres=gpu:N)"
        )
        lines.append(
            "    - see where a job's GPU time went: stune-fairshare job JOBID (utilization over time, "
            "with hints)"
        )
        if doc.get("exempt_rules"):
            lines.append(
                f"    - for debugging or interactive work use {', '.join(doc['exempt_rules'])}: never "
                "charged for idle GPUs"
            )
        lines.append(
            f"    - the charge fades: Slurm counts usage half after {compact(doc['half_life_s'])} "
            "(PriorityDecayHalfLife), so well-used GPUs from now on lift you back"
        )
    if doc["pending"] or penalized:
        lines.append(
            "  (Slurm recomputes fair share every PriorityCalcPeriod, so sprio can lag a few minutes)"
        )
    for w in doc["warnings"]:
        lines.append(f"  warning: {w}")
    return "\n".join(lines) + "\n"


# ---- job ------------------------------------------------------------------------------------------------
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
    hints = []
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
    from .report import amount, time_unit

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
    for hint in doc["hints"]:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines) + "\n"


def timeline_png(doc: dict, path: str) -> None:
    from .report import _need

    matplotlib = _need("matplotlib", "the PNG chart")
    matplotlib.use("Agg")
    plt = _need("matplotlib.pyplot", "the PNG chart")
    fig, ax = plt.subplots(figsize=(8, 3), dpi=110)
    series = doc["timeline"]
    xs = [i for i, v in enumerate(series) if v is not None]
    ax.plot(xs, [series[i] for i in xs], drawstyle="steps-post", color="#4c72b0")
    ax.set_ylim(0, 105)
    ax.set_ylabel("GPU utilization %")
    ax.set_xlabel("time (share of the job)" if series else "no timeline recorded")
    ax.set_title(
        f"job {doc['job_id']}: {counted(doc['gpus'], 'GPU')}, "
        + ("not measured" if doc["eta"] is None else f"{100 * doc['eta']:.0f}% used")
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _when(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
