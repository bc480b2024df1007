"""What the dev cluster needs of this machine (its Debian packages, the test users, node names that resolve)
and how it watches its daemons (pid files, ports, waiting with the log's last lines on failure)."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from pathlib import Path

from .layout import NODES, REPO, START_TIMEOUT_S, TEST_ACCOUNTS, ClusterError, log


def ensure_packages() -> None:
    """The Debian packages the cluster runs on (munge, MariaDB, Slurm's daemons), installed when missing by
    scripts/setup.sh, their one list: `setup.sh --packages` does only that step."""
    script = REPO / "scripts" / "setup.sh"
    if not script.is_file():
        raise ClusterError(f"{script} is missing: stune-devcluster runs from a checkout of stune")
    proc = subprocess.run(
        ["bash", str(script), "--packages"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in proc.stdout.splitlines():
        log(line)
    if proc.returncode != 0:
        raise ClusterError(
            f"{script} --packages failed (exit {proc.returncode}): "
            f"{(proc.stdout.strip().splitlines() or ['no message'])[-1]}"
        )


def ensure_unix_users() -> None:
    for users in TEST_ACCOUNTS.values():
        for user in users:
            try:
                pwd.getpwnam(user)
            except KeyError:
                subprocess.run(
                    ["useradd", "--create-home", "--shell", "/bin/bash", user],
                    check=True,
                    capture_output=True,
                )


HOSTS_FILE = Path("/etc/hosts")


def ensure_node_names_resolve(hosts: Path = HOSTS_FILE) -> None:
    """Each node's NodeHostname (its NodeName) resolves to loopback through /etc/hosts, so what jobs read
    from Slurm (`scontrol show hostnames`, SLURM_JOB_NODELIST, MASTER_ADDR) can be connected to, as on a real
    cluster. Appends one line for the names it lacks; a name /etc/hosts already maps is left as it is."""
    try:
        text = hosts.read_text()
    except OSError:
        text = ""
    known = set()
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        known.update(words[1:])
    missing = [n for n in NODES if n not in known]
    if missing:
        with hosts.open("a") as fh:  # in place: /etc/hosts is often a bind mount in containers
            fh.write(
                ("" if not text or text.endswith("\n") else "\n")
                + f"127.0.0.1\t{' '.join(missing)}\t# stune-devcluster: the dev cluster's node names\n"
            )


def pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    try:  # a recycled pid is not our daemon
        if "zombie" in Path(f"/proc/{pid}/status").read_text().lower():
            return None
    except OSError:
        return None
    return pid


EXITED_AFTER_S = 2.0


def log_tail(logfile: Path, lines: int = 3) -> str:
    """A daemon log's last lines, and before them the last `error:` line they lack: the cause (slurmctld's
    "Invalid EpilogSlurmctld(...)") comes a line or two before the generic fatal ones."""
    try:
        text = logfile.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    last = text[-lines:]
    errors = [line for line in text[-50:-lines] if "error:" in line]
    return " | ".join(errors[-1:] + last)


def wait_for(
    what: str,
    predicate,
    timeout: float = START_TIMEOUT_S,
    logfile: Path | None = None,
    pidfile: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    problem = f"did not come up within {timeout:g}s"
    dead_since = None  # a daemon that forks writes its pidfile more than once: dead for 2 s is exited
    while time.monotonic() < deadline:
        if predicate():
            return
        if pidfile is not None and pidfile.exists() and pid_alive(pidfile) is None:
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since >= EXITED_AFTER_S:
                problem = "exited"
                break
        else:
            dead_since = None
        time.sleep(0.2)
    tail = log_tail(logfile) if logfile else ""
    raise ClusterError(f"{what} {problem}{': ' + tail if tail else ''}")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
