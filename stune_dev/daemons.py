"""The dev cluster's daemons: munged, MariaDB, slurmdbd, slurmctld and one slurmd per node, each started when
not running and stopped in the reverse order, through their pid files. A part of DevCluster (devcluster.py),
which supplies `layout`, `install` and `reconfigure()`."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .host import pid_alive, port_open, wait_for
from .layout import NODES, START_TIMEOUT_S, ClusterError, Layout, SlurmInstall, log


class Daemons:
    layout: Layout
    install: SlurmInstall
    reconfigure: Callable[[], None]  # DevCluster's: `scontrol reconfigure`, then the nodes ready again

    def start_munge(self) -> None:
        L = self.layout
        pidfile = L.run / "munge" / "munged.pid"
        if pid_alive(pidfile):
            return
        key = L.etc / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        # munged runs as its own user and refuses keys, sockets and logs that others could tamper with.
        munge = pwd.getpwnam("munge")
        (L.log / "munge").mkdir(exist_ok=True)
        for path in (key, L.run / "munge", L.log / "munge"):
            os.chown(path, munge.pw_uid, munge.pw_gid)
            path.chmod(0o400 if path == key else 0o755)
        L.munge_socket.unlink(missing_ok=True)
        proc = subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "munged",
                f"--socket={L.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={pidfile}",
                f"--log-file={L.log}/munge/munged.log",
                f"--seed-file={L.run}/munge/munged.seed",
                "--num-threads=8",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ClusterError(f"munged failed: {proc.stderr.strip()}")
        wait_for("munged", L.munge_socket.exists, logfile=L.log / "munge" / "munged.log")

    def start_mysql(self) -> None:
        L = self.layout
        if pid_alive(L.pidfile("mysqld")):
            return
        if not (L.mysql_data / "mysql").exists():
            proc = subprocess.run(
                [
                    "mariadb-install-db",
                    f"--datadir={L.mysql_data}",
                    "--user=root",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise ClusterError(f"mariadb-install-db failed: {proc.stderr.strip()[-300:]}")
        with open(L.log / "mysqld.log", "ab") as out:
            subprocess.Popen(
                [
                    "mariadbd",
                    "--no-defaults",
                    f"--datadir={L.mysql_data}",
                    "--user=root",
                    f"--socket={L.mysql_socket}",
                    f"--port={L.mysql_port}",
                    "--bind-address=127.0.0.1",
                    f"--pid-file={L.pidfile('mysqld')}",
                    f"--log-error={L.log}/mysqld.log",
                    "--innodb-buffer-pool-size=64M",
                    "--innodb-log-file-size=32M",
                    "--skip-name-resolve",
                ],
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for(
            "mariadb",
            lambda: port_open(L.mysql_port) and L.mysql_socket.exists(),
            logfile=L.log / "mysqld.log",
        )
        sql = (
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'stune';"
            "GRANT ALL ON stune_acct.* TO 'slurm'@'127.0.0.1';"
            "CREATE DATABASE IF NOT EXISTS stune_acct;"
        )
        proc = subprocess.run(
            ["mariadb", f"--socket={L.mysql_socket}", "-uroot", "-e", sql], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise ClusterError(f"mariadb setup failed: {proc.stderr.strip()}")

    def _daemon(self, name: str, argv: list[str], pidfile: Path, ready, logfile: Path) -> None:
        if pid_alive(pidfile):
            return
        pidfile.unlink(missing_ok=True)  # a stale one would read as "exited" before the daemon writes it
        env = self.install.env()
        env["SLURM_CONF"] = str(self.layout.slurm_conf)
        with open(self.layout.log / f"{name}.stdout", "ab") as out:
            proc = subprocess.run(
                argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S
            )
        if proc.returncode != 0:
            tail = " | ".join(
                (self.layout.log / f"{name}.stdout").read_text(errors="replace").strip().splitlines()[-3:]
            )
            raise ClusterError(f"{name} exited {proc.returncode}: {tail}")
        wait_for(name, ready, logfile=logfile, pidfile=pidfile)

    def start_slurmdbd(self) -> None:
        L = self.layout
        self._daemon(
            "slurmdbd",
            [self.install.daemon("slurmdbd")],
            L.pidfile("slurmdbd"),
            lambda: port_open(L.dbd_port),
            L.log / "slurmdbd.log",
        )

    def start_slurmctld(self) -> None:
        L = self.layout
        self._daemon(
            "slurmctld",
            [self.install.daemon("slurmctld"), "-f", str(L.slurm_conf)],
            L.pidfile("slurmctld"),
            lambda: port_open(L.ctld_port),
            L.log / "slurmctld.log",
        )

    def restart_controller(self) -> None:
        """Stop slurmctld (it saves its state on SIGTERM) and start it again, for settings that slurmctld
        reads only at start, such as EpilogSlurmctld in 22.05; then reconfigure the slurmds."""
        L = self.layout
        pid = pid_alive(L.pidfile("slurmctld"))
        if pid:
            os.kill(pid, signal.SIGTERM)
            # gone, and its port free: a new slurmctld would otherwise exit on "address in use"
            wait_for(
                "slurmctld to stop", lambda: not os.path.exists(f"/proc/{pid}") and not port_open(L.ctld_port)
            )
        self.start_slurmctld()
        self.reconfigure()

    def start_slurmd(self) -> None:
        L = self.layout
        for i, node in enumerate(NODES):
            self._daemon(
                f"slurmd-{node}",
                self.install.slurmd_argv(node, L.slurm_conf),
                L.pidfile(f"slurmd-{node}"),
                lambda i=i: port_open(L.node_port(i)),
                L.log / f"slurmd-{node}.log",
            )

    def restart_slurmd(self, node: str, rebooted: bool = False) -> None:
        """Stop one node's slurmd and start it again; `rebooted`: with -b, so slurmctld takes the node as
        just booted (stune_dev/rebootstandin.py, the stand-in RebootProgram)."""
        L = self.layout
        pidfile = L.pidfile(f"slurmd-{node}")
        pid = pid_alive(pidfile)
        if pid:
            os.kill(pid, signal.SIGTERM)
            wait_for(f"slurmd-{node} to stop", lambda: pid_alive(pidfile) != pid)
        index = NODES.index(node)
        argv = self.install.slurmd_argv(node, L.slurm_conf) + (["-b"] if rebooted else [])
        self._daemon(
            f"slurmd-{node}",
            argv,
            pidfile,
            lambda: port_open(L.node_port(index)),
            L.log / f"slurmd-{node}.log",
        )

    def pidfiles(self) -> dict[str, Path]:
        """Each daemon's pidfile, in start order (down() stops them in the reverse order)."""
        L = self.layout
        daemons = {
            "munged": L.run / "munge" / "munged.pid",
            "mariadb": L.pidfile("mysqld"),
            "slurmdbd": L.pidfile("slurmdbd"),
            "slurmctld": L.pidfile("slurmctld"),
        }
        daemons.update({f"slurmd-{n}": L.pidfile(f"slurmd-{n}") for n in NODES})
        return daemons

    def down(self) -> None:
        for pidfile in reversed(self.pidfiles().values()):
            pid = pid_alive(pidfile)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and pid_alive(pidfile) == pid:
                time.sleep(0.1)
            if pid_alive(pidfile) == pid:
                os.kill(pid, signal.SIGKILL)
        log("down")

    def status(self) -> dict[str, bool]:
        return {name: pid_alive(p) is not None for name, p in self.pidfiles().items()}
