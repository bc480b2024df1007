"""How the lemon and reliability reports are shown: plain aligned tables (output.table, stune's one look of a
text table), CSV (the csv module), JSON (output.json_text) and a PNG (matplotlib through the fair-share
report's `reports`-extra check, report_render._need). Quantities are written as the fair-share report writes
them (report_render.amount: three significant digits at most).
"""

from __future__ import annotations

import csv
import io
import time

from ..durations import compact
from ..fairshare.report_render import _need, amount
from ..output import json_text, table
from .causes import CAUSES
from .lemons import LemonReport, NodeScore
from .report import ReliabilityReport

PNG_PARTITIONS = 6  # panels: the partitions with the most node-days; the rest are said in the title


def _day(epoch: int) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(epoch))


def span(seconds: int) -> str:
    """A window's length: `30 d` from a day on (`1.5 d`), `1h30m` below (durations.compact)."""
    return f"{seconds / 86400:.3g} d" if seconds >= 86400 else compact(seconds)


def _p(value: float) -> str:
    return f"{value:.1e}" if value < 0.001 else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


# ---- lemons --------------------------------------------------------------------------------------------------
def lemons_text(reports: list[LemonReport]) -> str:
    out = []
    for r in reports:
        out.append(
            f"partition {r.partition}: {r.runs} multi-node runs, {amount(r.node_hours)} node-hours "
            f"({_day(r.since)} .. {_day(r.until)}, {span(r.until - r.since)}); {r.failures} infrastructure failures "
            f"({r.localized} naming their node); {r.nodes} nodes tested"
        )
        p = r.policy
        out.append(
            f"test: one-sided Poisson per node, H0 hazard ratio <= {p.margin:g}; Holm step-down at "
            f"family-wise alpha {p.alpha:g}; at least {p.min_failures} failures"
            + ("" if r.with_events else "; no node events read (failures laid on all their nodes)")
        )
        if r.unusable:
            out.append(f"{r.unusable} run(s) left out: NodeList does not name NNodes nodes")
        rows = [_lemon_row(s) for s in r.lemons + r.closest]
        if rows:
            out.append(
                table(
                    rows,
                    (
                        "LEMON",
                        "NODE",
                        "FAILED",
                        "SHARE",
                        "RATIO",
                        "RATIO>=",
                        "P",
                        "LEVEL",
                        "NODE-H",
                        "NAMED",
                        "CAUGHT",
                        "CAUSES",
                        "LAST JOBS",
                    ),
                ).rstrip("\n")
            )
        out.append(
            "no lemon" if not r.lemons else f"{len(r.lemons)} lemon(s): {', '.join(s.node for s in r.lemons)}"
        )
        out.append("")
    out.append(
        "FAILED: failed multi-node runs laid on the node; SHARE: what its node-hours would give it; RATIO: how "
        "many times its peers' rate explains FAILED, RATIO>= its lower confidence bound; P: the chance of "
        "FAILED if the ratio were the margin, LEVEL: what Holm holds P to; NAMED: failures whose evidence named "
        "the node; CAUGHT: those a health check also saw."
    )
    return "\n".join(out) + "\n"


def _lemon_row(s: NodeScore) -> tuple:
    causes = ", ".join(f"{c} {n}" for c, n in sorted(s.causes.items(), key=lambda x: -x[1]))
    return (
        "yes" if s.lemon else "",
        s.node,
        s.failures,
        f"{s.expected:.1f}",
        "-" if s.ratio is None else f"{s.ratio:.1f}",
        f"{s.ratio_low:.2f}",
        _p(s.p_value),
        _p(s.threshold),
        amount(s.node_hours),
        s.localized,
        s.caught,
        causes or "-",
        ",".join(s.jobs[-3:]) or "-",
    )


def lemons_json(reports: list[LemonReport]) -> str:
    return json_text({"partitions": [r.to_dict() for r in reports]})


# ---- the reliability report ------------------------------------------------------------------------------------
def _causes_present(report: ReliabilityReport) -> list[str]:
    seen = {c for row in report.rows for c in row.by_cause}
    return [c for c in CAUSES if c in seen]


def reliability_text(report: ReliabilityReport) -> str:
    r = report
    head = (
        f"Reliability {_day(r.since)} .. {_day(r.until)} (partitions {', '.join(r.partitions) or '-'}): "
        f"{amount(r.node_days)} node-days, {r.runs} runs; {r.interruptions} interruptions ({r.unexpected} "
        f"unexpected, {r.planned} planned), {amount(r.per_1000_node_days)} per 1,000 node-days; hours run "
        f"per unexpected interruption {amount(r.mttf_unexpected_h)}, per infrastructure failure (MTTF) "
        f"{amount(r.mttf_h)}; ETTR {_pct(r.ettr)}"
    )
    out = [head, "", "Interruptions by cause"]
    out.append(
        table(
            [
                (c.category, c.cause, c.code or "-", c.count, _pct(c.share), amount(c.per_1000_node_days))
                for c in r.causes
            ],
            ("CATEGORY", "CAUSE", "CODE", "COUNT", "SHARE", "PER 1,000 NODE-DAYS"),
        ).rstrip("\n")
    )
    present = _causes_present(r)
    out += ["", "Per partition and month: interruptions per 1,000 node-days, by cause"]
    out.append(
        table(
            [
                (
                    m.partition,
                    m.month,
                    amount(m.node_days),
                    m.interruptions,
                    amount(m.per_1000_node_days),
                    *(amount(_per(m.by_cause.get(c, 0), m.node_days)) for c in present),
                    _pct(m.ettr),
                )
                for m in r.rows
            ],
            (
                "PARTITION",
                "MONTH",
                "NODE-DAYS",
                "INTERRUPTIONS",
                "ALL",
                *(c.upper() for c in present),
                "ETTR",
            ),
        ).rstrip("\n")
    )
    out += ["", "By job size (nodes): MTTF from infrastructure failures (hardware, nccl, node_failure)"]
    out.append(
        table(
            [
                (
                    s.size,
                    s.runs,
                    amount(s.hours),
                    amount(s.node_days),
                    "-" if s.gpus_median is None else f"{s.gpus_median:g}",
                    s.failures,
                    amount(s.mttf_h),
                    amount(s.projected_mttf_h),
                    _pct(s.ettr),
                )
                for s in r.sizes
            ],
            ("NODES", "RUNS", "HOURS", "NODE-DAYS", "GPUS", "FAILURES", "MTTF-H", "PROJECTED-H", "ETTR"),
        ).rstrip("\n")
    )
    out += ["", *r.notes, *(f"warning: {w}" for w in r.warnings)]
    return "\n".join(out) + "\n"


