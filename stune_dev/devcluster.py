"""A real, local Slurm cluster for the demo and the tests: munge, MariaDB, slurmdbd, slurmctld and slurmd n1..n3.

Everything binds to loopback and keeps its state under one directory (STUNE_CLUSTER_DIR, default
/var/tmp/stune-cluster). `up` is idempotent. Debian's packages are installed when missing, by
`scripts/setup.sh --packages`: stune-devcluster is a developer's tool, run from a checkout (`python -m stune_dev`).
The cluster's shape and places are layout.py, what it needs of the machine host.py, its config files
conffiles.py, starting and stopping its daemons daemons.py.

Three Slurm series: 22.05 (Debian 12's packages, the default), 26.05 (Debian sid's packages, unpacked by
scripts/build-slurm.sh into /var/cache/stune/slurm-26.05.5) and 24.11 (Debian 13's source, compiled by
scripts/build-slurm.sh into /var/cache/stune/slurm-24.11.5); STUNE_SLURM_PREFIX moves a built one. Choose
with `--slurm 26.05` or STUNE_SLURM=26.05. A state directory belongs to the series that made it.

    stune-devcluster [--slurm 22.05|26.05|24.11] up | down | status | env
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from slurm_tune.cli import options
from slurm_tune.errors import EXIT_ATTENTION, EXIT_ERROR, EXIT_OK, SlurmError, StuneError
from slurm_tune.output import print_json, table
from slurm_tune.slurm import Slurm

from .accel import AccelNodes
from .conffiles import ConfFiles
from .daemons import Daemons
from .host import (
    ensure_node_names_resolve,
    ensure_packages,
    ensure_unix_users,
    pid_alive,
    wait_for,
)
from .layout import (
    BUILT_SERIES,
    CLUSTER_NAME,
    DEFAULT_SERIES,
    GPUS_PER_NODE,
    NODES,
    NVIDIA_MAJOR,
    REPO,
    SERIES_FILE,
    TEST_ACCOUNTS,
    ClusterError,
    Layout,
    SlurmInstall,
    log,
)

RECONFIGURE = ["scontrol", "reconfigure"]  # the dev cluster's own; production stune never reconfigures


class DevCluster(ConfFiles, Daemons, AccelNodes):
    def __init__(
        self,
        layout: Layout | None = None,
        profiles_dir: Path | None = None,
        install: SlurmInstall | None = None,
    ):
        self.layout = layout or Layout.from_env()
        self.profiles_dir = profiles_dir or Path(os.environ.get("STUNE_PARTITIONS", REPO / "partitions"))
        self.install = install or SlurmInstall.choose()
        self.slurm = Slurm(conf=str(self.layout.slurm_conf), timeout=20, bin_dir=self.install.bin_dir)

    def slurm_env(self) -> dict[str, str]:
        """What a shell, a test or a hook's environment file needs to reach this cluster: SLURM_CONF, and
        for a built Slurm its client directory (STUNE_SLURM_BIN, read by Slurm.from_env())."""
        env = {"SLURM_CONF": str(self.layout.slurm_conf)}
        if self.install.bin_dir:
            env["STUNE_SLURM_BIN"] = self.install.bin_dir
        return env

    def check_series(self) -> None:
        """A state directory (slurmctld state, accounting DB) belongs to the Slurm series that made it:
        22.05 cannot read 24.11's, and an upgrade in place is not what a test wants."""
        marker = self.layout.root / SERIES_FILE
        try:
            made_by = marker.read_text().strip()
        except FileNotFoundError:
            if (self.layout.spool / "ctld").exists():
                made_by = DEFAULT_SERIES  # made before the series were recorded
            else:
                self.layout.root.mkdir(parents=True, exist_ok=True)
                marker.write_text(self.install.series + "\n")
                return
        if made_by != self.install.series:
            raise ClusterError(
                f"{self.layout.root} holds a Slurm {made_by} cluster, not {self.install.series}: "
                f"use another STUNE_CLUSTER_DIR (and port base) or `stune-devcluster destroy` it"
            )

    def write_config(self) -> bool:
        """Write every config file; True when slurm.conf or gres.conf changed."""
        L = self.layout
        for d in (
            L.etc,
            L.run,
            L.log,
            L.spool / "ctld",
            L.dev,
            L.run / "munge",
            L.fragments,
            L.prolog_d,
            L.epilog_d,
            *(L.node_dir(n) for n in NODES),
            *(L.spool / f"slurmd-{n}" for n in NODES),
        ):
            d.mkdir(parents=True, exist_ok=True)
        for d in (L.root, L.log):
            d.chmod(0o755)
        changed = False
        for path, text in (
            (L.slurm_conf, self.render_slurm_conf()),
            (L.etc / "gres.conf", self.render_gres_conf()),
        ):
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                changed = True
        dbd = L.etc / "slurmdbd.conf"
        dbd.write_text(self.render_slurmdbd_conf())
        dbd.chmod(0o600)  # slurmdbd refuses a readable config: it holds the DB password
        changed |= self._write_extra_conf()
        for hooks in (L.prolog_d, L.epilog_d):  # slurmd fails a glob that matches nothing
            noop = hooks / "00-devcluster"
            if not noop.exists():
                noop.write_text(
                    "#!/bin/sh\n# Keeps the hook glob non-empty; stune's hooks sort after it.\nexit 0\n"
                )
                noop.chmod(0o755)
        for i in range(GPUS_PER_NODE):
            path = L.dev / f"nvidia{i}"
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
        self.make_npu_devices()
        return changed

    def ensure_associations(self) -> None:
        existing = self.slurm.run(["sacctmgr", "-n", "-P", "show", "assoc", "format=account,user"])
        have = {tuple(line.split("|")) for line in existing.splitlines()}
        for account, users in TEST_ACCOUNTS.items():
            if (account, "") not in have:
                self._sacctmgr(["add", "account", account, f"Cluster={CLUSTER_NAME}", "Fairshare=1"])
            for user in users:
                if (account, user) not in have:
                    self._sacctmgr(["add", "user", user, f"Account={account}", f"Cluster={CLUSTER_NAME}"])

    def wait_nodes_ready(self) -> None:
        def ready() -> bool:
            try:
                out = self.slurm.run(["sinfo", "-h", "-N", "-o", "%N %t"])
            except SlurmError:
                return False
            states = {}
            for line in out.splitlines():
                name, state = line.split()
                states[name] = state
            if any(
                s.startswith(("drain", "drng", "down")) and self._ours_to_fix(n) for n, s in states.items()
            ):
                self.slurm.resume(list(NODES))
            return set(states) == set(NODES) and all(
                s.rstrip("*~#") in ("idle", "mix", "alloc", "drain", "drng") for s in states.values()
            )

        wait_for("slurmd nodes", ready, logfile=self.layout.log / "slurmctld.log")

    def _ours_to_fix(self, node: str) -> bool:
        """Nodes left down by a restart of the cluster (not drained by a test on purpose)."""
        out = self.slurm.run(["scontrol", "show", "node", node])
        return "Reason=Not responding" in out or "Reason=Node unexpectedly rebooted" in out

    def up(self, install: bool = True) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the local cluster needs root (it starts munge, MariaDB and Slurm daemons)")
        if install:
            ensure_packages()
        self.install.ensure(install)
        self.check_series()
        ensure_unix_users()
        ensure_node_names_resolve()
        was_running = pid_alive(self.layout.pidfile("slurmctld")) is not None
        nodes_before = self._node_lines()
        self.drop_broken_fragments()
        changed = self.write_config()
        if was_running and nodes_before != self._node_lines():
            # a node's NodeHostname/address changed (e.g. an upgrade): a reconfigure leaves the slurmds
            # unreachable, so restart the daemons on the new config
            self.down()
            was_running = False
        self.install_accel_tools()
        self.install_stune()
        self.start_munge()
        self.start_mysql()
        self.start_slurmdbd()
        self.register_cluster()
        self.start_slurmctld()
        wait_for("cluster registration", self._cluster_registered, logfile=self.layout.log / "slurmctld.log")
        self.start_slurmd()
        if changed and was_running:  # running daemons take a new slurm.conf (e.g. after a stune upgrade)
            self.slurm.run(RECONFIGURE)
        self.ensure_associations()
        self.wait_nodes_ready()
        log(f"up: {len(NODES)} nodes, Slurm {self.slurm.version()}, state in {self.layout.root}")

    def register_cluster(self) -> None:
        """Add the cluster to slurmdbd before slurmctld first starts. 22.05's slurmctld adds it itself;
        newer ones leave it to the admin and would then run without associations."""
        wait_for("slurmdbd answering", self._dbd_answers, logfile=self.layout.log / "slurmdbd.log")
        out = self.slurm.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"])
        if CLUSTER_NAME not in out.split():
            self._sacctmgr(["add", "cluster", CLUSTER_NAME])

    def _dbd_answers(self) -> bool:
        try:
            self.slurm.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"])
        except SlurmError:
            return False
        return True

    def _node_lines(self) -> list[str]:
        try:
            text = self.layout.slurm_conf.read_text()
        except OSError:
            return []
        return [line for line in text.splitlines() if line.startswith("NodeName=")]

    def _cluster_registered(self) -> bool:
        try:
            out = self.slurm.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster,controlport"])
        except SlurmError:
            return False
        return any(
            line.split("|")[0] == CLUSTER_NAME and line.split("|")[1] not in ("", "0")
            for line in out.splitlines()
        )

    # ---- stune, installed the way a site installs it ------------------------------------------------
    @property
    def site_root(self) -> Path:
        """`stune-admin install --prefix` root: env file, TaskProlog, HealthCheckProgram, units, state dirs."""
        return self.layout.root / "site"

    @property
    def env_file(self) -> Path:
        return self.site_root / "etc" / "default" / "stune"

    def site_settings(self) -> dict[str, str]:
        """The env file's settings beyond what install detects: this cluster's hardware-less mode (per-node
        sysfs trees, GPU snapshots and Ascend stand-in tools under nodes/<node>/, %n being the node name) and
        node-local state."""
        nodes = self.layout.root / "nodes" / "%n"
        return {
            "STUNE_PARTITIONS": str(self.profiles_dir),
            "STUNE_SYSFS_ROOT": f"{nodes}/sysfs",
            "STUNE_GPU_SNAPSHOT": f"{nodes}/gpus.json",
            "STUNE_ACCEL_TOOLS": f"{nodes}/accel-tools",
            "STUNE_STATE_DIR": f"{nodes}/health",
            "STUNE_USAGE_DIR": f"{nodes}/usage",
            # a built Slurm's commands: the hooks' PATH has only Debian's (/usr/bin)
            **({"STUNE_SLURM_BIN": self.install.bin_dir} if self.install.bin_dir else {}),
        }

    def install_stune(self, **settings: str) -> None:
        """`stune-admin install --prefix <root>/site`, exactly as a site runs it: the hooks land in the
        directories slurm.conf's Prolog/Epilog globs name (prolog.d, epilog.d), everything else under site/.
        `settings`: more env file lines (`--set`), e.g. a test's STUNE_FAIRSHARE_CONFIG; run it again without
        them to restore the site. Idempotent; tests may replace a hook through install_hook() and run this
        again to restore it."""
        admin = Path(sys.executable).parent / "stune-admin"
        argv = [
            str(admin),
            "install",
            "--prefix",
            str(self.site_root),
            "--slurm-conf",
            str(self.layout.slurm_conf),
            "--role",
            "all",
            "--force",
            *(f"--set={k}={v}" for k, v in {**self.site_settings(), **settings}.items()),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ClusterError(
                f"stune-admin install failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-400:]}"
            )

    def install_hook(self, kind: str, name: str, script: str | None) -> Path:
        """Drop (script text) or remove (None) an executable in prolog.d or epilog.d. Slurm runs every file
        there, in name order, as root; a non-zero prolog exit drains the node. Takes effect at once."""
        directory = {"prolog": self.layout.prolog_d, "epilog": self.layout.epilog_d}[kind]
        path = directory / name
        if script is None:
            path.unlink(missing_ok=True)
        else:
            from slurm_tune.safeio import write_atomic

            write_atomic(str(path), script, mode=0o755)
        return path

    def reconfigure(self) -> None:
        self.slurm.run(RECONFIGURE)
        self.wait_nodes_ready()

    def _sacctmgr(self, args: list[str]) -> str:
        """An accounting change, without sacctmgr's confirmation prompt (-i). Only the dev cluster changes
        accounting; production stune reads it through the adapter."""
        return self.slurm.run(["sacctmgr", "-i", *args])

    def destroy(self) -> None:
        self.down()
        shutil.rmtree(self.layout.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stune-devcluster", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slurm",
        metavar="SERIES",
        choices=[DEFAULT_SERIES, *BUILT_SERIES],
        help=f"which Slurm runs the cluster (default: $STUNE_SLURM or {DEFAULT_SERIES})",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start (or repair) the local cluster; harmless when already up")
    sub.add_parser("down", help="stop every daemon, keep the state")
    sub.add_parser("destroy", help="stop every daemon and delete the state directory")
    status = sub.add_parser("status", help="which daemons run, and sinfo (exit 3 when a daemon is stopped)")
    options.add(status, "json", help="the daemons, the Slurm version and sinfo's nodes as JSON")
    sub.add_parser("env", help="print `export SLURM_CONF=... STUNE_PARTITIONS=...` for eval in a shell")
    args = parser.parse_args(argv)
    try:
        cluster = DevCluster(install=SlurmInstall.choose(args.slurm))
        if args.cmd == "up":
            cluster.up()
            print(_exports(cluster))
        elif args.cmd == "down":
            cluster.down()
        elif args.cmd == "destroy":
            cluster.destroy()
        elif args.cmd == "env":
            first, *rest = _exports(cluster).splitlines()  # SLURM_CONF first, then a built Slurm's lines
            print("\n".join([first, f"export STUNE_PARTITIONS={cluster.profiles_dir}", *rest]))
        elif args.cmd == "status":
            running = cluster.status()
            version = sinfo = None
            if running["slurmctld"]:
                version = cluster.slurm.version()
                sinfo = cluster.slurm.run(["sinfo", "-N", "-h", "-o", "%N|%P|%t|%G|%E"])
            nodes = [
                dict(zip(("node", "partition", "state", "gres", "reason"), line.split("|", 4)))
                for line in (sinfo or "").splitlines()
                if line.strip()
            ]
            if args.json:
                print_json({"daemons": running, "slurm": version, "nodes": nodes})
            else:
                print(
                    table([(name, "running" if alive else "stopped") for name, alive in running.items()]),
                    end="",
                )
                if version:
                    print(f"Slurm {version}")
                    print(
                        table(
                            (
                                [n.get(k) for k in ("node", "partition", "state", "gres", "reason")]
                                for n in nodes
                            ),
                            ("NODELIST", "PARTITION", "STATE", "GRES", "REASON"),
                        ),
                        end="",
                    )
            return EXIT_OK if all(running.values()) else EXIT_ATTENTION
    except StuneError as exc:
        print(f"stune-devcluster: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _exports(cluster: DevCluster) -> str:
    """`export` lines for a shell: SLURM_CONF, and for a built Slurm its commands first on PATH."""
    lines = [f"export {k}={v}" for k, v in cluster.slurm_env().items()]
    if cluster.install.bin_dir:
        lines.append(f'export PATH={cluster.install.bin_dir}:"$PATH"')
    return "\n".join(lines)
