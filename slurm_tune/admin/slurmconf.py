"""slurm.conf as the admin wrote it (Include followed), the settings stune needs, and the lines to add.

One table (`requirements`) serves both `stune-admin install` (it prints what is missing as a diff against
the live file) and `stune-admin doctor` (it reports each as a finding). The file is read, not `scontrol show
config`: Slurm 25.x no longer prints Prolog/Epilog/EpilogSlurmctld there, and the admin edits the file.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
from dataclasses import dataclass

from ..durations import DurationError, parse_slurm
from ..hostlist import expand_hostlist
from ..slurmfile import DEFAULTS, RECORD_KEYS, Setting, SlurmConf

__all__ = ["DEFAULTS", "RECORD_KEYS", "Setting", "SlurmConf"]  # the reader's home is slurm_tune/slurmfile.py


def read_key_values(path: str) -> dict[str, str] | None:
    """cgroup.conf / gres.conf style `Key=Value` lines, keys lower-cased; None when the file is missing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    out = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        k, sep, v = line.partition("=")
        if sep and " " not in k.strip():
            out[k.strip().lower()] = v.strip()
    return out


def seconds(text: str, unit_s: int = 60) -> int | None:
    """A Slurm duration ("5", "00:01:00", "1-0", "300 sec"; durations.parse_slurm); plain numbers are in
    `unit_s`. None when empty, INFINITE or unreadable."""
    if not text.strip():
        return None
    try:
        return parse_slurm(text, bare_unit=unit_s)
    except DurationError:
        return None


def glob_reaches(pattern: str, path: str) -> bool:
    """Whether a Prolog/Epilog value (a path, a glob, or a comma list of them) runs `path`."""
    return any(fnmatch.fnmatchcase(path, p.strip()) for p in pattern.split(",") if p.strip())


@dataclass
class Need:
    """One slurm.conf setting stune relies on: the check and the line that fixes it."""

    key: str
    ok: bool
    have: str
    line: str  # what to write (the whole Key=Value line)
    why: str
    severity: str = "error"  # when not ok


