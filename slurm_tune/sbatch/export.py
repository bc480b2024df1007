"""sbatch's --export and --export-file: which environment a job starts with, and whose value of a variable
wins (the user's own, or what stune would set). A model of sbatch's rules; the plan (plan.py) asks it.
"""

from __future__ import annotations

from ..frozen import Record
from ..nodeenv.managed import MANAGED_VAR, parse_managed


class ExportSpec(Record):
    """sbatch's --export in effect. mode: all (the default), list (only the named ones) or none.
    `names`: listed without a value (their value comes from the environment); `assigned`: NAME=value."""

    __slots__ = ("mode", "names", "assigned", "raw", "where")
    mode: str
    names: tuple[str, ...]
    assigned: dict[str, str]
    raw: str | None
    where: str | None


def parse_export(opt) -> ExportSpec:
    """sbatch splits --export on commas: `ALL`, `NONE`, `NAME` (value from the environment), `NAME=value`."""
    if opt is None or opt.value is None:
        return ExportSpec("all", (), {}, None, None)
    names, assigned, mode = [], {}, "list"
    for item in opt.value.split(","):
        item = item.strip()
        if not item:
            continue
        if item.upper() == "ALL":
            mode = "all"
        elif item.upper() == "NONE":
            mode = "none" if mode != "all" else mode
        elif "=" in item:
            name, _, value = item.partition("=")
            assigned[name] = value
        else:
            names.append(item)
    if mode == "none" and (names or assigned):
        mode = "list"
    return ExportSpec(mode, tuple(names), assigned, opt.value, opt.where)


class UsersOwn:
    """Which variables the job gets with the user's own value, read once for a submission: the --export
    spec, the --export-file entries, the submitting environment, and which of its variables a parent stune
    job set (those are not the user's)."""

    def __init__(self, export: ExportSpec, environ, export_file: dict[str, str]):
        self.export, self.environ, self.export_file = export, environ, export_file
        self.parents = _managed_by_stune(environ)

    def value(self, name: str) -> tuple[str, str] | None:
        """(value, where) when the job gets the user's own value of `name`; None when stune may set it."""
        export = self.export
        if name in export.assigned:
            return export.assigned[name], f"--export {export.where}"
        if name in self.export_file:
            return self.export_file[name], "--export-file"
        inherited = export.mode == "all" or name in export.names
        if inherited and name in self.environ and name not in self.parents:
            return self.environ[name], "your environment"
        return None


def user_value(name: str, export: ExportSpec, environ, export_file: dict[str, str]) -> tuple[str, str] | None:
    """UsersOwn.value for one name."""
    return UsersOwn(export, environ, export_file).value(name)


def _managed_by_stune(environ) -> frozenset[str]:
    """Variables a parent stune job set (a submission from inside a job): not the user's choice."""
    managed = parse_managed(environ.get(MANAGED_VAR))
    return frozenset(n for n, v in managed.items() if v is None or environ.get(n) == v)


def read_export_file(path: str | None) -> dict[str, str]:
    """NAME=value entries of an --export-file (NUL- or newline-separated). Unreadable: sbatch says so."""
    if not path or path.isdigit():
        return {}
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return {}
    sep = "\0" if "\0" in data else "\n"
    out = {}
    for entry in data.split(sep):
        name, eq, value = entry.partition("=")
        if eq and name.strip():
            out[name.strip()] = value
    return out


def export_with(export: ExportSpec, names) -> str | None:
    """The --export option that also passes `names` (stune's variables) when the user's --export lists
    variables or says NONE; None when the job inherits the whole environment anyway."""
    if not names or export.mode not in ("list", "none"):
        return None
    kept = [] if export.mode == "none" or export.raw is None else [export.raw]
    return "--export=" + ",".join(kept + sorted(names))


def job_environment(plan_env: dict[str, str], export: ExportSpec, environ) -> dict[str, str]:
    """The environment the job starts with, as far as the submission decides it (for the history)."""
    if export.mode == "all":
        env = dict(environ)
    else:
        env = {k: v for k, v in environ.items() if k in export.names or k.startswith("SLURM_")}
    env.update(export.assigned)
    env.update(plan_env)
    return env
