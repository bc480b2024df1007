"""`stune-sbatch --dry-run`: what a submission would do, and where each setting comes from, as text or JSON.

Only a dry run imports this; a submission never does (the hot-path import rule: docs/speed.md).
"""

from __future__ import annotations

from . import PROG


def command_text(words: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(w) for w in words)


def explain_doc(plan, words: list[str], script_label: str) -> dict:
    """`--dry-run --json`: what explain() says, as data. `settings`: every setting stune considered, with its
    kind (env, option, node, note, warning), whether it was applied, and where it comes from."""
    from ..nodeenv.managed import MANAGED_VAR
    from .setting import STAGED

    p = plan.profile
    return {
        "submitted": False,
        "partition": plan.partition,
        "partition_source": plan.partition_source,
        "profile": {"source": p.source, "digest": p.digest, "fabric": p.fabric.type},
        "multi_node": bool(plan.multi_node),
        "node_reason": plan.node_reason,
        "script": script_label,
        "sbatch": ["sbatch", *words],
        "env": dict(plan.env),
        "managed_var": MANAGED_VAR,
        "export_option": plan.export_option,
        "warnings": plan.warnings,
        "staged_variables": [s.name for s in plan.settings if s.kind == STAGED],
        "settings": [
            {
                "kind": s.kind,
                "name": s.name,
                "value": s.value,
                "source": s.source,
                "applied": bool(s.applied),
                "note": s.note,
            }
            for s in plan.settings
        ],
    }


def explain(plan, words: list[str], script_label: str) -> str:
    from ..nodeenv.managed import MANAGED_VAR
    from .setting import ENV, NODE, NOTE, OPTION, STAGED, WARNING

    p = plan.profile
    lines = [
        f"{PROG} --dry-run: nothing was submitted",
        f"partition   {plan.partition}  ({plan.partition_source})",
        f"profile     {p.source}  (digest {p.digest}, fabric {p.fabric.type})",
        f"nodes       {'multi-node' if plan.multi_node else 'single node'}: {plan.node_reason}",
        f"script      {script_label}",
        "",
        "sbatch command:",
        "  " + command_text(["sbatch", *words]),
    ]

    def table(title: str, rows: list[tuple[str, str]]) -> None:
        if not rows:
            return
        lines.extend(["", title])
        width = min(max(len(r[0]) for r in rows), 44)
        for left, right in rows:
            pad = " " * max(width - len(left), 0)
            lines.append(f"  {left}{pad}  <- {right}")

    s_env = [s for s in plan.settings if s.kind == ENV and s.applied]
    table(
        "environment stune sets for the job:",
        [(f"{s.name}={s.value}", s.source + (f"; {s.note}" if s.note else "")) for s in s_env]
        + (
            [
                (
                    f"{MANAGED_VAR}={plan.env[MANAGED_VAR]}",
                    "rule: the names stune set, so the TaskProlog may refine them and never touches yours",
                )
            ]
            if MANAGED_VAR in plan.env
            else []
        ),
    )
    table(
        'detected on each node (stune-task-prolog, or eval "$(stune-env)" in the script):',
        [(s.name, s.source + f"; {s.note}") for s in plan.settings if s.kind in (NODE, STAGED) and s.applied],
    )
    table(
        "sbatch options stune adds:",
        [
            (
                s.name if s.value is None else f"{s.name}={s.value}",
                s.source + (f"; {s.note}" if s.note else ""),
            )
            for s in plan.settings
            if s.kind == OPTION and s.applied
        ]
        + (
            [
                (
                    plan.export_option,
                    "rule: your --export names only some variables: stune's are added to the list",
                )
            ]
            if plan.export_option
            else []
        ),
    )
    table(
        "kept as you set them (stune does not override):",
        [(s.name, f"{s.note}  [{s.source}]") for s in plan.settings if not s.applied and s.kind != NOTE],
    )
    notes = [(s.name, s.note + f"  [{s.source}]") for s in plan.settings if s.kind == NOTE]
    table("notes:", notes)
    table(
        "warnings (also printed at submission):",
        [(s.name, s.note + f"  [{s.source}]") for s in plan.settings if s.kind == WARNING],
    )
    return "\n".join(lines) + "\n"
