"""`stune-admin doctor`'s tuning drift: per partition with a profile, each node's host settings judged by the
drift checks (health/drift.py) from what its capture recorded (`--facts DIR`, or the hardware-less %n tree),
summed up in one table: one row per setting, the nodes that differ and what they have. A part of Doctor
(doctor.py), which supplies `add`; NodeChecks supplies `node_snapshot`."""

from __future__ import annotations

from collections.abc import Callable

from ..health import result
from ..health.drift import findings
from ..hostlist import compress_hostlist
from ..output import table
from .findings import OK, WARNING

HEADER = ("setting", "expected", "differs on", "have")


class DriftChecks:
    # what Doctor and NodeChecks supply
    add: Callable[..., None]
    node_snapshot: Callable[..., dict | None]
    drift: dict[str, dict]

    def check_drift(self, profiles, nodes) -> None:
        for name, profile in sorted(profiles.items()):
            members = [n.name for n in nodes if name in n.partitions]
            judged: dict[str, list] = {}
            missing = []
            for node in members:
                snap = self.node_snapshot(node)
                if not isinstance(snap, dict) or not isinstance(snap.get("drift"), dict):
                    missing.append(node)
                    continue
                judged[node] = findings(snap, profile)
            if missing:
                self.add(
                    WARNING,
                    f"drift {name}",
                    f"no host settings recorded for {compress_hostlist(missing)}: tuning drift not checked there",
                    "`stune-health capture --partition P -o DIR/<node>.json` on each node, then "
                    "`stune-admin doctor --facts DIR`",
                )
            if not judged:
                continue
            rows = drift_rows(judged)
            self.drift[name] = {"nodes": sorted(judged), "rows": rows}
            for row in rows:
                if row["differs"]:
                    self.add(
                        WARNING,
                        f"drift {name}",
                        f"{row['setting']} differs on {len(row['differs'])} node(s): {row['drifted']}; "
                        f"expected {row['expected']}",
                        row["fix"],
                    )
            if not any(row["differs"] for row in rows):
                self.add(OK, f"drift {name}", f"no tuning drift on {len(judged)} node(s)")

    def drift_tables(self) -> str:
        out = []
        for name, found in sorted(self.drift.items()):
            lines = [
                (r["setting"], r["expected"], compress_hostlist(r["differs"]) or "-", r["have"])
                for r in found["rows"]
            ]
            out.append(
                f"tuning drift, partition {name} ({len(found['nodes'])} node(s) judged; - : none differs):\n"
                + table(lines, HEADER)
            )
        return "\n".join(out)


def drift_rows(judged: dict[str, list]) -> list[dict]:
    """One row per setting over the nodes' drift findings: what is expected, the nodes where it drifted,
    what they have (grouped: `n[1-2]: powersave`), the nodes that could not tell, and the first fix."""
    settings: dict[str, dict] = {}
    for node, found in sorted(judged.items()):
        for f in found:
            row = settings.setdefault(
                f.setting, {"expected": "", "have": {}, "unknown": {}, "fix": "", "nodes": set()}
            )
            row["nodes"].add(node)
            if f.status == result.OK:
                row["expected"] = row["expected"] or f.expected
            elif f.status == result.DEGRADED:
                row["expected"] = row["expected"] or f.expected
                row["fix"] = row["fix"] or f"on {node}: {f.fix}"
                shown = f.have if f.subject == "node" or f.subject in f.setting else f"{f.subject} {f.have}"
                row["have"].setdefault(node, []).append(shown)
            else:
                row["unknown"].setdefault(node, f.have)
    rows = []
    for setting, row in settings.items():
        groups: dict[str, list[str]] = {}
        for node, values in row["have"].items():
            groups.setdefault(", ".join(values[:3]) + (" ..." if len(values) > 3 else ""), []).append(node)
        have = [f"{compress_hostlist(nodes)}: {value}" for value, nodes in groups.items()]
        drifted = "; ".join(have)
        unknown = sorted(set(row["unknown"]) - set(row["have"]))
        fine = len(row["nodes"] - set(row["have"]) - set(unknown))
        if not have and fine:
            have.append(f"as expected on {fine}")
        if unknown:
            have.append(f"? on {compress_hostlist(unknown)} ({row['unknown'][unknown[0]]})")
        rows.append(
            {
                "setting": setting,
                "expected": row["expected"] or "?",
                "differs": sorted(row["have"]),
                "unknown": unknown,
                "have": "; ".join(have),
                "drifted": drifted,
                "fix": row["fix"],
            }
        )
    return rows
