"""`stune-fairshare report`: who holds GPUs without using them, per account and user.

Per association over the report window: jobs, GPU-hours held, GPU-hours used (held x measured utilization),
efficiency and idle GPU-hours (over the jobs that were measured), and the GPU-hours without a trustworthy
measurement. Next to them: Slurm's live FairShare (sshare), stune's reproduction of it (eta = 1) and stune's
factor, and the SiteFactor that follows. Then the top idle jobs, and jobs flagged for review: reported at
~100 % SM utilization but drawing near-idle power (a spin loop, a stuck kernel, or a faked load).

This module builds the Report (the numbers); report_render.py writes it out (table, CSV, JSON, PNG,
Prometheus).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .sitefactor import site_factor_target

BUSY_SHARE_FOR_FLAG = 0.5  # at least half the sampled time at ~100 % before a low power draw is suspicious


@dataclass
class AssocRow:
    level: str  # "account" or "user"
    account: str
    user: str
    jobs: int
    gpu_jobs: int
    held_gpu_h: float
    measured_gpu_h: float
    used_gpu_h: float
    idle_gpu_h: float
    unmeasured_gpu_h: float
    efficiency: float | None  # used / measured
    fairshare_sshare: float | None = None
    fairshare_slurm: float | None = None
    fairshare_stune: float | None = None
    site_factor: int | None = None


@dataclass
class JobRow:
    job_id: str
    account: str
    user: str
    partition: str
    state: str
    gpus: float
    held_gpu_h: float
    eta: float | None
    idle_gpu_h: float | None
    coverage: float
    source: str  # stune, slurm-gpuutil, none
    busy_share: float | None
    busy_w: float | None
    charged_x: float = 1.0  # Slurm's charge times this: 1 + alpha x idle share (1.0: not measured, or exempt)
    exempt: bool = False  # measured, but its alpha is 0 (accountant.alpha_by): idle time is not charged
    flag: str = ""


@dataclass
class Report:
    as_of: int
    window_start: int | None
    algorithm: str
    weight_fairshare: int
    alpha: float = 1.0  # the idle penalty (accountant.alpha): idle GPU time is charged x(1 + alpha)
    accounts: list = field(default_factory=list)
    users: list = field(default_factory=list)
    top_idle: list = field(default_factory=list)
    flagged: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    # rows the accountant could not trust: damaged or out-of-range summaries (charged as Slurm charges,
    # eta = 1), rows skipped (unreadable Start/End, cut lines) and duplicate runs dropped from a dump
    data_quality: dict = field(default_factory=dict)
    # jobs in the window by what bound them ("partition/bound" -> jobs), from their records' `bound=` token
    bounds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


SOURCES = {0: "none", 1: "stune", 2: "slurm-gpuutil"}


def bound_counts(table, rows) -> dict[str, int]:
    """Jobs among `rows` by the verdict their record was stored with (usage/whyslow.py's `bound=`):
    {"partition/bound": jobs}."""
    from ..usage.whyslow import BOUND_KEY

    key = f" {BOUND_KEY}="
    counts: dict[str, int] = {}
    for i in np.flatnonzero(rows):
        text = table.admin_comment[i]
        at = text.find(key)
        if at < 0:
            continue
        bound = text[at + len(key) :].split(" ", 1)[0]
        if bound.isalpha() and len(bound) <= 16:
            name = f"{table.partition[i]}/{bound}"
            counts[name] = counts.get(name, 0) + 1
    return counts


def build(result, config, since: int | None) -> Report:
    """Aggregate an accountant RunResult into a Report over rows that ran since `since`."""
    table, ch = result.table, result.charges
    rep = config.report
    ran = table.ran
    if since is not None:
        ran &= (table.end < 0) | (table.end >= since)
    held_h = np.where(ran, ch.held_gpu_s / 3600.0, 0.0)
    measured = ran & ch.trusted & (table.gpus > 0)
    used_h = np.where(measured, held_h * ch.eta, 0.0)
    measured_h = np.where(measured, held_h, 0.0)
    unmeasured_h = np.where(ran & ~measured, held_h, 0.0)
    gpu_job = ran & (table.gpus > 0)
    k = len(table.assoc_keys)

    def sums(values):
        return np.bincount(table.assoc, weights=values, minlength=k) if table.n else np.zeros(k)

    per = {
        name: sums(v)
        for name, v in (
            ("jobs", ran.astype(float)),
            ("gpu_jobs", gpu_job.astype(float)),
            ("held", held_h),
            ("measured", measured_h),
            ("used", used_h),
            ("unmeasured", unmeasured_h),
        )
    }
    sshare = {(r.account, r.user): r.fairshare for r in (result.sshare or []) if r.user}
    weight = result.settings.weight_fairshare

    def row(level, account, user, idx):
        jobs, gjobs, held, meas, used, unmeas = (
            float(per[n][idx].sum()) for n in ("jobs", "gpu_jobs", "held", "measured", "used", "unmeasured")
        )
        out = AssocRow(
            level,
            account,
            user,
            int(jobs),
            int(gjobs),
            held,
            meas,
            used,
            max(meas - used, 0.0),
            unmeas,
            used / meas if meas > 0 else None,
        )
        if level == "user":
            out.fairshare_sshare = sshare.get((account, user))
            out.fairshare_slurm = result.shares_slurm.factor(account, user)
            out.fairshare_stune = result.shares_stune.factor(account, user)
            if out.fairshare_slurm is not None and out.fairshare_stune is not None:
                out.site_factor = site_factor_target(
                    config, weight, out.fairshare_slurm, out.fairshare_stune, result.site_line
                )
        return out

    report = Report(
        result.as_of,
        since,
        result.settings.algorithm,
        weight,
        alpha=float(config.accountant.alpha),
        warnings=list(result.warnings),
    )
    bad = table.bad_summary if table.bad_summary is not None else np.zeros(table.n, dtype=bool)
    report.data_quality = {
        "bad_summaries": int((bad & ran).sum()),
        "skipped_rows": int(table.skipped),
        "duplicate_rows": int(table.duplicates),
    }
    report.bounds = bound_counts(table, ran)
    users = sorted(set(table.assoc_keys) | set(result.shares_slurm.factors))
    index = {key: i for i, key in enumerate(table.assoc_keys)}
    for account, user in users:
        i = index.get((account, user))
        report.users.append(row("user", account, user, np.array([i] if i is not None else [], dtype=int)))
    for account in sorted({a for a, _ in users}):
        idx = np.array([index[key] for key in index if key[0] == account], dtype=int)
        report.accounts.append(row("account", account, "", idx))

    jobs = np.flatnonzero(gpu_job)
    idle = np.where(measured, held_h * (1.0 - ch.eta), -1.0)
    order = jobs[np.argsort(-idle[jobs], kind="stable")]
    with np.errstate(divide="ignore", invalid="ignore"):
        busy_share = np.where(table.covered_s > 0, table.busy_s / table.covered_s, np.nan)

    def job_row(i) -> JobRow:
        account, user = table.assoc_keys[table.assoc[i]]
        eta = float(ch.eta_measured[i]) if not np.isnan(ch.eta_measured[i]) else None
        share = float(busy_share[i]) if not np.isnan(busy_share[i]) else None
        watts = float(table.busy_w[i]) if not np.isnan(table.busy_w[i]) else None
        alpha = float(ch.alpha[i]) if isinstance(ch.alpha, np.ndarray) else float(ch.alpha)
        return JobRow(
            table.job_id[i],
            account,
            user,
            table.partition[i],
            table.state_of(i),
            float(table.gpus[i]),
            float(held_h[i]),
            eta,
            float(held_h[i] * (1 - ch.eta[i])) if measured[i] else None,
            float(ch.coverage[i]),
            SOURCES[int(ch.source[i])],
            share,
            watts,
            charged_x=1.0 + alpha * (1.0 - float(ch.eta[i])) if measured[i] else 1.0,
            exempt=bool(measured[i]) and alpha == 0,
        )

    report.top_idle = [job_row(i) for i in order[: rep.top_jobs].tolist() if idle[i] > 0]
    suspicious = jobs[(busy_share[jobs] >= BUSY_SHARE_FOR_FLAG) & (table.busy_w[jobs] < rep.idle_power_w)]
    for i in suspicious.tolist():
        r = job_row(i)
        r.flag = (
            f"{100 * float(busy_share[i]):.0f}% of sampled time at >= {rep.busy_util:g}% SM utilization, "
            f"but {r.busy_w:.0f} W mean power (< {rep.idle_power_w:g} W): review"
        )
        report.flagged.append(r)
    return report
