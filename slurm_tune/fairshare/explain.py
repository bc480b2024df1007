"""What a user reads: `stune-fairshare explain [USER]` ("why is my priority low?"), built as a plain dict (the
--json output) from an accountant run (the same numbers `apply` uses) and rendered as a few lines of text.
Also who may see what (users see only their own jobs and associations; root sees all) and which
accountant.alpha_by entry sets a job's idle penalty, which `stune-fairshare job JOBID` (jobview.py,
jobdoc.py) uses too.
"""

from __future__ import annotations

import os
import pwd
import time

import numpy as np

from ..durations import compact
from ..errors import StuneError
from ..text import counted
from .report_render import amount, time_unit
from .sitefactor import site_factor_target


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
    all_users = list(result.shares_stune.factors)
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
    lines.extend(
        f"  pending job {p['job_id']} ({p['partition']}): priority {p['priority']} = fair share "
        f"{p['fairshare']} + age {p['age']} + SiteFactor {p['site_factor']} (+ other factors)"
        for p in doc["pending"]
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
    lines.extend(f"  warning: {w}" for w in doc["warnings"])
    return "\n".join(lines) + "\n"


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _when(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
