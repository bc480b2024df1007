"""Finding and running the Ascend command-line tools (npu-smi, hccn_tool): each run behind a deadline, its
output read up to a bound.

Where a tool is found, first hit wins: the profile's `accel.tools` (name -> absolute path; a path named there
that is not an executable file is reported, not looked around), the directory `$STUNE_ACCEL_TOOLS` (`%n` is
the node's name: the dev cluster's per-node stand-ins), each absolute directory of `$PATH`, then
/usr/local/sbin, /usr/local/bin and /usr/local/Ascend/driver/tools, where the driver package installs them.

A run that does not finish by its deadline has its process group killed; a tool stuck in the driver (D state)
may not die, and its process is remembered: while it lives, that tool is not started again (the sampler runs
npu-smi every tick, and stuck copies must not pile up) and each run reports the hang at once.
"""

from __future__ import annotations

import os

from ..thisnode import expand
from ..trust import read_bounded
from .deadline import ERROR, TIMEOUT, run_probe, thread_state

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    import subprocess

TOOLS_DIR_VAR = "STUNE_ACCEL_TOOLS"
SEARCH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/local/Ascend/driver/tools")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OUTPUT_LIMIT = 1 << 20  # npu-smi info of 16 chips is ~8 KiB; more is not a tool we know
_stuck: dict[str, subprocess.Popen] = {}  # tool path -> the subprocess.Popen that did not die at its deadline


class ToolRun:
    """What one run gave: `output` (stdout and stderr, decoded) and `code` when it finished; else `why` (one
    line) with `timeout` True when it hit its deadline (or an earlier run of it is still stuck) and `reader`
    the stuck process's state letter (D: held by the driver)."""

    __slots__ = ("code", "output", "why", "timeout", "reader")

    def __init__(self, code=None, output: str = "", why: str = "", timeout: bool = False, reader: str = ""):
        self.code, self.output, self.why, self.timeout, self.reader = code, output, why, timeout, reader

    @property
    def ok(self) -> bool:
        return self.code is not None and not self.why


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_tool(name: str, tools=None, environ=None, node: str | None = None) -> tuple[str | None, str]:
    """(path, "") or (None, why not: one line)."""
    given = tools.get(name) if tools is not None and hasattr(tools, "get") else None
    if given:
        if not isinstance(given, str) or not os.path.isabs(given):
            return None, f"{name}: accel.tools gives {given!r}, not an absolute path"
        return (
            (given, "") if _executable(given) else (None, f"{name}: {given} (accel.tools) is not executable")
        )
    environ = os.environ if environ is None else environ
    dirs = []
    named = environ.get(TOOLS_DIR_VAR)
    if isinstance(named, str) and named:
        dirs.append(expand(named, node, environ))
    path = environ.get("PATH")
    dirs += [d for d in (path if isinstance(path, str) else "").split(":") if os.path.isabs(d)]
    dirs += SEARCH_DIRS
    for d in dirs:
        candidate = os.path.join(d, name)
        if _executable(candidate):
            return candidate, ""
    return None, f"{name} not found (${TOOLS_DIR_VAR}, PATH, {', '.join(SEARCH_DIRS)})"


def tool_env(environ=None) -> dict[str, str]:
    """The environment a tool runs with: the caller's, with a PATH where it has none."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if isinstance(k, str) and isinstance(v, str) and "=" not in k}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def shown(argv: list[str]) -> str:
    """The command as a report names it: the tool's name, not its directory (`hccn_tool -i 3 -link -g`)."""
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


def run_tool(argv: list[str], timeout_s: float, env: dict[str, str], deadline: str = "") -> ToolRun:
    """Run argv (argv[0] a path from find_tool) with stdin closed; never raises, never waits past timeout_s.
    `deadline`: how a timeout names the deadline (default: timeout_s)."""
    import signal
    import subprocess

    command = shown(argv)
    earlier = _stuck.pop(argv[0], None)
    if earlier is not None and earlier.poll() is None:
        state = thread_state(None, earlier.pid)
        if state not in ("", "Z"):  # still there, not just dying
            _stuck[argv[0]] = earlier
            return ToolRun(
                why=f"`{command}` not run: an earlier one is still stuck (pid {earlier.pid}"
                + (", in D state)" if state == "D" else ")")
                + "; not run again",
                timeout=True,
                reader=state,
            )

    def probe(partial):
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group: killed whole at the deadline
        )
        partial.value = proc
        assert proc.stdout is not None
        with proc.stdout:
            data = read_bounded(proc.stdout.fileno(), OUTPUT_LIMIT)
            if data is None:
                _kill(proc, signal)
        code = proc.wait()
        return code, data

    result = run_probe(command, probe, timeout_s)
    if result.status == TIMEOUT:
        proc, state = result.value, ""
        if isinstance(proc, subprocess.Popen):
            state = thread_state(None, proc.pid)
            _kill(proc, signal)
            _stuck[argv[0]] = proc
        return ToolRun(
            why=f"`{command}` did not answer within {deadline or f'{timeout_s:.3g}s'}",
            timeout=True,
            reader=state,
        )
    if result.status == ERROR:
        return ToolRun(why=f"`{command}` could not run: {result.message}")
    code, data = result.value
    if data is None:
        return ToolRun(code, why=f"`{command}` printed more than {OUTPUT_LIMIT >> 10} KiB")
    return ToolRun(code, data.decode("utf-8", "replace"))


def _kill(proc, signal) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
