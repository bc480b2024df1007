"""The dev cluster's shape and places: its nodes and their fake GPUs, which Slurm runs it (SlurmInstall), and
where each daemon's files and ports are (Layout, from one state directory and one port base)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from slurm_tune.errors import StuneError


def log(msg: str) -> None:
    """The dev cluster's progress line, on stderr."""
    print(f"devcluster: {msg}", file=sys.stderr, flush=True)


NODES = ("n1", "n2", "n3")
GPUS_PER_NODE = 4
# The Ascend partition's NPUs: gres/npu over fake /dev/davinci0-3 on every node, beside the 4 GPUs (a job of
# the ascend partition asks --gres=npu:N). The davinci driver's major is assigned at load time; 236 is common.
NPUS_PER_NODE = 4
DAVINCI_MAJOR = 236
CPUS_PER_NODE = 8
MEMORY_MB = 16000
NVIDIA_MAJOR = 195
CLUSTER_NAME = "stune"
# Unix users with Slurm associations, for tests that need more than root (fair-share, permissions).
TEST_ACCOUNTS = {"physics": ["stune-alice"], "biology": ["stune-bob"]}
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
DEFAULT_SERIES = "22.05"
BUILT_SERIES = {"26.05": "26.05.5", "24.11": "24.11.5"}  # series -> the release scripts/build-slurm.sh builds
SERIES_FILE = "slurm-series"


class ClusterError(StuneError):
    """The local development cluster could not be brought up or down."""


@dataclass(frozen=True)
class SlurmInstall:
    """Which Slurm runs the cluster: Debian's packages (prefix None: commands from PATH, /usr/sbin) or a
    build under `prefix` (its bin/ and sbin/)."""

    series: str
    prefix: Path | None = None

    @classmethod
    def choose(cls, series: str | None = None) -> SlurmInstall:
        series = series or os.environ.get("STUNE_SLURM") or DEFAULT_SERIES
        if series == DEFAULT_SERIES:
            return cls(series)
        if series not in BUILT_SERIES:
            raise ClusterError(
                f"Slurm {series} is not one the dev cluster runs; choose "
                f"{', '.join([DEFAULT_SERIES, *BUILT_SERIES])}"
            )
        default = f"/var/cache/stune/slurm-{BUILT_SERIES[series]}"
        return cls(series, Path(os.environ.get("STUNE_SLURM_PREFIX") or default))

    @property
    def bin_dir(self) -> str | None:
        """Where the client commands are (None: from PATH)."""
        return str(self.prefix / "bin") if self.prefix else None

    def daemon(self, name: str) -> str:
        return str(self.prefix / "sbin" / name) if self.prefix else name

    @property
    def plugin_dir(self) -> str | None:
        """A built Slurm's plugins (slurm.conf's PluginDir); None: the packages' own."""
        return str(self.prefix / "lib" / "slurm") if self.prefix else None

    def slurmd_argv(self, node: str, conf: Path) -> list[str]:
        """slurmd for one node of the cluster; a built Slurm's slurmd is told where its own slurmstepd is
        (-d: Debian's binaries look in /usr/sbin, where Debian 12's 22.05 one is)."""
        argv = [self.daemon("slurmd"), "-N", node, "-f", str(conf)]
        return [*argv, "-d", self.daemon("slurmstepd")] if self.prefix else argv

    @property
    def built(self) -> bool:
        return self.prefix is None or (self.prefix / ".stune-built").exists()

    def ensure(self, install: bool) -> None:
        """A built series must be there; with install, build it (scripts/build-slurm.sh, minutes)."""
        if self.built:
            return
        script = REPO / "scripts" / "build-slurm.sh"
        if not install:
            raise ClusterError(f"Slurm {self.series} is not built in {self.prefix}: run {script}")
        log(f"building Slurm {self.series} into {self.prefix} (minutes)")
        proc = subprocess.run(
            ["bash", str(script), self.series],
            env=dict(os.environ, STUNE_SLURM_PREFIX=str(self.prefix)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0 or not self.built:
            why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise ClusterError(f"Slurm {self.series} could not be built: {why}")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose PATH finds this Slurm's commands first (daemons pass it to prologs)."""
        env = dict(os.environ if base is None else base)
        if self.prefix:
            env["PATH"] = f"{self.prefix / 'bin'}:{self.prefix / 'sbin'}:{env.get('PATH', '/usr/bin:/bin')}"
        return env


@dataclass(frozen=True)
class Layout:
    """Where everything lives, derived from one state directory and one port base."""

    root: Path
    port_base: int

    @classmethod
    def from_env(cls) -> Layout:
        root = Path(os.environ.get("STUNE_CLUSTER_DIR", "/var/tmp/stune-cluster"))
        return cls(root=root, port_base=int(os.environ.get("STUNE_CLUSTER_PORT_BASE", "26800")))

    etc = property(lambda s: s.root / "etc")
    run = property(lambda s: s.root / "run")
    log = property(lambda s: s.root / "log")
    spool = property(lambda s: s.root / "spool")
    dev = property(lambda s: s.root / "dev")
    mysql_data = property(lambda s: s.root / "mysql")
    slurm_conf = property(lambda s: s.etc / "slurm.conf")
    extra_conf = property(lambda s: s.etc / "slurm.extra.conf")
    fragments = property(lambda s: s.etc / "conf.d")
    prolog_d = property(lambda s: s.root / "prolog.d")
    epilog_d = property(lambda s: s.root / "epilog.d")
    munge_socket = property(lambda s: s.run / "munge" / "munge.socket.2")
    mysql_socket = property(lambda s: s.run / "mysqld.sock")
    ctld_port = property(lambda s: s.port_base + 17)
    dbd_port = property(lambda s: s.port_base + 19)
    mysql_port = property(lambda s: s.port_base + 6)

    def node_port(self, index: int) -> int:
        return self.port_base + 21 + index

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def node_dir(self, node: str) -> Path:
        """A per-node directory standing in for that node's local disk: fixture sysfs trees, stune's
        node-local state, the cache tier. Hooks find it from $SLURMD_NODENAME."""
        return self.root / "nodes" / node

    def accel_tools(self, node: str) -> Path:
        """The node's Ascend tools ($STUNE_ACCEL_TOOLS, nodes/%n/accel-tools): stand-in `npu-smi` and
        `hccn_tool` that print the real formats from `state.json` beside them."""
        return self.node_dir(node) / "accel-tools"

    def gpu_replay(self, node: str) -> Path:
        """The node's GPU snapshot ($STUNE_GPU_SNAPSHOT, nodes/%n/gpus.json): tests write it; an AMD node's
        devices are its `accel` section."""
        return self.node_dir(node) / "gpus.json"
