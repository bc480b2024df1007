"""Reports over the stored results: per node (or pair) against the partition baseline for its fingerprint, and
"since the version changed": the same subjects before and after a driver/CUDA/NCCL/firmware/kernel change.
As a table, CSV, JSON, Prometheus text, or a PNG (matplotlib)."""

from __future__ import annotations

import csv
import io

from ..output import table as text_table
from . import judge
from .checks import CATALOGUE, configured, skipped, tool_path
from .store import FINGERPRINT_KEYS, fingerprint_key, vendor_of

COLUMNS = (
    "check",
    "subject",
    "status",
    "value",
    "unit",
    "baseline",
    "ratio",
    "threshold",
    "floor",
    "slow",
    "runs",
    "fingerprint",
    "reason",
)


def rows(results, settings: judge.Settings) -> list[dict]:
    _bases, verdicts = judge.judge(results, settings)
    units = {}
    for r in results:
        if r.get("unit"):
            units[r["check"]] = r["unit"]
    out = []
    for v in verdicts:
        base = v.baseline
        out.append(
            {
                "check": v.check,
                "subject": v.subject,
                "status": v.status,
                "value": _round(v.value),
                "unit": units.get(v.check, ""),
                "baseline": _round(base.median) if base else None,
                "ratio": round(v.value / base.median, 3)
                if base and v.value is not None and base.median
                else None,
                "threshold": _round(base.threshold) if base and base.threshold is not None else None,
                "floor": settings.floors.get(v.check),
                "slow": v.slow,
                "runs": v.runs,
                "fingerprint": fingerprint_key(v.fingerprint),
                "reason": v.reason,
            }
        )
    # what was never measured: the tool is missing, or every run was unreadable
    judged = {(v.check, v.subject) for v in verdicts}
    latest = {}
    for r in results:
        if (r["check"], r["subject"]) not in judged:
            latest[(r["check"], r["subject"])] = r
    for (check, subject), r in sorted(latest.items()):
        out.append(
            {
                "check": check,
                "subject": subject,
                "status": r["status"],
                "value": None,
                "unit": units.get(check, ""),
                "baseline": None,
                "ratio": None,
                "threshold": None,
                "floor": settings.floors.get(check),
                "slow": 0,
                "runs": 0,
                "fingerprint": fingerprint_key(r.get("fingerprint") or {}),
                "reason": r.get("detail", "")[:200],
            }
        )
    return out


def _round(x):
    return None if x is None else round(x, 4)


def drift(results) -> list[dict]:
    """For each check and subject measured under more than one fingerprint: the median of the last results
    under the previous fingerprint and under the current one, and what changed."""
    seq: dict = {}
    for r in results:
        if r.get("status") != "ok" or r.get("value") is None:
            continue
        seq.setdefault((r["check"], r["subject"]), []).append(r)
    out = []
    for (check, subject), rs in sorted(seq.items()):
        cur_key = fingerprint_key(rs[-1]["fingerprint"])
        cur = [r["value"] for r in rs if fingerprint_key(r["fingerprint"]) == cur_key]
        older = [r for r in rs if fingerprint_key(r["fingerprint"]) != cur_key]
        if not older:
            continue
        prev_fp = older[-1]["fingerprint"]
        prev_key = fingerprint_key(prev_fp)
        prev = [r["value"] for r in older if fingerprint_key(r["fingerprint"]) == prev_key]
        now_fp = rs[-1]["fingerprint"]
        changed = ", ".join(
            f"{k} {_part(prev_fp, k) or '?'} -> {_part(now_fp, k) or '?'}"
            for k in FINGERPRINT_KEYS
            if _part(prev_fp, k) != _part(now_fp, k)
        )
        before, after = judge.median(prev), judge.median(cur)
        out.append(
            {
                "check": check,
                "subject": subject,
                "changed": changed,
                "before": round(before, 4),
                "after": round(after, 4),
                "change": round(after / before - 1, 4) if before else None,
                "runs_before": len(prev),
                "runs_after": len(cur),
            }
        )
    return out


def _part(fp: dict, key: str) -> str:
    """A fingerprint's part, the vendor read as store.vendor_of does (none: nvidia)."""
    return vendor_of(fp) if key == "vendor" else str(fp.get(key) or "")


def table(data: list[dict], columns) -> str:
    return text_table(([d.get(c) for c in columns] for d in data), [c.upper() for c in columns])


