"""`stune-fairshare report`'s outputs: a Report (report.py) as a terminal table (rich), CSV, JSON, a PNG
chart (matplotlib, Agg) of held vs used GPU-hours per account, and a Prometheus textfile (prometheus_client).
Also the GPU-time units and amounts that `explain` and `job` print the same way.

rich, matplotlib and prometheus_client come with the `reports` extra; without it the table, PNG and metrics
say so in one line, and CSV/JSON still work.
"""

from __future__ import annotations

import csv
import importlib
import io
import os
import time
from dataclasses import asdict

import numpy as np

from ..errors import StuneError
from ..output import json_text
from .report import Report

EXTRA_HINT = "pip install 'slurm-tune[reports]'"


class ReportsUnavailable(StuneError):
    """An output needs a package of the `reports` extra that is not installed."""


def _need(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ReportsUnavailable(
            f"{what} needs the `reports` extra ({module} is not installed): {EXTRA_HINT}"
        ) from None


def _fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value):
    return "-" if value is None else f"{100 * value:.0f}%"


def time_unit(values) -> tuple[str, float]:
    """The unit a table of GPU time shows, and its factor from GPU-hours: GPU-hours, or, where every value is
    below one GPU-hour (a short window, a test cluster), GPU-minutes (from half a GPU-minute) or GPU-seconds,
    so that no cell of real use reads 0.0."""
    top = max((v for v in values if v), default=0.0)
    if top == 0 or top >= 1:
        return "GPU-hours", 1.0
    if top * 60 >= 0.5:
        return "GPU-minutes", 60.0
    return "GPU-seconds", 3600.0


def amount(value, scale: float = 1.0) -> str:
    """A quantity with three significant digits at most: 1,234 / 12.3 / 1.23 / 0.05; `<0.01` for a value that
    is not zero but would round to it; `-` for none."""
    if value is None:
        return "-"
    v = value * scale
    if v == 0:
        return "0"
    if abs(v) < 0.005:
        return "<0.01"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def legend(report: Report, unit: str, wide: bool) -> list[str]:
    """What the table's columns mean, in words: printed under it."""
    lines = [
        f"held: {unit} the jobs held (GPUs x run time); used: held x measured GPU utilization (the share in "
        "brackets); idle: held minus used, over the measured jobs; not measured: held with no trustworthy "
        "usage record (charged as Slurm charges).",
        "fair share, 0 to 1 (higher runs sooner): Slurm's own factor (Slurm FS), computed as Slurm does "
        "from the GPU time held, every GPU counted as used; then stune's (stune FS), the same with idle GPU "
        f"time charged x(1 + {report.alpha:g} x idle share). SiteFactor: the priority points stune gives the "
        "user's pending jobs (0 or below) so that they sort by stune FS.",
    ]
    if wide:
        lines.append(
            "sshare FS: the FairShare Slurm shows now (`sshare`), which lags by up to PriorityCalcPeriod; "
            "it should match Slurm FS."
        )
    else:
        lines.append(
            "--wide adds sshare's live value and each user's job counts; --json and --format csv have "
            "every number."
        )
    return lines


