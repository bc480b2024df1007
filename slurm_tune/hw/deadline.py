"""Run a hardware probe with a deadline.

A GPU that has fallen off the bus makes NVML calls block, and a wedged HCA driver can block a sysfs read in
the kernel. Neither can be interrupted, so the probe runs in its own thread and the caller stops waiting at
the deadline: the result says "did not answer" and the hook goes on. The stuck thread is abandoned; the
process still exits, as with a daemon thread: threads started through `_thread` are never joined at exit.

`_thread` rather than `threading`: hot path, see docs/speed.md.
"""

from __future__ import annotations

import _thread
import time

from ..frozen import Record

TYPE_CHECKING = False  # typing's own flag costs importing typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:  # for annotations only
    from typing import Any

OK, TIMEOUT, ERROR = "ok", "timeout", "error"


class ProbeResult(Record):
    """status: ok (value is the result), timeout (did not answer within the deadline; value is whatever the
    probe published before it stalled, or None), error (the probe raised; message says what). reader: on a
    timeout, the stuck thread's state as the kernel shows it (`D`: uninterruptible sleep, a driver holding
    it; `S`: waiting; '' when it cannot be told), else ''."""

    __slots__ = ("name", "status", "value", "elapsed_s", "message", "reader")
    name: str
    status: str
    value: Any
    elapsed_s: float
    message: str
    reader: str

    def __init__(self, name: str, status: str, value, elapsed_s: float, message: str, reader: str = ""):
        Record.__init__(self, name, status, value, elapsed_s, message, reader)

    def timed_out(self) -> dict:
        """What a snapshot section records of a timeout: {"timeout": True, "reader": ...}, or {}."""
        return {"timeout": True, "reader": self.reader} if self.status == TIMEOUT else {}

    @property
    def answered(self) -> bool:
        return self.status == OK


class Partial:
    """Lets a probe publish progress, so a timeout still returns what was read before the stall."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value


def run_probe(name: str, probe, timeout_s: float, *args, **kwargs) -> ProbeResult:
    """probe(partial, *args, **kwargs) -> value. Never raises; never waits past timeout_s."""
    partial = Partial()
    box: dict = {}
    done = _thread.allocate_lock()
    done.acquire()  # released by the probe's thread when it finishes

    def target():
        box["tid"] = _thread.get_native_id()
        try:
            box["value"] = probe(partial, *args, **kwargs)
        except BaseException as exc:  # reported, never propagated: a probe bug must not kill the hook
            box["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            done.release()

    start = time.monotonic()
    _thread.start_new_thread(target, ())
    finished = done.acquire(timeout=max(0.0, timeout_s))
    elapsed = time.monotonic() - start
    if not finished:
        return ProbeResult(
            name,
            TIMEOUT,
            partial.value,
            elapsed,
            f"{name} did not answer within {timeout_s:g}s",
            thread_state(box.get("tid")),
        )
    if "error" in box:
        return ProbeResult(name, ERROR, partial.value, elapsed, box["error"])
    return ProbeResult(name, OK, box.get("value"), elapsed, "")


def thread_state(tid, pid: int | None = None) -> str:
    """The kernel's state letter (R, S, D, ...) of this process's thread `tid` (or of process `pid`); ''
    when it cannot be read. Reading a task's stat never blocks on what the task waits for."""
    if type(tid) is not int and type(pid) is not int:
        return ""
    import os

    path = f"/proc/{pid}/stat" if type(pid) is int else f"/proc/self/task/{tid}/stat"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 1024)
        finally:
            os.close(fd)
    except OSError:
        return ""
    fields = data.decode("ascii", "replace").rpartition(")")[2].split()
    return fields[0] if fields and len(fields[0]) == 1 and fields[0].isalpha() else ""
