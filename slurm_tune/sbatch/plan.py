"""What stune adds to one submission, and why.

`build_plan` turns the options in effect, the submitting environment and the partition profile into a Plan:
environment variables for the job, sbatch options, settings the TaskProlog detects on each node, and notes.
Every Setting names the profile key (file:line) or the rule it came from, and one the user already set is
kept (applied=False) with a note saying so. The plan itself is pure: the only Slurm call it may make (the
degraded nodes of a multi-node job's partition) goes through the `degraded_nodes` callable it is given.
"""

from __future__ import annotations

from ..frozen import Record

# MANAGED_VAR (STUNE_MANAGED): what stune set (not the user), with the values: the TaskProlog refines a
# variable only while it still has stune's value, and a nested stune-sbatch does not mistake them for the
# user's own.
from ..nodeenv.managed import MANAGED_VAR, RENDEZVOUS, SUMMARY_VAR, format_managed
from .export import UsersOwn, export_with, parse_export, read_export_file
from .options import Effective, node_range
from .recovery import recovery_settings
from .setting import ENV, NODE, NOTE, OPTION, WARNING, Setting, origin
from .staging import container_settings, stage_settings

TYPE_CHECKING = False  # typing's own flag costs importing typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:  # for annotations only
    from ..profilestore import Profile


class Plan(Record):
    """`options`: the sbatch words stune adds; `env`: the variables stune sets in sbatch's environment;
    `export_option`: a rewritten --export (the user's list plus stune's names), or None; `unset`: names to
    drop from sbatch's environment (a parent stune job's per-node values, which each node detects anew)."""

    __slots__ = (
        "partition",
        "partition_source",
        "profile",
        "settings",
        "options",
        "env",
        "export_option",
        "multi_node",
        "node_reason",
        "unset",
    )
    partition: str
    partition_source: str
    profile: Profile
    settings: list[Setting]
    options: list[str]
    env: dict[str, str | None]
    export_option: str | None
    multi_node: bool
    node_reason: str
    unset: tuple[str, ...]

    @property
    def warnings(self) -> list[str]:
        return [s.note for s in self.settings if s.kind == WARNING]

    @property
    def managed(self) -> list[str]:
        return [s.name for s in self.settings if s.kind == ENV and s.applied]


def multi_node(eff: Effective, het: bool = False) -> tuple[bool, str]:
    """Whether the job may span nodes, and the reason: a heterogeneous job (each component is allocated its
    own nodes), -N above 1, or tasks without -N (Slurm may spread them); an unreadable -N counts as multi-node
    (excluding degraded nodes is the safe side)."""
    if het:
        return True, "a heterogeneous job: each component gets nodes of its own"
    nodes = eff.get("nodes")
    if nodes is not None:
        span = node_range(nodes.value)
        if span is None:
            return True, f"-N {nodes.value!r} ({nodes.where}) read as multi-node"
        if max(span) > 1:
            return True, f"-N {nodes.value} ({nodes.where})"
        return False, f"-N {nodes.value} ({nodes.where})"
    ntasks = eff.get("ntasks")
    if ntasks is not None:
        try:
            count = int(ntasks.value or "1")
        except ValueError:
            count = 2
        if count > 1:
            return True, f"-n {ntasks.value} without -N ({ntasks.where}): Slurm may spread the tasks"
    return False, "one node (no -N above 1)"


def nccl_settings(profile: Profile) -> list[Setting]:
    """The NCCL, gloo and rendezvous variables of the environment rule table (nodeenv/envrules.py) that the
    partition's profile calls for, before the user's own are taken out: a value stune-sbatch sets (env), or
    one each node detects (node)."""
    from ..nodeenv.envrules import RULES

    out: list[Setting] = []
    for rule in RULES:
        if not rule.when(profile):
            continue
        note = rule.note_for(profile)
        for name, value, cites in rule.values(profile):
            out.append(
                Setting(NODE if value is None else ENV, name, value, rule.source(profile, cites), True, note)
            )
    return out


_GPU_KEYS = (
    "gpus",
    "gpus-per-node",
    "gpus-per-task",
    "gpus-per-socket",
    "gres",
    "tres-per-task",
    "tres-per-node",
)


def asks_gpus(eff: Effective) -> bool:
    """Whether the job asks for GPUs (--gpus*, or a gpu in --gres / --tres-per-*)."""
    for key in _GPU_KEYS:
        opt = eff.get(key)
        if opt is not None and (key.startswith("gpus") or "gpu" in (opt.value or "")):
            return True
    return False