def requirements(conf: SlurmConf, paths: dict[str, str], role: str = "all") -> list[Need]:
    """What stune needs in slurm.conf. `paths`: prolog_dir, epilog_dir, health_run, task_prolog,
    epilog_slurmctld (where install placed them)."""
    needs: list[Need] = []
    get = conf.get

    def add(key, ok, line, why, severity="error"):
        needs.append(Need(key, ok, get(key) or "(not set)", line, why, severity))

    flags = [f.strip().lower() for f in get("PrologFlags").split(",")]
    add(
        "PrologFlags",
        "alloc" in flags,
        "PrologFlags=" + ",".join([f for f in get("PrologFlags").split(",") if f.strip()] + ["Alloc"]),
        "the prolog runs on every node of a job at allocation, before any step",
    )
    for key, kind in (("Prolog", "prolog_dir"), ("Epilog", "epilog_dir")):
        directory = paths[kind]
        hooks = [
            os.path.join(directory, n)
            for n in (
                ("10-stune-health", "20-stune-jobgpus")
                if key == "Prolog"
                else ("10-stune-health", "20-stune-usage", "30-stune-stage")
            )
        ]
        value = get(key)
        why = f"the glob reaches stune's {key.lower()} hooks in {directory}"
        if value and not value.endswith("*"):
            why += f"; move your current {key} script {value} into {directory} (e.g. as 00-site) so it still runs"
        add(key, bool(value) and all(glob_reaches(value, h) for h in hooks), f"{key}={directory}/*", why)
    sched = [p.strip().lower() for p in get("SchedulerParameters").split(",")]
    add(
        "SchedulerParameters",
        "nohold_on_prolog_fail" in sched,
        "SchedulerParameters="
        + ",".join(
            [p for p in get("SchedulerParameters").split(",") if p.strip()] + ["nohold_on_prolog_fail"]
        ),
        "add to your list: a job a failed prolog requeued runs elsewhere, not held",
    )
    add(
        "HealthCheckProgram",
        get("HealthCheckProgram") == paths["health_run"],
        f"HealthCheckProgram={paths['health_run']}",
        "the periodic full check: drains, marks, resumes",
    )
    interval = seconds(get("HealthCheckInterval"), 1) or 0
    add(
        "HealthCheckInterval",
        interval > 0,
        "HealthCheckInterval=300",
        "seconds; 0 never runs the health check",
    )
    state = get("HealthCheckNodeState").upper()
    add(
        "HealthCheckNodeState",
        "ANY" in state or ("MIXED" in state and "ALLOC" in state),
        "HealthCheckNodeState=ANY,CYCLE",
        "busy nodes are checked too; CYCLE spreads the runs",
        "warning",
    )
    if role in ("node", "all"):
        add(
            "TaskProlog",
            get("TaskProlog") == paths["task_prolog"],
            f"TaskProlog={paths['task_prolog']}",
            "per-node NCCL settings and staged datasets for every task",
        )
        plugins = [p.strip() for p in get("TaskPlugin").split(",") if p.strip()]
        add(
            "TaskPlugin",
            "task/cgroup" in plugins,
            "TaskPlugin="
            + ",".join(
                [p for p in plugins if p != "task/none"]
                + ["task/cgroup"]
                + ([] if any(p == "task/affinity" for p in plugins) else ["task/affinity"])
            ),
            "applies cgroup.conf's ConstrainDevices: a job opens only its own GPUs",
            "warning",
        )
    if role in ("controller", "all"):
        add(
            "EpilogSlurmctld",
            get("EpilogSlurmctld") == paths["epilog_slurmctld"],
            f"EpilogSlurmctld={paths['epilog_slurmctld']}",
            "each job's GPU usage into AdminComment; read only when slurmctld starts: restart it",
        )
    add(
        "PriorityType",
        get("PriorityType") == "priority/multifactor",
        "PriorityType=priority/multifactor",
        "the accountant's SiteFactor and fair share weigh in priority",
    )
    try:
        weight = float(get("PriorityWeightFairshare") or 0)
    except ValueError:
        weight = 0
    add(
        "PriorityWeightFairshare",
        weight > 0,
        "PriorityWeightFairshare=10000",
        "any weight > 0: fair share counts",
    )
    tres = [t.strip().lower() for t in get("AccountingStorageTRES").split(",")]
    add(
        "AccountingStorageTRES",
        "gres/gpu" in tres,
        "AccountingStorageTRES="
        + ",".join([t for t in get("AccountingStorageTRES").split(",") if t.strip()] + ["gres/gpu"]),
        "add to your list: GPUs are accounted (gres/gpu in AllocTRES)",
    )
    enforce = [e.strip().lower() for e in get("AccountingStorageEnforce").split(",")]
    add(
        "AccountingStorageEnforce",
        "associations" in enforce and "limits" in enforce,
        "AccountingStorageEnforce="
        + ",".join(dict.fromkeys([e for e in enforce if e] + ["associations", "limits"])),
        "jobs need an association to be charged; limits: a job's last partial period is charged too",
        "warning",
    )
    period = seconds(get("PriorityCalcPeriod"), 60)
    add(
        "PriorityCalcPeriod",
        period is not None and period <= 60,
        "PriorityCalcPeriod=1",
        "minutes; the default 5 delays what users see in sprio by up to 5 min",
        "warning",
    )
    return needs


def gpu_partitions(conf: SlurmConf) -> list[str]:
    """Partitions whose nodes have GPUs in their Gres= (from slurm.conf alone, no profile needed)."""
    gpu_nodes: set[str] = set()
    for rec in conf.nodes():
        if any(g.split(":")[0] == "gpu" for g in rec.get("Gres", "").split(",")):
            gpu_nodes.update(expand_hostlist(rec.get("NodeName", "")))
    out = []
    for name, rec in conf.partitions().items():
        nodes = rec.get("Nodes", "")
        if gpu_nodes and (nodes.upper() == "ALL" or gpu_nodes & set(expand_hostlist(nodes))):
            out.append(name)
    return out


