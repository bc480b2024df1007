"""Reading the submission history back (`stune-sbatch history`): load it, find a run, list, diff two runs,
with each run's throughput (samples/s, data wait) beside it. history.py writes the history, on the submission
path; this module is not on that path.

The throughput is the job's steps summary (usage/steps.py: what the training script wrote to
$STUNE_STEPS_FILE, summarised by the epilog into the job's AdminComment), read by one sacct call for the runs
shown (one per cluster when runs were submitted to other clusters with -M).
"""

from __future__ import annotations

from ..errors import StuneError
from ..text import is_digits
from .history import history_path

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..slurm.adapter import Slurm
    from ..usage.steps import StepStats

UNKNOWN = "?"  # the cell of a run whose throughput could not be asked (sacct failed); "-": no steps record


class HistoryError(StuneError):
    """The history cannot be read, or a run named in `history diff` is not in it."""


class History(list):
    """The history's records, oldest first; `skipped` holds (line, why) of each line that was not one
    (torn by a crash or a full disk, or holding a number stune never writes), `path` the file."""

    def __init__(self, path: str, entries=(), skipped=()):
        super().__init__(entries)
        self.path, self.skipped = path, list(skipped)

    def warning(self) -> str | None:
        """One line about the skipped lines, or None when there were none."""
        if not self.skipped:
            return None
        line, why = self.skipped[0]
        n = len(self.skipped)
        return f"{self.path}: skipped {n} unreadable line{'s' if n != 1 else ''} (first: line {line}, {why})"


def load(environ=None) -> History:
    import json

    from ..readback import EPOCH_MAX, problem

    path = history_path(environ)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return History(path)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the history: {exc.strerror}") from None
    out = History(path)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            out.skipped.append((lineno, "torn: not a whole record"))  # a crash or a full disk: keep the rest
            continue
        if not isinstance(entry, dict):
            out.skipped.append((lineno, "not a record"))
            continue
        why = problem(entry["time"], 0, EPOCH_MAX) if entry.get("time") is not None else None
        if why:
            out.skipped.append((lineno, f"time: {why}"))
            continue
        entry["_line"] = lineno
        out.append(entry)
    return out


def find(entries: list[dict], ref: str) -> dict:
    """A run by job id (the latest submission with it), or by position: -1 is the latest, -2 the one before."""
    ref = ref.strip()
    if ref.startswith("-") and is_digits(ref[1:]):
        k = int(ref[1:])
        if not 1 <= k <= len(entries):
            raise HistoryError(f"there is no run {ref}: the history holds {len(entries)}")
        return entries[-k]
    job = ref.split(";")[0].split(".")[0]
    for entry in reversed(entries):
        if str(entry.get("job_id")) == job:
            return entry
    raise HistoryError(f"job {ref} is not in the history (see `stune-sbatch history`)")


def when(entry: dict) -> str:
    import time

    stamp = entry.get("time")
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if isinstance(stamp, (int, float)) else "?"
    )


def command_text(argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in argv or [])


def format_list(entries: list[dict], limit: int | None = None, rates: dict | None = None) -> str:
    """The runs as a table. With `rates` (throughput(): run_key -> StepStats or None), the samples/s and data
    wait columns: '-' where the job has no steps record, '?' where it could not be asked (sacct failed)."""
    shown = entries[-limit:] if limit else entries
    if not shown:
        return "no submissions recorded yet\n"
    from ..output import table

    rows = []
    for entry in shown:
        row = [
            when(entry),
            str(entry.get("job_id") or "?"),
            str(entry.get("partition") or "?"),
            str(entry.get("digest") or "-")[:8],
        ]
        if rates is not None:
            key = run_key(entry)
            known, stats = key in rates, rates.get(key)
            row += [rate_cell(stats) if known else UNKNOWN, wait_cell(stats) if known else UNKNOWN]
        rows.append((*row, command_text(["stune-sbatch", *entry.get("argv", [])])))
    header = ("when", "job", "partition", "digest")
    return table(rows, header + (("samples/s", "data wait") if rates is not None else ()) + ("command",))


def rate_cell(stats: StepStats | None) -> str:
    """samples/s median and its p10-p90 spread, e.g. `1830 (1790-1871)`."""
    if stats is None or stats.sps_p50 is None:
        return "-"
    return f"{rate(stats.sps_p50)} ({rate(stats.sps_p10)}-{rate(stats.sps_p90)})"


def wait_cell(stats: StepStats | None) -> str:
    return "-" if stats is None or stats.dwait_p50 is None else share(stats.dwait_p50)


def rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def share(value: float) -> str:
    return f"{100 * value:.0f} %"


