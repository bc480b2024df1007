"""Starting a Slurm client command and collecting what it says: the adapter's process spawning.

Built on os.posix_spawn and select.poll rather than subprocess (hot path: see docs/speed.md). Both functions
raise OSError when the program cannot start.
"""

from __future__ import annotations

import os


def spawn_capture(
    argv: list[str], input: str | None, env: dict[str, str], timeout: float, executable: str | None = None
) -> tuple[int, str, str]:
    """Run argv, feed `input`, collect stdout/stderr, kill it after `timeout` s. Raises TimeoutError/OSError."""
    import select
    import signal as _signal
    import time

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    actions = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    try:
        # the program's own name stays argv[0]: Slurm's messages start with it ("sbatch: error: ...")
        pid = os.posix_spawnp(executable or argv[0], argv, env, file_actions=actions, setsid=True)
    except OSError:
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    pending = input.encode() if input is not None else b""
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    if in_w >= 0:
        if pending:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1
    open_fds = {out_r, err_r} | ({in_w} if in_w >= 0 else set())
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.killpg(pid, _signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                raise TimeoutError(timeout)
            for fd, _event in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        sent = os.write(in_w, pending[:65536])
                    except BrokenPipeError:
                        sent, pending = 0, b""
                    pending = pending[sent:]
                    if not pending:
                        poller.unregister(in_w)
                        os.close(in_w)
                        open_fds.discard(in_w)
                        in_w = -1
                    continue
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
    return (
        os.waitstatus_to_exitcode(status),
        b"".join(chunks[out_r]).decode("utf-8", "replace"),
        b"".join(chunks[err_r]).decode("utf-8", "replace"),
    )


def spawn_relay(
    argv: list[str], stdin_data: bytes | None, env: dict[str, str], executable: str | None = None
) -> tuple[int, str]:
    """Run argv with our stderr, `stdin_data` (or our stdin) as its stdin, and its stdout copied to ours
    as it arrives. Returns (exit status, stdout text). Raises OSError when it cannot start."""
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe() if stdin_data is not None else (-1, -1)
    actions = [(os.POSIX_SPAWN_DUP2, out_w, 1)] + ([(os.POSIX_SPAWN_DUP2, in_r, 0)] if in_r >= 0 else [])
    try:
        pid = os.posix_spawnp(executable or argv[0], argv, env, file_actions=actions)
    except OSError:
        for fd in (out_r, out_w, in_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    os.close(out_w)
    if stdin_data is not None:  # in_r, in_w are its pipe
        os.close(in_r)
        try:  # sbatch reads its whole script before it writes anything, so this cannot deadlock
            view = memoryview(stdin_data)
            while view:
                view = view[os.write(in_w, view) :]
        except BrokenPipeError:  # it exited early (a bad option); its own message says why
            pass
        finally:
            os.close(in_w)
    chunks = []
    try:
        while True:
            data = os.read(out_r, 65536)
            if not data:
                break
            chunks.append(data)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]
            except OSError:  # our stdout is gone: keep reading so sbatch is not blocked
                pass
    finally:
        os.close(out_r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return (128 - code if code < 0 else code), b"".join(chunks).decode("utf-8", "replace")