def partition_needs(conf: SlurmConf, gpu_partitions: list[str]) -> list[Need]:
    """TRESBillingWeights with GRES/gpu on each GPU partition (the accountant weighs GPU-hours by it)."""
    out = []
    parts = conf.partitions()
    for name in gpu_partitions:
        rec = parts.get(name)
        if rec is not None:
            out.append(gpu_weight_need(name, rec.get("TRESBillingWeights", "")))
    return out


def gpu_weight_need(partition: str, weights: str) -> Need:
    return Need(
        f"PartitionName={partition} TRESBillingWeights",
        "gres/gpu" in weights.lower(),
        weights or "(not set)",
        'TRESBillingWeights="CPU=1.0,Mem=0.25G,GRES/gpu=8.0"',
        "on each GPU partition: the GPU weight the accountant charges by",
        "error",
    )


def with_reason(line: str, why: str) -> str:
    """A settings line as install prints it and README shows it: the line, then `# why` (Slurm's parsers
    take `#` to the end of a line as a comment, in slurm.conf, cgroup.conf and gres.conf alike)."""
    return f"{line:<46} # {why}"


def recommended_block(paths: dict[str, str]) -> str:
    """Every slurm.conf line stune's features need, each with its reason: what install prints against an
    empty slurm.conf (both roles, a GPU partition). README's slurm.conf block is this text (a test compares)."""
    needs = requirements(SlurmConf("slurm.conf", text=""), paths, "all")
    lines = [with_reason(n.line, n.why) for n in needs]
    weight = gpu_weight_need("...", "")
    lines.append(with_reason(f"PartitionName=... {weight.line}", weight.why))
    return "\n".join(lines) + "\n"


def diff_against(path: str, text: str, needs: list[Need]) -> str:
    """A unified diff of `path` with each unmet need's line replacing the live one (or appended)."""
    missing = [n for n in needs if not n.ok and "=" in n.line]
    if not missing:
        return ""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new = list(lines)
    appended = []
    for need in missing:
        if need.key.startswith("PartitionName="):
            _weigh_gpus(new, need.key.split()[0].split("=", 1)[1])
            continue
        pattern = re.compile(rf"^\s*{re.escape(need.key)}\s*=", re.I)
        idx = next((i for i, line in enumerate(new) if pattern.match(line)), None)
        if idx is None:
            appended.append(with_reason(need.line, need.why) + "\n")
        else:
            new[idx] = with_reason(need.line, need.why) + "\n"
    if appended:
        new += ["# stune (stune-admin install)\n", *appended]
    return "".join(difflib.unified_diff(lines, new, path, path + " (with stune)"))


def _weigh_gpus(lines: list[str], partition: str) -> None:
    """Add GRES/gpu to the partition line's TRESBillingWeights (or the whole attribute) in place, with the
    reason as the line's comment unless it has one."""
    pattern = re.compile(rf"^\s*PartitionName={re.escape(partition)}(\s|$)", re.I)
    for i, line in enumerate(lines):
        if not pattern.match(line):
            continue
        body, hash_, comment = line.rstrip("\n").partition("#")
        if not hash_:
            hash_, comment = "#", " " + gpu_weight_need(partition, "").why
        m = re.search(r'TRESBillingWeights=("?)([^"\s]*)\1', body, re.I)
        if m:
            weights = m.group(2) + ("," if m.group(2) else "") + "GRES/gpu=8.0"
            body = body[: m.start()] + f'TRESBillingWeights="{weights}"' + body[m.end() :]
        else:
            body = body.rstrip() + ' TRESBillingWeights="CPU=1.0,Mem=0.25G,GRES/gpu=8.0"'
        lines[i] = body.rstrip() + (f" {hash_}{comment}" if hash_ else "") + "\n"
        return
