"""Reset GPUs: the remediation ladder's first step (health/ladder.py), behind a deadline.

The command is the partition's `remediation.reset_command`, `nvidia-smi --gpu-reset -i {pci}` by default,
run once per GPU with `{pci}` its bus id (`0000:47:00.0`); a command without `{pci}` runs once for all of
them (`nvidia-smi -r` resets every GPU, as NVSwitch systems need). The driver refuses while a process uses
the GPU, so the ladder only resets an idle node. A command that does not finish within the deadline is
killed (a process stuck in the driver may not die: it is left, and said to be in D state) and the step has
failed; the next step is the reboot.
"""

from __future__ import annotations

import os
import signal
import subprocess

from .deadline import ERROR, TIMEOUT, run_probe, thread_state


def reset(command: list[str] | tuple[str, ...], pcis: list[str], timeout_s: float) -> tuple[bool, str]:
    """(all reset, what happened, one line)."""
    if not command:
        return False, "no reset command (remediation.reset_command)"
    runs = [[part.replace("{pci}", _bus_id(pci)) for part in command] for pci in pcis]
    if not any("{pci}" in part for part in command):
        runs = [list(command)]
    said = []
    for argv in runs:
        ok, line = _run(argv, timeout_s)
        said.append(line)
        if not ok:
            return False, "; ".join(said)
    return True, "; ".join(said)


def _bus_id(pci: str) -> str:
    """`0000:47:00` (an Xid's address) -> `0000:47:00.0`, the form nvidia-smi -i takes."""
    return pci if "." in pci else f"{pci}.0"


def _run(argv: list[str], timeout_s: float) -> tuple[bool, str]:
    def probe(partial):
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: killed whole on a timeout
        )
        partial.value = proc
        out, _ = proc.communicate()
        return proc.returncode, out.decode("utf-8", "replace")

    result = run_probe("gpu-reset", probe, timeout_s)
    shown = " ".join(argv)
    if result.status == TIMEOUT:
        proc = result.value
        state = ""
        if isinstance(proc, subprocess.Popen):
            state = thread_state(None, proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        return False, f"`{shown}` did not finish within {timeout_s:g}s" + (
            " (in D state)" if state == "D" else ""
        )
    if result.status == ERROR:
        return False, f"`{shown}` could not run: {result.message}"
    code, out = result.value
    last = next((line.strip() for line in reversed(out.splitlines()) if line.strip()), "")
    return code == 0, f"`{shown}` exited {code}" + (f": {last[:160]}" if last else "")