def binding_settings(profile: Profile, eff: Effective) -> list[Setting]:
    bind = profile.numa.bind
    gpus = bool(profile.gpu.count) or asks_gpus(eff)
    if bind == "slurm":
        out = []
        gpu_bind = eff.get("gpu-bind")
        if not gpus:
            out.append(
                Setting(
                    NOTE,
                    "binding",
                    None,
                    origin(profile, "numa.bind", "gpu.count"),
                    True,
                    "no GPU (gpu.count 0, and the job asks for none): no --gpu-bind; tasks are "
                    "bound by SLURM_CPU_BIND",
                )
            )
        elif gpu_bind is None:
            out.append(Setting(OPTION, "--gpu-bind", "closest", origin(profile, "numa.bind"), True, ""))
        else:
            out.append(
                Setting(
                    OPTION,
                    "--gpu-bind",
                    "closest",
                    origin(profile, "numa.bind"),
                    False,
                    f"kept your --gpu-bind={gpu_bind.value} ({gpu_bind.where})",
                )
            )
        # sbatch has no --cpu-bind; srun reads SLURM_CPU_BIND as its default.
        out.append(
            Setting(
                ENV,
                "SLURM_CPU_BIND",
                profile.numa.cpu_bind,
                origin(profile, "numa.bind", "numa.cpu_bind"),
                True,
                "srun's --cpu-bind default for every step (sbatch has no --cpu-bind)",
            )
        )
        return out
    if bind == "stune" and not gpus:
        return [
            Setting(
                NOTE,
                "binding",
                None,
                origin(profile, "numa.bind", "gpu.count"),
                True,
                "no GPU (gpu.count 0, and the job asks for none): stune-bind has no GPU to bind a "
                "task near; bind with srun's --cpu-bind",
            )
        ]
    if bind == "stune":
        return [
            Setting(
                NOTE,
                "binding",
                None,
                origin(profile, "numa.bind"),
                True,
                "run each task as `srun stune-bind CMD` to bind it to its GPU's NUMA node",
            )
        ]
    return [
        Setting(NOTE, "binding", None, origin(profile, "numa.bind"), True, "numa.bind is none: no binding")
    ]


def placement_settings(profile: Profile, eff: Effective, multi: bool, degraded_nodes) -> list[Setting]:
    place = profile.placement
    out = []
    if not multi:
        if place.exclude_degraded:
            out.append(
                Setting(
                    NOTE,
                    "placement",
                    None,
                    origin(profile, "placement.exclude_degraded"),
                    True,
                    "single-node job: nodes marked degraded may run it",
                )
            )
        return out
    if place.switches:
        from ..durations import clock

        value = f"{place.switches}@{clock(place.switches_max_wait)}"
        mine = eff.get("switches")
        out.append(
            Setting(
                OPTION,
                "--switches",
                value,
                origin(profile, "placement.switches", "placement.switches_max_wait"),
                mine is None,
                f"kept your --switches={mine.value} ({mine.where})"
                if mine
                else "keep the job under one leaf switch, waiting at most that long for it",
            )
        )
    if place.exclude_degraded:
        from ..nodestate import DEGRADED_FEATURE

        marked = degraded_nodes()
        requested = _node_names(eff.get("nodelist"))
        wanted = [n for n in marked if n in requested]
        excluded = [n for n in marked if n not in requested]
        source = origin(profile, "placement.exclude_degraded")
        if excluded:
            mine = eff.get("exclude")
            value = ",".join(([mine.value] if mine and mine.value else []) + excluded)
            note = f"nodes marked {DEGRADED_FEATURE}: {','.join(excluded)}"
            if mine:
                note += f" (added to your --exclude={mine.value}, {mine.where})"
            out.append(Setting(OPTION, "--exclude", value, source, True, note))
        else:
            out.append(
                Setting(
                    NOTE,
                    "placement",
                    None,
                    source,
                    True,
                    f"no node of the partition is marked {DEGRADED_FEATURE}",
                )
            )
        if wanted:
            out.append(
                Setting(
                    NOTE,
                    "placement",
                    None,
                    source,
                    False,
                    f"kept {','.join(wanted)}: your --nodelist asks for them although they are "
                    f"marked {DEGRADED_FEATURE}",
                )
            )
    return out


