"""A stand-in RebootProgram for the dev cluster (the remediation ladder's tests, issue 25).

slurmd runs slurm.conf's RebootProgram as root when slurmctld issues a node's reboot. This one records the
call (node, time, argv) as a JSON line in `<cluster>/reboots.jsonl` and "reboots" the node as far as Slurm can
tell: a detached helper restarts that node's slurmd with `-b` (slurmd's "report node rebooted"), so
slurmctld sees a node that booted and applies the reboot's nextstate. The node's fake hardware (its boot id,
its kernel log under nodes/<node>/) is the test's to change, as a real boot would change it.

    install(layout) -> the RebootProgram path (a wrapper that runs `python -m stune_dev.rebootstandin`)
    calls(layout)   -> the calls recorded so far
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .layout import SERIES_FILE, Layout, SlurmInstall

LOG = "reboots.jsonl"


def install(layout: Layout) -> Path:
    """Write the wrapper slurm.conf's RebootProgram names (the cluster's directory and port base baked in)."""
    path = layout.root / "reboot-standin"
    path.write_text(
        "#!/bin/sh\n"
        f"STUNE_CLUSTER_DIR={layout.root} STUNE_CLUSTER_PORT_BASE={layout.port_base} "
        f'PYTHONPATH={Path(__file__).resolve().parent.parent} exec {sys.executable} -m stune_dev.rebootstandin "$@"\n'
    )
    path.chmod(0o755)
    (layout.root / LOG).unlink(missing_ok=True)
    return path


def calls(layout: Layout) -> list[dict]:
    try:
        text = (layout.root / LOG).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def node_of_slurmd(pid: int) -> str | None:
    """The NodeName (`-N`) of the slurmd that is `pid` or an ancestor of it."""
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if argv and os.path.basename(argv[0].decode()) == "slurmd" and b"-N" in argv:
            return argv[argv.index(b"-N") + 1].decode()
        pid = int(stat.rpartition(")")[2].split()[1])  # the parent
    return None


def main(argv: list[str] | None = None) -> int:
    layout = Layout.from_env()
    node = node_of_slurmd(os.getppid())
    with open(layout.root / LOG, "a") as fh:
        fh.write(json.dumps({"node": node, "at": round(time.time(), 3), "argv": sys.argv[1:]}) + "\n")
    if node is None:
        return 1
    if os.fork() == 0:  # detached: slurmd waits for this program, and its restart must outlive it
        os.setsid()
        if os.fork() == 0:
            _detach_files()
            _reboot(layout, node)
        os._exit(0)
    return 0


def _detach_files() -> None:
    """Let go of every file slurmd handed down: slurmd 26.05 reads the RebootProgram's output until EOF, so a
    helper that kept the pipe would hold its reboot thread, and its SIGTERM shutdown waits 60 s for it."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 65536)


def _reboot(layout: Layout, node: str) -> None:
    from .devcluster import DevCluster

    try:
        series = (layout.root / SERIES_FILE).read_text().strip()
    except OSError:
        series = None
    time.sleep(1.0)  # let slurmd answer the reboot request first
    try:
        DevCluster(layout=layout, install=SlurmInstall.choose(series)).restart_slurmd(node, rebooted=True)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
