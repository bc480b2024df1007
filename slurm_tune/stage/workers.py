"""The copy's worker processes (`cp` for batches of small files, `tar` for an archive): started so that they
die with the stager, in their own process group, their exit awaited on a pidfd, their stderr read into one
clear error."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

from .errors import SourceError, TierUnavailable

POLL_S = 0.05  # exit polling where pidfds are missing (Linux < 5.3)

_LIBC = None
_SETPRIV: list[str | None] = []


def _setpriv() -> str | None:
    """util-linux's setpriv, found once: it sets the parent-death signal and execs the worker, so the
    stager forks without running Python in the child (vfork: ~1.7 ms a worker against ~9 ms with a
    preexec_fn, measured with 9 `cp` batches; serialised in the stager, that was 0.06-0.18 s of a 20k-file
    copy)."""
    if not _SETPRIV:
        found = [
            os.path.join(d, "setpriv") for d in [*os.environ.get("PATH", "").split(":"), "/usr/bin"] if d
        ]
        _SETPRIV.append(next((path for path in found if os.access(path, os.X_OK)), None))
    return _SETPRIV[0]


def _libc():
    """libc through ctypes, loaded once in the stager: a worker's pre-exec hook must not import anything
    (importing ctypes in each forked child cost ~10 ms per worker, serialised in the stager)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def spawn(argv: list[str], cwd: str | None, errlog, stdin=None, umask: int = -1) -> subprocess.Popen:
    """Start a worker that gets SIGKILL when the stager dies (PR_SET_PDEATHSIG): a stager killed with -9
    must not leave workers writing into a directory the next stager is about to delete. Through setpriv
    where it is installed; else a pre-exec hook that also checks the stager did not die before the
    signal was set (setpriv leaves that window of a few microseconds open)."""
    # Its own process group, so killing the group takes its children (tar's decompressor) too; but in the
    # stager's session. A session of its own is also a scheduling group of its own where the kernel groups by
    # session (autogroup: on a machine whose tasks are not in cgroups, like the VM here), and N workers then
    # took N shares of a contended CPU where the stager's neighbours got one each: 0.51 s against 0.63 s
    # for 20k files at load 3 (docs/stage.md). Python < 3.11 has no process_group: a session there.
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    common = {
        **group,
        "cwd": cwd,
        "stdin": stdin if stdin is not None else subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": errlog,
        "close_fds": True,
        "umask": umask,
    }
    setpriv = _setpriv()
    if setpriv:
        return subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *argv], **common)
    libc, parent = _libc(), os.getpid()

    def die_with_parent():
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the stager died before prctl took effect
            os._exit(137)

    # the fallback where setpriv is missing: the hook imports nothing and takes no lock (libc loaded before)
    return subprocess.Popen(argv, preexec_fn=die_with_parent, **common)  # noqa: PLW1509


def kill(procs) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    for proc in procs:
        proc.wait()


def failure(errlog, what: str) -> TierUnavailable | SourceError:
    errlog.seek(0)
    text = errlog.read().decode("utf-8", "replace").strip()
    useful = [
        line
        for line in text.splitlines()
        if "Exiting with failure status" not in line and "Removing leading" not in line
    ]
    last = useful[-1] if useful else (text.splitlines()[-1] if text else "no message")
    if "No space left" in text or "Disk quota exceeded" in text:
        return TierUnavailable("disk-full", f"{what}: the cache disk is full ({last})")
    if "Permission denied" in text or "No such file" in text:
        return SourceError(f"{what}: {last}")
    return TierUnavailable("copy-failed", f"{what} failed: {last}")


def wait_any(procs, timeout: float) -> list:
    """The workers among `procs` that have exited, waiting up to `timeout` s for the first exit. Sleeping a
    fixed tick between polls left every worker slot idle for half a tick on average: with many small
    batches that was a third of a 20k-file copy."""
    done = [p for p in procs if p.poll() is not None]
    if done or not procs:
        return done
    fds: list[int] = []
    try:
        for proc in procs:  # one at a time: those opened before a failure are still closed below
            fds.append(os.pidfd_open(proc.pid))  # noqa: PERF401
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    except (AttributeError, OSError):  # no pidfd_open here: poll
        time.sleep(min(POLL_S, timeout))
    finally:
        for fd in fds:
            os.close(fd)
    return [p for p in procs if p.poll() is not None]