def _node_names(opt) -> frozenset[str]:
    """Plain names of a --nodelist (bracket ranges expanded)."""
    if opt is None or not opt.value:
        return frozenset()
    from ..hostlist import expand_hostlist

    return frozenset(expand_hostlist(opt.value))


def build_plan(
    *,
    partition: str,
    partition_source: str,
    profile: Profile,
    eff: Effective,
    environ,
    cwd: str,
    stage_args: list[str],
    stage_required: bool,
    degraded_nodes,
    het: bool,
    script: str | None = None,
    checkpoint_signal: bool = False,
    stage_strict: bool = False,
    node_summary: bool = False,
    unknown: list[str] | tuple = (),
    requeue_option=None,
) -> Plan:
    export = parse_export(eff.get("export"))
    export_file_opt = eff.get("export-file")
    export_file = read_export_file(export_file_opt.value if export_file_opt else None)
    multi, node_reason = multi_node(eff, het)
    settings = (
        nccl_settings(profile)
        + binding_settings(profile, eff)
        + recovery_settings(profile, eff, script, checkpoint_signal, multi and not het, requeue_option)
    )
    if het:
        settings = [s for s in settings if s.kind not in (OPTION, WARNING)]
        settings.append(
            Setting(
                NOTE,
                "placement",
                None,
                "rule: heterogeneous job",
                True,
                "a het job: stune sets the environment only, no sbatch options",
            )
        )
    else:
        settings += placement_settings(profile, eff, multi, degraded_nodes)
    settings += stage_settings(stage_args, stage_required, cwd, eff, environ)
    if not het:
        settings += container_settings(profile, eff, stage_args, cwd)
    if stage_strict:
        from ..stage.jobenv import FRESHNESS_VAR

        settings.append(
            Setting(
                ENV,
                FRESHNESS_VAR,
                "strict",
                "rule: --stage-strict",
                True,
                "a cached copy is used only when every file's size and mtime still match the "
                "source (the tier's default `fast` checks the top level only)",
            )
        )
    if node_summary:
        settings.append(
            Setting(
                ENV,
                SUMMARY_VAR,
                "1",
                "rule: --node-summary",
                True,
                "each node writes one line with its final settings to the job's stderr",
            )
        )
    from .options import PLUGIN_KEYS

    for opt in eff.directives + eff.command_line:
        if opt.key in PLUGIN_KEYS:
            settings.append(
                Setting(
                    NOTE,
                    f"--{opt.key}",
                    None,
                    f"{opt.where}",
                    True,
                    "a site plugin's option (learned from sbatch --help): passed to sbatch",
                )
            )
    for line in unknown:  # words sbatch's table cannot classify: said, and stune's settings still apply
        settings.append(
            Setting(
                WARNING,
                "option",
                None,
                "rule: sbatch's option table",
                True,
                f"{line}; stune's settings still apply",
            )
        )
    users = UsersOwn(export, environ, export_file)
    final: list[Setting] = []
    for s in settings:
        if s.kind in (ENV, NODE) and s.applied:
            mine = users.value(s.name)
            if mine is not None:
                s = s._replace(
                    applied=False,
                    note=f"kept your {s.name}={mine[0]} ({mine[1]}); "
                    + (f"stune would set {s.value}" if s.value is not None else "stune would detect it"),
                )
        final.append(s)
    env = {s.name: s.value for s in final if s.kind == ENV and s.applied}
    # values only for what the TaskProlog refines (STUNE_STAGE is long, and never refined)
    managed = {
        s.name: (s.value if s.kind == ENV and s.name != "STUNE_STAGE" else None)
        for s in final
        if s.kind in (ENV, NODE) and s.applied
    }
    if managed:
        env[MANAGED_VAR] = format_managed(managed)
    options = [
        s.name if s.value is None else f"{s.name}={s.value}" for s in final if s.kind == OPTION and s.applied
    ]
    # Under --export=NONE or a list, srun steps do not inherit the batch step's environment: name the
    # rendezvous in the list, so each step's tasks get the batch step's MASTER_ADDR/PORT (one value per job).
    rendezvous = [n for n in RENDEZVOUS if n in managed and n not in env]
    export_option = export_with(export, list(env) + rendezvous)
    if export_option:
        options.append(export_option)
    # Per-node values a parent stune job detected (a submission from inside a job): not this job's.
    unset = tuple(s.name for s in final if s.kind == NODE and s.applied and s.name in environ)
    return Plan(
        partition, partition_source, profile, final, options, env, export_option, multi, node_reason, unset
    )
