"""Node-local state: what the health hooks remember between runs on one node.

One small JSON file per node (`$STUNE_STATE_DIR/state.json`, default /var/lib/stune/health), read and
rewritten under an flock so the prolog, the epilog and the periodic run never lose each other's updates:

- `baselines`: error counters per port, for deltas (updated by the periodic run; the hooks only create one);
- `xid_seq`, `xid_sticky`: the last kernel log record judged, and the fatal Xids held until reboot;
- `gpu_pci`: the GPUs' PCI addresses as NVML last listed them;
- `trusted`: the policy digests this node has passed; a hook only fails a job under a policy the node has
  passed before, so a broken policy cannot drain the fleet through the prologs (see docs/health.md);
- `last`: the last verdict (mode, time, status, reason, policy);
- `hook_fail`: the last time a prolog/epilog failed the node on purpose, so the periodic run can tell
  Slurm's "Prolog error" drain that stune caused from anybody else's;
- `applied`: what the periodic run last applied to Slurm (drain / degraded / ok and the reason), so an
  unchanged node makes no Slurm call;
- `breaker`: the circuit breaker's last decision;
- `healthy`: when the node was last judged ok (any mode): the start of the window in which a failed job is
  blamed on it (health/requeue.py);
- `requeued`: the jobs the periodic run requeued without this node (job id, time, node, form), newest first;
- `unknown_runs`: unknown findings of the periodic run and how many runs in a row each has been unknown
  (`health.unknown_degrade_after` of them mark the node degraded);
- `incidents`, `incident_counts`, `ladder`: the Xid incidents (bounded), the events per code, and the
  remediation ladder's steps (health/incidents.py, health/ladder.py);
- `hangs`: per probe, the periodic runs in a row it hit its deadline (health/hang.py).

A missing, unreadable or garbled state file, or one holding a number stune never writes (NaN, inf, out of
range: slurm_tune.readback's rule), starts over (baselines are re-taken), said in one line naming the file
and the key; the bad file is kept as `state.json.bad`. It never stops a hook.
"""

from __future__ import annotations

import os
import time

from .. import fastjson
from ..errors import StuneError
from ..safeio import LockFile, open_append
from ..thisnode import expand
from .outputs import write_json

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

FORMAT = "stune-health-state/1"
DEFAULT_DIR = "/var/lib/stune/health"
STATE_FILE = "state.json"
LOG_FILE = "health.log"
LOG_MAX_BYTES = 1 << 20
TRUSTED_KEEP = 8


def state_dir(text: str | None = None, environ=None, node: str | None = None) -> str:
    """`text` (--state-dir), else $STUNE_STATE_DIR, else /var/lib/stune/health; `%n` is the node name
    (`node`, else $SLURMD_NODENAME)."""
    environ = os.environ if environ is None else environ
    return expand(text or environ.get("STUNE_STATE_DIR") or DEFAULT_DIR, node, environ)


def empty(node: str = "") -> dict:
    return {"format": FORMAT, "node": node, "baselines": {}, "xid_sticky": [], "trusted": []}


def require_trusted_dir(directory: str) -> None:
    """Run as root, the state directory (or, before it exists, where it will be made) must be writable by
    root alone: state decides what root does to the node (baselines, trust, held Xids). UnsafePathError
    (one line naming the path) otherwise; a hook reports that as "not judged" and exits 0."""
    from ..safeio import require_trusted

    require_trusted(directory, missing_ok=True)


def read(directory: str) -> tuple[dict, str | None]:
    """(state, problem). A missing file is an empty state; an unreadable one too, with the problem said.
    Raises UnsafePathError when root may not trust the directory."""
    require_trusted_dir(directory)
    path = os.path.join(directory, STATE_FILE)
    try:
        data = fastjson.load_file(path)
    except FileNotFoundError:
        return empty(), None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return empty(), f"{path}: unreadable, starting over: {exc}"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return empty(), f"{path}: not a stune health state file, starting over"
    for key, kind in (("baselines", dict), ("xid_sticky", list), ("trusted", list), *_ISSUE25_KEYS):
        if not isinstance(data.get(key), kind):
            data[key] = kind()
    why = bad_number(data)
    if why:  # a NaN baseline or an infinite retry time would be acted on: garbage, like a garbled file
        return empty(), f"{path}: {why}, starting over"
    return data, None


COUNTER_MAX = float(1 << 64)  # an error counter is a 64-bit number
_ISSUE25_KEYS = (("incidents", list), ("incident_counts", dict), ("ladder", dict), ("hangs", dict))
# the times the state holds (section, field); bad_number checks them and the counters by readback's rule
_TIMES = (
    ("last", "at"),
    ("hook_fail", "at"),
    ("applied", "synced_at"),
    ("applied", "retry_at"),
    ("breaker", "at"),
    ("healthy", "at"),
)
JOB_ID_MAX = 1 << 32  # Slurm's job ids are 32-bit