def to_table(report: Report, console=None, wide: bool = False) -> None:
    """The terminal table: compact (about 80 columns) unless `wide`, with a legend under it."""
    rich_console = _need("rich.console", "the terminal table")
    rich_table = _need("rich.table", "the terminal table")
    box = _need("rich.box", "the terminal table")

    def table(title: str):  # the one look of the report's tables
        return rich_table.Table(
            title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
        )

    if console is None:
        console = rich_console.Console()
        if (
            wide and not console.is_terminal and "COLUMNS" not in os.environ
        ):  # a pipe: do not squeeze it to 80
            console = rich_console.Console(width=160)
    rows = report.accounts + report.users + report.top_idle
    unit, scale = time_unit([r.held_gpu_h for r in rows])
    window = (
        "all history in the dump" if report.window_start is None else f"since {_when(report.window_start)}"
    )
    t = table(f"GPU usage by account and user, in {unit} ({window}; as of {_when(report.as_of)})")
    columns = [
        ("account / user", "left"),
        ("GPU\njobs", "right"),
        ("held", "right"),
        ("used", "right"),
        ("idle", "right"),
        ("not\nmeasured", "right"),
    ]
    if wide:
        columns[1:1] = [("jobs", "right")]
        columns += [("sshare\nFS", "right"), ("Slurm\nFS", "right"), ("stune\nFS", "right")]
    else:
        columns += [("fair share\nSlurm->stune", "right")]
    columns += [("Site\nFactor", "right")]
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=True)

    def cells(r) -> list[str]:
        used = amount(r.used_gpu_h, scale) + ("" if r.efficiency is None else f" ({_pct(r.efficiency)})")
        out = [
            str(r.gpu_jobs),
            amount(r.held_gpu_h, scale),
            used,
            amount(r.idle_gpu_h, scale),
            amount(r.unmeasured_gpu_h, scale),
        ]
        if wide:
            out.insert(0, str(r.jobs))
        if r.level == "account":
            return out + [""] * (4 if wide else 2)
        if wide:
            out += [_fmt(r.fairshare_sshare, 3), _fmt(r.fairshare_slurm, 3), _fmt(r.fairshare_stune, 3)]
        else:
            out.append(
                "-"
                if r.fairshare_slurm is None or r.fairshare_stune is None
                else f"{r.fairshare_slurm:.3f}->{r.fairshare_stune:.3f}"
            )
        return [*out, "-" if r.site_factor is None else str(r.site_factor)]

    by_account: dict = {}
    for u in report.users:
        by_account.setdefault(u.account, []).append(u)
    for a in report.accounts:
        t.add_row(f"[bold]{a.account}[/bold]", *cells(a))
        for u in by_account.get(a.account, []):
            t.add_row(f"  {u.user}", *cells(u))
    console.print(t)
    for line in legend(report, unit, wide):
        console.print(line, highlight=False)
    if report.top_idle:
        j = table(f"Jobs with the most idle GPU time, in {unit}")
        for name in ("job", "user", "GPUs", "held", "used", "idle", "charged"):
            j.add_column(name, justify="left" if name in ("job", "user") else "right")
        for r in report.top_idle:
            j.add_row(
                r.job_id,
                f"{r.user} ({r.account})",
                f"{r.gpus:g}",
                amount(r.held_gpu_h, scale),
                _pct(r.eta),
                amount(r.idle_gpu_h, scale),
                "exempt" if r.exempt else f"x{r.charged_x:.2f}",
            )
        console.print(j)
        console.print(
            "charged: Slurm's charge for the job is multiplied by this; exempt: its QOS, partition or "
            "account is not charged for idle GPUs (accountant.alpha_by).",
            highlight=False,
        )
    if report.flagged:
        f = table("Flagged for review: ~100% utilization at near-idle power")
        for name in ("job", "account", "user", "why"):
            f.add_column(name)
        for r in report.flagged:
            f.add_row(r.job_id, r.account, r.user, r.flag)
        console.print(f)
    quality = report.data_quality
    if any(quality.values()):
        console.print(
            f"Not trusted: {quality.get('bad_summaries', 0)} damaged or out-of-range usage "
            f"summaries (charged as Slurm charges, eta = 1); {quality.get('skipped_rows', 0)} "
            f"unreadable sacct rows skipped; {quality.get('duplicate_rows', 0)} duplicate rows dropped"
        )
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


CSV_COLUMNS = (
    "level",
    "account",
    "user",
    "jobs",
    "gpu_jobs",
    "held_gpu_h",
    "used_gpu_h",
    "efficiency",
    "idle_gpu_h",
    "measured_gpu_h",
    "unmeasured_gpu_h",
    "fairshare_sshare",
    "fairshare_slurm",
    "fairshare_stune",
    "site_factor",
)


def to_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.accounts + report.users:
        d = asdict(r)
        writer.writerow(
            [
                "" if d[c] is None else (f"{d[c]:.6g}" if isinstance(d[c], float) else d[c])
                for c in CSV_COLUMNS
            ]
        )
    return out.getvalue()


def to_json(report: Report) -> str:
    return json_text(report.to_dict())


