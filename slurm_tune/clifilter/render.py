"""What the cli_filter applies per partition: the profiles rendered through stune-sbatch's own plan.

`stune-admin install --cli-filter` writes, beside slurm.conf:
- `cli_filter.lua`: the shipped filter (this package's file), pointed at the data below;
- `stune-cli-filter/data.lua`: one table per profiled partition: the environment stune-sbatch would set for a
  plain submission (no options of the user's, nothing in the environment), each variable with the profile key
  it came from and whether the TaskProlog sets it on each node; the sbatch options it would add, with the
  commands that take them and the option names that say the user gave their own; and the notes the filter
  prints under STUNE_EXPLAIN=1.

Nothing is copied by hand: change a profile, run install again. The filter never starts Python.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

DATA_FORMAT = 1
DATA_DIR = "stune-cli-filter"
DATA_FILE = "data.lua"
LUA_FILE = "cli_filter.lua"
DATA_PLACEHOLDER = "@STUNE_CLI_FILTER_DATA@"
SLURM_CONF_LINE = "CliFilterPlugins=cli_filter/lua"
# sbatch option stune adds -> (the cli_filter option key, the commands that take it, the option keys whose
# value says the user gave their own, and what that value reads as when nobody did).
OPTIONS = {
    "--requeue": ("requeue", ("sbatch",), ("requeue",), ("unset",)),
    "--gpu-bind": ("gpu-bind", ("sbatch", "salloc", "srun"), ("gpu-bind",), ()),
    "--signal": ("signal", ("sbatch",), ("signal",), ("0@0",)),
}


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal: quotes, backslashes and control bytes escaped as decimal \\ddd."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif code < 32 or code == 127:
            out.append(f"\\{code:03d}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def lua_value(value) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(lua_value(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_string(str(k))}] = {lua_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {type(value).__name__} as Lua")


def partition_entry(profile: Profile) -> dict:
    """What the filter applies for one profile: stune-sbatch's plan for a submission with no options of the
    user's and an empty environment (so nothing is the user's), with and without --checkpoint-signal."""
    from ..nodeenv.envrules import REFINED_NAMES
    from ..sbatch.options import Effective
    from ..sbatch.plan import ENV, NODE, NOTE, OPTION, build_plan

    def plan(checkpoint: bool):
        return build_plan(
            partition=profile.name,
            partition_source="cli_filter",
            profile=profile,
            eff=Effective([], [], {}),
            environ={},
            cwd="/",
            stage_args=[],
            stage_required=False,
            degraded_nodes=list,
            het=False,
            script=None,
            checkpoint_signal=checkpoint,
        )

    base, opted = plan(False), plan(True)
    # `node`: a variable each node narrows or unsets itself (envrules: decided `submit, node`), so a step whose
    # environment the filter can only give as an --export list (srun, salloc's steps) leaves it to the node.
    env = [
        {"name": s.name, "value": s.value, "source": s.source, "node": s.name in REFINED_NAMES}
        for s in base.settings
        if s.kind == ENV and s.applied
    ]
    options: list[dict] = []
    for which, p in (("always", base), ("opt-in", opted)):
        for s in p.settings:
            if s.kind != OPTION or not s.applied or s.name not in OPTIONS:
                continue
            if which == "opt-in" and any(o["option"] == s.name for o in options):
                continue
            key, commands, user_keys, unset_values = OPTIONS[s.name]
            options.append(
                {
                    "option": s.name,
                    "key": key,
                    "value": s.value,
                    "commands": list(commands),
                    "user_keys": list(user_keys),
                    "unset_values": list(unset_values),
                    "source": s.source,
                    "when": which,
                    "note": s.note,
                }
            )
    notes = [
        {"name": s.name, "note": s.note, "source": s.source}
        for s in base.settings
        if s.kind == NODE and s.applied
    ]
    notes += [
        {"name": s.name, "note": s.note, "source": s.source}
        for s in base.settings
        if s.kind == NOTE and s.name == "binding"
    ]
    if profile.placement.switches or profile.placement.exclude_degraded:
        notes.append(
            {
                "name": "placement",
                "source": "placement.*",
                "note": "multi-node placement (--switches, --exclude of degraded nodes) needs Slurm's state "
                "at submission: stune-sbatch only",
            }
        )
    if profile.cache.stage:
        notes.append(
            {
                "name": "staging",
                "source": profile.origin("cache.stage"),
                "note": "cache.stage is staged on each node by the TaskProlog; --stage SRC is "
                "stune-sbatch's (or `stune-stage fetch` in the job)",
            }
        )
    return {
        "profile": profile.source,
        "digest": profile.digest,
        "fabric": profile.fabric.type,
        "env": env,
        "options": options,
        "notes": notes,
    }


def render(
    conf_dir: str, profiles_dir: str | None = None, default_partition: str | None = None
) -> dict[str, bytes]:
    """{path: content} of everything the filter reads, for a slurm.conf in `conf_dir`: the filter and its
    data."""
    from ..profilestore import load_profiles, profile_dir

    directory = profiles_dir or profile_dir()
    profiles = load_profiles(directory)
    data_dir = os.path.join(conf_dir, DATA_DIR)
    files: dict[str, bytes] = {}
    partitions = {}
    for name in sorted(profiles):
        partitions[name] = partition_entry(profiles[name])
    data_path = os.path.join(data_dir, DATA_FILE)
    doc = {
        "format": DATA_FORMAT,
        "profiles_dir": directory,
        "default_partition": default_partition,
        "partitions": partitions,
    }
    files[data_path] = (
        "-- Written by `stune-admin install --cli-filter` from the profiles in "
        f"{directory}; do not edit:\n-- change a profile and run install again.\nreturn "
        + lua_value(doc)
        + "\n"
    ).encode()
    # the path as a Lua literal: a quote or backslash in it must not break the script (Slurm would then refuse
    # every sbatch, salloc and srun)
    source = lua_source().replace(f'"{DATA_PLACEHOLDER}"', lua_string(data_path))
    files[os.path.join(conf_dir, LUA_FILE)] = source.encode()
    return files


def lua_source() -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), LUA_FILE), encoding="utf-8") as fh:
        return fh.read()


def default_partition_of(conf) -> str | None:
    """The partition slurm.conf marks Default=YES (a submission that names none goes there)."""
    for name, record in conf.partitions().items():
        if record.get("Default", "").upper() == "YES":
            return name
    return None


def enables_filter(plugins: str) -> bool:
    """Whether a CliFilterPlugins value runs the Lua filter (`cli_filter/lua`, or Slurm's short `lua`)."""
    names = [p.strip() for p in plugins.split(",")]
    return "cli_filter/lua" in names or "lua" in names


def enabled_here(environ) -> bool:
    """Whether this host's Slurm runs stune's cli_filter: slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf,
    as Slurm's commands find it), with the files it Includes (slurmfile.py reads it as install does),
    enables the Lua plugin, and stune's data file is beside it. The TaskProlog asks this for a job without
    STUNE_MANAGED: the filter leaves a plain sbatch job's environment to it (an --export list would make
    sbatch load the user's login environment). A slurm.conf that cannot be read reads as not enabled: the job
    runs as plain Slurm runs it."""
    conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not os.path.isfile(os.path.join(os.path.dirname(conf), DATA_DIR, DATA_FILE)):
        return False
    from ..slurmfile import SlurmConf

    return enables_filter(SlurmConf(conf).get(SLURM_CONF_LINE.split("=", 1)[0]))


def plain_job_environment(profile: Profile) -> dict[str, str]:
    """What the filter leaves to the TaskProlog for a plain sbatch job: the variables stune-sbatch sets at
    submission (its plan for a submission with nothing of the user's), less those each node decides itself
    (node_exports sets and narrows them)."""
    return {item["name"]: item["value"] for item in partition_entry(profile)["env"] if not item["node"]}


def cli_filter_files(slurm_conf: str, profiles_dir: str) -> dict[str, bytes]:
    """render() for the slurm.conf at `slurm_conf` (its directory; its Default=YES partition)."""
    from ..admin.slurmconf import SlurmConf

    conf_dir = os.path.dirname(os.path.abspath(slurm_conf))
    return render(conf_dir, profiles_dir, default_partition_of(SlurmConf(slurm_conf)))