def bad_number(data: dict) -> str | None:
    """'key: problem' for the first number in the state that stune could not have written (not finite, out
    of range, not a number), else None."""
    from ..readback import EPOCH_MAX, problem

    for section, key in _TIMES:
        value = data.get(section)
        if isinstance(value, dict) and value.get(key) is not None:
            why = problem(value[key], 0, EPOCH_MAX)
            if why:
                return f"{section}.{key}: {why}"
    for port, counters in data["baselines"].items():
        for name, value in counters.items() if isinstance(counters, dict) else ():
            why = problem(value, 0, COUNTER_MAX, integer=True)
            if why:
                return f"baselines.{port}.{name}: {why}"
    requeued = data.get("requeued")
    for i, entry in enumerate(requeued if isinstance(requeued, list) else ()):
        if not isinstance(entry, dict):
            return f"requeued[{i}]: not a record"
        why = problem(entry.get("job"), 1, JOB_ID_MAX, integer=True) or problem(entry.get("at"), 0, EPOCH_MAX)
        if why:
            return f"requeued[{i}]: {why}"
    checks = [("xid_seq", data.get("xid_seq"), 1 << 62)] if data.get("xid_seq") is not None else []
    runs = data.get("unknown_runs")
    checks += [(f"unknown_runs.{k}", v, 1 << 30) for k, v in (runs.items() if isinstance(runs, dict) else ())]
    for key, value, high in checks:
        why = problem(value, 0, high, integer=True)
        if why:
            return f"{key}: {why}"
    return _incident_numbers(data, problem, EPOCH_MAX)


def _incident_numbers(data: dict, problem, epoch_max: float) -> str | None:
    """bad_number for the incident engine's, the ladder's and the hang escalation's keys."""
    checks: list = []
    found = data.get("incidents")
    for n, inc in enumerate(found if isinstance(found, list) else ()):
        if isinstance(inc, dict):
            released = inc.get("released") if isinstance(inc.get("released"), dict) else {}
            checks += [(f"incidents[{n}].at", inc.get("at"), epoch_max, False)]
            checks += [(f"incidents[{n}].{k}", inc.get(k), 1 << 62, True) for k in ("count", "seq", "xid")]
            checks += [(f"incidents[{n}].released.at", released["at"], epoch_max, False)] if released else []
    checks += [(f"incident_counts.{k}", v, 1 << 62, True) for k, v in data["incident_counts"].items()]
    ladder = data["ladder"]
    for n, step in enumerate(ladder.get("steps") if isinstance(ladder.get("steps"), list) else ()):
        checks += (
            [(f"ladder.steps[{n}].at", step.get("at"), epoch_max, False)] if isinstance(step, dict) else []
        )
    if isinstance(ladder.get("repair"), dict):
        checks.append(("ladder.repair.at", ladder["repair"].get("at"), epoch_max, False))
    for probe, hang in data["hangs"].items():
        if isinstance(hang, dict):
            checks += [(f"hangs.{probe}.runs", hang.get("runs"), 1 << 30, True)]
            checks += [(f"hangs.{probe}.since", hang.get("since"), epoch_max, False)]
    for key, value, high, integer in checks:
        why = problem(value, 0, high, integer=integer)
        if why:
            return f"{key}: {why}"
    return None


class Locked(LockFile):
    """`with Locked(dir) as st:` reads the state under an exclusive flock on `<dir>/lock` (waited for);
    `st.save()` writes it back."""

    def __init__(self, directory: str):
        super().__init__(os.path.join(directory, "lock"), holder="stune-health")
        self.directory = directory
        self.state: dict = {}
        self.problem: str | None = None

    def __enter__(self) -> Locked:
        require_trusted_dir(self.directory)
        super().__enter__()
        try:
            self.state, self.problem = read(self.directory)
            if self.problem:
                self.problem = self._keep_bad()
        except BaseException:
            super().__exit__()
            raise
        return self

    def _keep_bad(self) -> str:
        """A state that starts over keeps the bad file beside it (state.json.bad, the latest one) for a person
        to look at: starting over never destroys what was there."""
        path = os.path.join(self.directory, STATE_FILE)
        try:
            os.replace(path, path + ".bad")
        except OSError:
            return self.problem or ""
        return f"{self.problem} (the old file is kept as {path}.bad)"

    def save(self) -> None:
        write_json(
            os.path.join(self.directory, STATE_FILE), self.state
        )  # atomic, like the node's other outputs


def policy_digest(profile: Profile) -> str:
    """A digest of what the health checks judge by (fabric, versions, gpu, health): editing anything else in
    the profile (cache, NCCL, placement) does not make a node re-earn trust."""
    import zlib

    data = profile._data  # read only: no copy of the whole profile on the prolog path
    key = repr([data.get(k) for k in ("partition", "fabric", "versions", "gpu", "health")])
    return f"{zlib.crc32(key.encode()):08x}"


def log(directory: str, line: str, now: float | None = None) -> None:
    """Append one line to the node's health log (kept under 1 MiB, one old copy). Best effort."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() if now is None else now))
    path = os.path.join(directory, LOG_FILE)
    try:
        require_trusted_dir(directory)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        try:
            if os.stat(path).st_size > LOG_MAX_BYTES:
                os.replace(path, path + ".1")
        except FileNotFoundError:
            pass
        fd = open_append(path, create_mode=0o644)
        try:
            os.write(fd, f"{stamp} {line}\n".encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except (OSError, StuneError):
        pass