def to_png(report: Report, path: str) -> None:
    """Grouped bars per account: GPU-hours held, used, and held without a measurement."""
    matplotlib = _need("matplotlib", "the PNG chart")
    matplotlib.use("Agg")
    plt = _need("matplotlib.pyplot", "the PNG chart")
    accounts = [a for a in report.accounts if a.held_gpu_h > 0] or report.accounts
    names = [a.account for a in accounts]
    x = np.arange(len(names))
    width = 0.27
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names) + 2), 5.0), dpi=110)
    held = [a.held_gpu_h for a in accounts]
    used = [a.used_gpu_h for a in accounts]
    unmeasured = [a.unmeasured_gpu_h for a in accounts]
    b1 = ax.bar(x - width, held, width, label="held", color="#4c72b0")
    b2 = ax.bar(x, used, width, label="used (held x utilization)", color="#55a868")
    ax.bar(x + width, unmeasured, width, label="held, not measured", color="#c7c7c7")
    for bars in (b1, b2):
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=2)  # GPU-hours
    for i, a in enumerate(accounts):
        if a.efficiency is not None:
            ax.annotate(
                f"{100 * a.efficiency:.0f}% used",
                (x[i], max(held[i], used[i], unmeasured[i])),
                ha="center",
                xytext=(0, 14),
                textcoords="offset points",
                fontsize=8,
                color="#333333",
            )
    ax.set_xticks(x, names)
    ax.set_ylabel("GPU-hours")
    ax.set_ylim(0, max(held + used + unmeasured + [1e-6]) * 1.3)
    window = "" if report.window_start is None else f" since {_when(report.window_start)}"
    ax.set_title(f"GPU-hours held vs used per account{window}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def to_prometheus(report: Report, path: str) -> None:
    """node_exporter textfile: per-user gauges plus the run time (written atomically by prometheus_client)."""
    prom = _need("prometheus_client", "the Prometheus textfile")
    registry = prom.CollectorRegistry()
    labels = ["account", "user"]
    gauges = {
        "held": prom.Gauge(
            "stune_gpu_hours_held", "GPU-hours held in the report window", labels, registry=registry
        ),
        "used": prom.Gauge(
            "stune_gpu_hours_used", "GPU-hours used (held x utilization)", labels, registry=registry
        ),
        "idle": prom.Gauge(
            "stune_gpu_hours_idle", "GPU-hours held but idle (measured jobs)", labels, registry=registry
        ),
        "unmeasured": prom.Gauge(
            "stune_gpu_hours_unmeasured", "GPU-hours without a trusted measurement", labels, registry=registry
        ),
        "eff": prom.Gauge("stune_gpu_efficiency", "used / measured GPU-hours", labels, registry=registry),
        "fs": prom.Gauge("stune_fairshare_factor", "fair-share factor", [*labels, "kind"], registry=registry),
        "site": prom.Gauge(
            "stune_site_factor", "SiteFactor stune sets on pending jobs", labels, registry=registry
        ),
    }
    for u in report.users:
        gauges["held"].labels(u.account, u.user).set(u.held_gpu_h)
        gauges["used"].labels(u.account, u.user).set(u.used_gpu_h)
        gauges["idle"].labels(u.account, u.user).set(u.idle_gpu_h)
        gauges["unmeasured"].labels(u.account, u.user).set(u.unmeasured_gpu_h)
        if u.efficiency is not None:
            gauges["eff"].labels(u.account, u.user).set(u.efficiency)
        for kind, value in (
            ("sshare", u.fairshare_sshare),
            ("slurm", u.fairshare_slurm),
            ("stune", u.fairshare_stune),
        ):
            if value is not None:
                gauges["fs"].labels(u.account, u.user, kind).set(value)
        if u.site_factor is not None:
            gauges["site"].labels(u.account, u.user).set(u.site_factor)
    by_bound = prom.Gauge(
        "stune_jobs_by_bound",
        "jobs in the report window by what bound them (compute, storage, communication, host, unclear, "
        "unmeasured: stune-job's verdict when the record was stored)",
        ["partition", "bound"],
        registry=registry,
    )
    for name, jobs in sorted(report.bounds.items()):
        partition, _, bound = name.rpartition("/")
        by_bound.labels(partition, bound).set(jobs)
    quality = prom.Gauge(
        "stune_fairshare_rows_untrusted",
        "sacct rows the accountant could not trust, by kind",
        ["kind"],
        registry=registry,
    )
    for kind, count in report.data_quality.items():
        quality.labels(kind).set(count)
    flagged = prom.Gauge(
        "stune_jobs_flagged", "jobs at ~100% utilization with near-idle power", registry=registry
    )
    flagged.set(len(report.flagged))
    stalled = prom.Gauge(
        "stune_job_stalled",
        "1: this job ran at ~100% utilization with near-idle power (a hung collective or a spin loop)",
        ["job_id", "account", "user"],
        registry=registry,
    )
    for r in report.flagged:
        stalled.labels(r.job_id, r.account, r.user).set(1)
    stamp = prom.Gauge(
        "stune_fairshare_report_timestamp_seconds", "when the report was computed", registry=registry
    )
    stamp.set(report.as_of)
    prom.write_to_textfile(path, registry)


def _when(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