def to_csv(data: list[dict], columns) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for d in data:
        w.writerow(d)
    return buf.getvalue()


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(partition: str, data: list[dict]) -> str:
    lines = [
        "# HELP stune_active_value A subject's median result over its window, in the check's unit.",
        "# TYPE stune_active_value gauge",
    ]
    lines.extend(
        f'stune_active_value{{partition="{_label(partition)}",check="{_label(d["check"])}",'
        f'subject="{_label(d["subject"])}",unit="{_label(d["unit"])}"}} {d["value"]}'
        for d in data
        if d["value"] is not None
    )
    lines += [
        "# HELP stune_active_baseline The partition median for the check and fingerprint.",
        "# TYPE stune_active_baseline gauge",
    ]
    seen = set()
    for d in data:
        key = (d["check"], d["fingerprint"])
        if d["baseline"] is not None and key not in seen:
            seen.add(key)
            lines.append(
                f'stune_active_baseline{{partition="{_label(partition)}",check="{_label(d["check"])}",'
                f'fingerprint="{_label(d["fingerprint"])}"}} {d["baseline"]}'
            )
    lines += [
        "# HELP stune_active_outlier 1 when the subject is an outlier (k of n runs slow), 0 when not, "
        "-1 when it cannot be judged.",
        "# TYPE stune_active_outlier gauge",
    ]
    for d in data:
        value = {judge.OUTLIER: 1, judge.OK: 0}.get(d["status"], -1)  # unknown, unavailable: -1
        lines.append(
            f'stune_active_outlier{{partition="{_label(partition)}",check="{_label(d["check"])}",'
            f'subject="{_label(d["subject"])}"}} {value}'
        )
    return "\n".join(lines) + "\n"


def png(path: str, partition: str, data: list[dict]) -> None:
    """One panel per check: each subject's value, the baseline median and the slow threshold."""
    import matplotlib  # optional: the reports extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    checks = sorted({d["check"] for d in data if d["value"] is not None})
    if not checks:
        raise ValueError("no measured values to plot")
    fig, axes = plt.subplots(
        len(checks), 1, figsize=(max(6, 0.25 * len(data) + 4), 3.2 * len(checks)), squeeze=False
    )
    for ax, check in zip(axes[:, 0], checks):
        ds = [d for d in data if d["check"] == check and d["value"] is not None]
        colors = ["tab:red" if d["status"] == judge.OUTLIER else "tab:blue" for d in ds]
        ax.bar([d["subject"] for d in ds], [d["value"] for d in ds], color=colors)
        for d in ds[:1]:
            if d["baseline"] is not None:
                ax.axhline(d["baseline"], color="black", linestyle="-", label="partition median")
            if d["threshold"] is not None:
                ax.axhline(d["threshold"], color="tab:orange", linestyle="--", label="slow below")
            if d["floor"] is not None:
                ax.axhline(d["floor"], color="tab:red", linestyle=":", label="floor")
        ax.set_title(f"{partition}: {check}")
        ax.set_ylabel(ds[0]["unit"] if ds else "")
        ax.tick_params(axis="x", labelrotation=90)
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def checks_listing(profile=None) -> list[dict]:
    """`stune-sweep checks`: every check stune knows, or those `profile` configures, each with the command it
    runs, the accelerators whose partitions run it, and whether its tool is here (a path set in active.tools
    must be an executable file; otherwise the tool is looked up on PATH), and what to install when it is not.
    A check the profile configures for another vendor's partitions is listed with why it is not run."""
    chosen = None if profile is None else {c.name: s for c, s in configured(profile)}
    other = {} if profile is None else {c.name: why for c, why in skipped(profile)}
    tools = {} if profile is None else profile.active.tools.to_dict()
    out = []
    for c in CATALOGUE.values():
        if chosen is not None and c.name not in chosen and c.name not in other:
            continue
        setting = profile.active.checks[c.name] if profile is not None else None
        command = (
            (setting.command if setting is not None and setting.command else None)
            or c.command
            or f"server: {c.server}; client: {c.client}"
        )
        path = tool_path(tools, c.tool)
        problem = (
            None
            if path
            else (
                f"active.tools.{c.tool} is {tools[c.tool]}, which is not an executable file here"
                if tools.get(c.tool)
                else f"{c.tool} is not on PATH here"
            )
        )
        out.append(
            {
                "name": c.name,
                "kind": c.kind,
                "accelerators": list(c.vendors),
                "tool": c.tool,
                "metric": c.metric,
                "unit": c.unit or None,
                "command": command,
                "tool_path": path,
                "problem": problem,
                "install": c.install,
                "time_limit_s": None if setting is None else setting.time_limit,
                "floor": None if setting is None else setting.floor,
                "not_run": other.get(c.name),
            }
        )
    return out


def checks_text(listing: list[dict]) -> str:
    lines = []
    for c in listing:
        here = c["tool_path"] or f"not available ({c['problem']}): install {c['install']}"
        vendors = "" if len(c["accelerators"]) > 2 else f" [{'/'.join(c['accelerators'])}]"
        lines += [
            f"{c['name']:15} {c['kind']:4} {c['metric']} ({c['unit'] or 'pass/fail'}){vendors}",
            f"{'':20}command: {c['command']}",
            f"{'':20}tool here: {here}",
            *([f"{'':20}{c['not_run']}"] if c["not_run"] else []),
        ]
    return "".join(line + "\n" for line in lines)
