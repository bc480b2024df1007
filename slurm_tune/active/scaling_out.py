"""The scaling curves for people: a table (the knee marked), the JSON document, and a PNG (bus bandwidth and
efficiency against n, the knee marked), as active/report.py draws the sweep's report."""

from __future__ import annotations

from ..hostlist import compress_hostlist
from ..output import json_text, table

COLUMNS = ("curve", "n", "nodes", "busbw GB/s", "efficiency", "status", "", "detail")
SCOPE_WORDS = {"node": "devices", "nodes": "nodes"}


def _mark(curve: dict, p: dict) -> str:
    knee = curve.get("knee")
    if knee and knee["n"] == p["n"]:
        return "<- knee"
    if p.get("metric") == "algbw":
        return "(algbw: reference only)"
    if curve.get("baseline") is not None and p["efficiency"] == 1.0:
        return "(reference)"
    return ""


def text(curves: list[dict]) -> str:
    """One table of both curves' points, then each curve's verdict (and, at a knee, who joined)."""
    rows = [
        (
            SCOPE_WORDS[c["scope"]],
            p["n"],
            compress_hostlist(p["nodes"]),
            "-" if p["value"] is None else f"{p['value']:.2f}",
            "-" if p["efficiency"] is None else f"{p['efficiency']:.0%}",
            p["status"],
            _mark(c, p),
            p["detail"][:60],
        )
        for c in curves
        for p in c["points"]
    ]
    out = table(rows, COLUMNS) if rows else ""
    for c in curves:
        out += f"{'single-node' if c['scope'] == 'node' else 'multi-node'} curve: {c['verdict']}: {c['detail']}\n"
        knee = c.get("knee")
        if knee and c["scope"] == "nodes":
            why = (
                knee["why"][len(c["detail"]) :].lstrip("; ")
                if knee["why"].startswith(c["detail"])
                else knee["why"]
            )
            out += f"  at the knee: {why}\n"
    return out


def json_doc(partition: str, sweep: str, curves: list[dict]) -> str:
    return json_text({"partition": partition, "sweep": sweep, "curves": curves})


def png(path: str, partition: str, curves: list[dict]) -> None:
    """Per curve: busbw against n (left axis) and efficiency (right axis), the knee marked."""
    import matplotlib  # optional: the reports extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [c for c in curves if c["points"]]
    if not drawn:
        raise ValueError("no measured points to plot")
    fig, axes = plt.subplots(1, len(drawn), figsize=(6 * len(drawn), 4), squeeze=False)
    for ax, c in zip(axes[0], drawn):
        pts = [p for p in c["points"] if p["value"] is not None and p.get("metric") != "algbw"]
        ax.plot([p["n"] for p in pts], [p["value"] for p in pts], "o-", color="tab:blue", label="busbw")
        ax.set_ylim(bottom=0)  # a 3% drop must not look like a collapse
        ax.set_xlabel(SCOPE_WORDS[c["scope"]])
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_xticks([p["n"] for p in c["points"]])
        eff = ax.twinx()
        judged = [p for p in c["points"] if p["efficiency"] is not None]
        eff.plot(
            [p["n"] for p in judged],
            [p["efficiency"] for p in judged],
            "s--",
            color="tab:green",
            label="efficiency",
        )
        eff.set_ylabel("efficiency")
        eff.set_ylim(0, max([1.1, *(p["efficiency"] * 1.1 for p in judged)]))
        knee = c.get("knee")
        if knee:
            ax.axvline(knee["n"], color="tab:red", linestyle=":", label=f"knee ({knee['efficiency']:.0%})")
        ax.set_title(
            f"{partition}: {c['check']} {'in one node' if c['scope'] == 'node' else 'across nodes'}: {c['verdict']}"
        )
        handles = ax.get_legend_handles_labels()[0] + eff.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