def records(entries: list[dict], slurm: Slurm | None = None) -> tuple[dict[str, str | None], str | None]:
    """The runs' stune records: (run_key -> the job's AdminComment line, or None where it has none; a
    warning line, or None). One sacct call for the runs of each cluster; when it fails, its runs are left out
    of the answer and the warning says why."""
    from ..usage.pipeline import ADMIN_COMMENT_PREFIX

    by_cluster: dict[str | None, list[str]] = {}
    for entry in entries:
        job = str(entry.get("job_id") or "")
        if is_digits(job) and job not in by_cluster.setdefault(entry.get("cluster"), []):
            by_cluster[entry.get("cluster")].append(job)
    found: dict[str, str | None] = {}
    warnings = []
    for cluster, jobs in by_cluster.items():
        if not jobs:
            continue
        try:
            rows = _sacct(slurm, jobs, cluster)
        except StuneError as exc:
            warnings.append(f"no throughput shown{f' for cluster {cluster}' if cluster else ''}: {exc}")
            continue
        for job in jobs:
            key = job if cluster is None else f"{job};{cluster}"
            found[key] = None
            # an array's or a heterogeneous job's parts: the first with a steps record, else the first stune's
            lines = [r.get("AdminComment", "") for r in _rows_of(rows, job)]
            lines = [t for t in lines if t.startswith(ADMIN_COMMENT_PREFIX)]
            found[key] = next((t for t in lines if " sps=" in t), lines[0] if lines else None)
    return found, ("; ".join(warnings) or None)


def steps_of(found: dict[str, str | None]) -> dict[str, StepStats | None]:
    """records()' answer as the runs' steps summaries (None: no steps record)."""
    from ..usage import steps
    from ..usage.pipeline import admin_fields

    out: dict[str, StepStats | None] = {}
    for key, text in found.items():
        stats = steps.parse_tokens(admin_fields(text)) if text else None
        out[key] = stats if stats is not None and stats.has_steps else None
    return out


def throughput(
    entries: list[dict], slurm: Slurm | None = None
) -> tuple[dict[str, StepStats | None], str | None]:
    """The runs' steps summaries from their jobs' AdminComment (run_key -> StepStats, or None where the job
    has no steps record), and records()' warning."""
    found, warning = records(entries, slurm)
    return steps_of(found), warning


def bounds_of(entries: list[dict], found: dict[str, str | None]) -> dict[str, str]:
    """What bound each run (usage/bottleneck.py: compute, storage, communication, host, unclear), from its
    record and its partition's fio baselines; runs without a record are left out."""
    from ..usage import summary
    from ..usage.whyslow import why_sections

    out = {}
    for entry in entries:
        text = found.get(run_key(entry))
        if text:
            doc = why_sections(summary.parse(text), text, str(entry.get("partition") or ""))
            out[run_key(entry)] = doc["bottleneck"]["bound"]
    return out


def run_key(entry: dict) -> str:
    """A run's key in throughput()'s answer: its job id, with `;cluster` as sbatch --parsable prints it when it
    went to another cluster (-M): the same id on two clusters is two jobs."""
    cluster = entry.get("cluster")
    return f"{entry.get('job_id')};{cluster}" if cluster else str(entry.get("job_id"))


def _sacct(slurm, jobs: list[str], cluster: str | None) -> list[dict[str, str]]:
    if slurm is None:
        from ..slurm.adapter import Slurm

        slurm = Slurm.from_env()
    return slurm.sacct(
        ["JobIDRaw", "JobID", "AdminComment"],
        job_ids=jobs,
        extra=[f"--clusters={cluster}"] if cluster else None,
    )


def _rows_of(rows: list[dict[str, str]], job: str) -> list[dict[str, str]]:
    """The job's sacct rows: its own (JobIDRaw), then an array's tasks or a heterogeneous job's components
    (JobID `job_N`, `job+N`), in sacct's order."""
    own = [r for r in rows if r.get("JobIDRaw") == job]
    parts = [
        r
        for r in rows
        if r.get("JobIDRaw") != job and r.get("JobID", "").replace("+", "_").split("_")[0] == job
    ]
    return own + parts


def headline(
    a: dict, b: dict, rates: dict[str, StepStats | None], bounds: dict[str, str] | None = None
) -> str:
    """The throughput change next to the bottleneck's and the settings', in one line:
    `samples/s 1830 -> 1210 (-34 %); data wait 6 % -> 31 %; bound compute -> storage; --stage dropped`."""
    ja, jb = run_key(a), run_key(b)
    sa, sb = rates.get(ja), rates.get(jb)
    ra = None if sa is None else sa.sps_p50
    rb = None if sb is None else sb.sps_p50
    if ja not in rates or jb not in rates:
        parts = ["samples/s ?: sacct could not be asked"]
    elif sa is not None and sb is not None and ra is not None and rb is not None:
        parts = [f"samples/s {rate(ra)} -> {rate(rb)} ({100 * (rb - ra) / ra:+.0f} %)"]
        if sa.dwait_p50 is not None and sb.dwait_p50 is not None:
            parts.append(f"data wait {share(sa.dwait_p50)} -> {share(sb.dwait_p50)}")
    elif ra is None and rb is None:
        parts = ["samples/s -: no steps record for either run (docs/steps.md)"]
    else:
        parts = [f"samples/s {rate(ra)} -> {rate(rb)} ({jb if rb is None else ja}: no steps record)"]
    ba, bb = (bounds or {}).get(ja), (bounds or {}).get(jb)
    if ba and bb and ba != bb:
        parts.append(f"bound {ba} -> {bb}")
    return "; ".join(parts + (changes(a, b) or ["same settings"]))