def _per(count: int, node_days: float) -> float | None:
    return None if node_days <= 0 else 1000.0 * count / node_days


TABLES = ("months", "sizes", "causes")


def reliability_csv(report: ReliabilityReport, which: str = "months") -> str:
    """One of the report's tables as CSV, every number unrounded (`months`: per partition and month, each
    cause's count and rate; `sizes`; `causes`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    fields: tuple[str, ...]
    if which == "sizes":
        fields = (
            "size",
            "runs",
            "hours",
            "node_days",
            "gpus_median",
            "failures",
            "mttf_h",
            "projected_mttf_h",
        )
        writer.writerow((*fields, "ettr"))
        for s in report.sizes:
            writer.writerow([_cell(getattr(s, f)) for f in (*fields, "ettr")])
    elif which == "causes":
        fields = ("category", "cause", "code", "count", "share", "per_1000_node_days")
        writer.writerow(fields)
        for c in report.causes:
            writer.writerow([_cell(getattr(c, f)) for f in fields])
    else:
        writer.writerow(
            (
                "partition",
                "month",
                "node_days",
                "runs",
                "interruptions",
                "unexpected",
                "per_1000_node_days",
                "ettr",
                *(f"{c}_count" for c in CAUSES),
                *(f"{c}_per_1000_node_days" for c in CAUSES),
            )
        )
        for m in report.rows:
            writer.writerow(
                [
                    _cell(v)
                    for v in (
                        m.partition,
                        m.month,
                        m.node_days,
                        m.runs,
                        m.interruptions,
                        m.unexpected,
                        m.per_1000_node_days,
                        m.ettr,
                        *(m.by_cause.get(c, 0) for c in CAUSES),
                        *(_per(m.by_cause.get(c, 0), m.node_days) for c in CAUSES),
                    )
                ]
            )
    return buf.getvalue()


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def reliability_json(report: ReliabilityReport) -> str:
    return json_text(report.to_dict())


def reliability_png(report: ReliabilityReport, path: str) -> None:
    """Per partition (the largest PNG_PARTITIONS), interruptions per 1,000 node-days by month, stacked by
    cause; beside them, MTTF by job size, measured and projected."""
    matplotlib = _need("matplotlib", "the PNG chart")
    matplotlib.use("Agg")
    plt = _need("matplotlib.pyplot", "the PNG chart")
    sizes = {p: sum(m.node_days for m in report.rows if m.partition == p) for p in report.partitions}
    shown = sorted(sizes, key=lambda p: -sizes[p])[:PNG_PARTITIONS]
    present = _causes_present(report) or ["user"]
    colors = dict(zip(CAUSES, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(1, len(shown) + 1, figsize=(4.2 * (len(shown) + 1), 4.4), dpi=110, squeeze=False)
    for ax, p in zip(axes[0], shown):
        rows = [m for m in report.rows if m.partition == p]
        months = [m.month for m in rows]
        bottom = [0.0] * len(rows)
        for c in present:
            values = [_per(m.by_cause.get(c, 0), m.node_days) or 0.0 for m in rows]
            ax.bar(months, values, bottom=bottom, label=c, color=colors[c])
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(f"{p}: interruptions per 1,000 node-days", fontsize=9)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4)
    ax = axes[0][-1]
    measured = [(s.size, s.mttf_h) for s in report.sizes if s.mttf_h]
    projected = [(s.size, s.projected_mttf_h) for s in report.sizes if s.projected_mttf_h]
    if projected:
        ax.plot(
            [s for s, _ in projected], [v for _, v in projected], "--", color="#999999", label="projected"
        )
    if measured:
        ax.plot([s for s, _ in measured], [v for _, v in measured], "o-", color="#4c72b0", label="measured")
    ax.set_yscale("log")
    ax.set_xlabel("nodes per run", fontsize=8)
    ax.set_ylabel("MTTF (hours)", fontsize=8)
    ax.set_title("MTTF by job size (infrastructure failures)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    more = len(report.partitions) - len(shown)
    title = f"Reliability {_day(report.since)} .. {_day(report.until)}"
    fig.suptitle(title + (f" ({more} smaller partitions not drawn)" if more > 0 else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