def changes(a: dict, b: dict) -> list[str]:
    """What changed between two runs, a few words each (`--stage dropped`, `--nodes 1 -> 2`, `partition roce
    -> vpc`, `NCCL_IB_TIMEOUT changed`, `script edited`); the whole story is diff()'s."""
    out = []
    if a.get("partition") != b.get("partition"):
        out.append(f"partition {a.get('partition')} -> {b.get('partition')}")
    elif a.get("digest") != b.get("digest"):
        out.append("profile changed")
    out.extend(_option_changes(a.get("argv") or [], b.get("argv") or []))
    if a.get("script") != b.get("script"):
        out.append(f"script {a.get('script')} -> {b.get('script')}")
    elif a.get("script_sha256") and b.get("script_sha256") and a["script_sha256"] != b["script_sha256"]:
        out.append("script edited")
    env_a, env_b = a.get("env") or {}, b.get("env") or {}
    names = [n for n in sorted(set(env_a) | set(env_b)) if env_a.get(n) != env_b.get(n)]
    if len(names) > 3:
        out.append(f"{len(names)} environment variables changed")
    else:
        out.extend(
            f"{name} {'added' if name not in env_a else 'removed' if name not in env_b else 'changed'}"
            for name in names
        )
    if a.get("cwd") != b.get("cwd"):
        out.append("directory changed")
    return out


def _option_changes(argv_a: list, argv_b: list) -> list[str]:
    """The options of two command lines compared by option (sbatch's and stune's), not by word: `-N 2` and
    `--nodes=2` are the same; the partition is changes()'s."""
    from .options import parse_args

    def read(argv):
        argv = [str(w) for w in argv]
        parsed = parse_args(argv)
        found: dict[str, list] = {}
        for opt in parsed.options + parsed.stune:
            found.setdefault(opt.key.removeprefix("stune:"), []).append(opt.value)
        found.pop("partition", None)
        script = argv[parsed.script_index + 1 :] if parsed.script_index is not None else []
        return found, script

    (opts_a, args_a), (opts_b, args_b) = read(argv_a), read(argv_b)
    out = []
    for key in list(opts_a) + [k for k in opts_b if k not in opts_a]:
        va, vb = opts_a.get(key), opts_b.get(key)
        if va == vb:
            continue
        if vb is None:
            out.append(f"--{key} dropped")
        elif va is None:
            out.append(f"--{key}{_values(vb)} added")
        else:
            out.append(f"--{key}{_values(va)} ->{_values(vb)}")
    if args_a != args_b:
        out.append("script arguments changed")
    return out


def _values(values: list) -> str:
    import shlex

    text = ",".join(shlex.quote(v) for v in values if v is not None)
    return f" {text[:40]}{'...' if len(text) > 40 else ''}" if text else ""


def diff(a: dict, b: dict) -> list[str]:
    """The lines that differ between two runs; an empty list when nothing that stune records changed."""
    out = []
    for key, label in (
        ("partition", "partition"),
        ("cluster", "cluster"),
        ("cwd", "directory"),
        ("script", "script"),
    ):
        if a.get(key) != b.get(key):
            out.append(f"{label}: {a.get(key)!r} -> {b.get(key)!r}")
    if a.get("script_sha256") and b.get("script_sha256") and a["script_sha256"] != b["script_sha256"]:
        out.append(
            f"script content changed: sha256 {a['script_sha256']} -> {b['script_sha256']}"
            + (f" ({b.get('script')})" if a.get("script") == b.get("script") else "")
        )
    if a.get("digest") != b.get("digest"):
        out.append(
            f"profile: {a.get('profile')} digest {a.get('digest')} -> {b.get('profile')} digest "
            f"{b.get('digest')} (the partition profile changed)"
        )
    if a.get("argv") != b.get("argv"):
        out.append(f"command: {command_text(a.get('argv'))}")
        out.append(f"     ->  {command_text(b.get('argv'))}")
    if a.get("added") != b.get("added"):
        out.append(
            f"options stune added: {' '.join(a.get('added') or []) or '-'} -> "
            f"{' '.join(b.get('added') or []) or '-'}"
        )
    env_a, env_b = a.get("env") or {}, b.get("env") or {}
    changed = []
    for name in sorted(set(env_a) | set(env_b)):
        if name not in env_b:
            changed.append(f"  - {name}={env_a[name]}")
        elif name not in env_a:
            changed.append(f"  + {name}={env_b[name]}")
        elif env_a[name] != env_b[name]:
            changed.append(f"  ~ {name}: {env_a[name]!r} -> {env_b[name]!r}")
    if changed:
        out.append(f"environment ({len(changed)} variable{'s' if len(changed) != 1 else ''} differ):")
        out.extend(changed)
    return out
