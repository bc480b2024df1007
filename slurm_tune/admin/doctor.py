"""`stune-admin doctor`: check a live cluster against everything stune relies on; one finding per line.

Every Slurm call goes through the adapter with a timeout, so doctor never hangs on a dead controller.
Node facts (GPU model, driver, CUDA, HCA model and firmware, kernel; the AMD and Ascend version matrix)
come from what stune records: a capture per node (`stune-health capture -o DIR/<node>.json`, then
`--facts DIR`), or, in hardware-less mode, the node's sysfs tree and GPU snapshot named with %n in the env
file. A missing fact is said, never
guessed. Doctor's checks of the node facts and the version matrix are doctor_nodes.py's (AMD and Ascend:
doctor_accel.py's, gres.conf doctor_gres.py's), those of the usage pipeline's daemons doctor_daemons.py's.
"""

from __future__ import annotations

import glob as globmod
import os
import shlex
import socket
import sys
from dataclasses import asdict

from .. import trust
from ..accelspec import NVIDIA, gres_name
from ..errors import StuneError
from ..output import json_text
from ..profiles import validate_directory
from ..slurm.tres import gres_gpus
from ..stage.errors import TierUnavailable
from ..stage.tier import Tier, TierConfig
from ..thisnode import uses_node
from . import shipped
from .doctor_daemons import DaemonChecks
from .doctor_drift import DriftChecks
from .doctor_gres import gres_count
from .doctor_nodes import NodeChecks
from .findings import ERROR, OK, WARNING, Finding
from .slurmconf import SlurmConf, gpu_partitions, partition_needs, read_key_values, requirements

SLURM_TIMEOUT_S = 10.0


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines as sh would see them (quotes removed); comments and other lines ignored."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            key = key.replace("export ", "").strip()
            try:
                words = shlex.split(value, comments=True)
            except ValueError:
                words = [value]
            out[key] = words[0] if words else ""
    return out


class Doctor(NodeChecks, DaemonChecks, DriftChecks):
    def __init__(self, env_file: str, layout, facts_dir: str | None, slurm=None):
        self.env_file, self.layout, self.facts_dir = env_file, layout, facts_dir
        self.findings: list[Finding] = []
        self.slurm = slurm
        self.env: dict[str, str] = {}
        self.matrix: dict[str, dict[str, str]] = {}
        self.snapshots: dict[str, dict | None] = {}
        self.drift: dict[str, dict] = {}
        self.drift_sysctls: list[str] = []
        self.node_profiles: dict = {}

    def add(self, severity, subject, message, fix=""):
        self.findings.append(Finding(severity, subject, message, fix))

    # ---- files ----------------------------------------------------------------------------------------
    def trusted(self, path: str, what: str, executable: bool = False) -> bool:
        if not os.path.lexists(path):
            self.add(ERROR, what, f"{path} is missing", "run `stune-admin install`")
            return False
        problem = trust.untrusted_reason(path, uid=0)
        if problem:
            self.add(
                ERROR,
                what,
                f"{path} {problem}; root will not trust it",
                f"chown root:root {path} && chmod go-w {path}",
            )
            return False
        if executable and not os.stat(path).st_mode & 0o111:
            self.add(ERROR, what, f"{path} is not executable (Slurm skips or fails it)", f"chmod 0755 {path}")
            return False
        return True

    def check_env_file(self) -> None:
        if not self.trusted(self.env_file, "env file"):
            return
        try:
            self.env = read_env_file(self.env_file)
        except OSError as exc:
            self.add(ERROR, "env file", f"{self.env_file}: cannot read: {exc.strerror}")
            return
        self.add(OK, "env file", f"{self.env_file} (root-owned, not writable by others)")
        fairshare = self.env.get("STUNE_FAIRSHARE_CONFIG", "/etc/stune/fairshare.yaml")
        if os.path.exists(fairshare) and self.trusted(fairshare, "fairshare config"):  # the epilogs read it
            self.add(OK, "fairshare config", fairshare)
        bin_dir = self.env.get("STUNE_BIN", "/opt/stune/bin")
        for tool in (
            "stune-health",
            "stune-task-prolog",
            "stune-gpu-sampler",
            "stune-stage",
            "stune-fairshare",
        ):
            path = os.path.join(bin_dir, tool)
            if not os.path.exists(path):
                self.add(
                    ERROR,
                    "STUNE_BIN",
                    f"{path} is missing (the hooks find stune through STUNE_BIN)",
                    f"set STUNE_BIN in {self.env_file} to the venv's bin",
                )
                break
        else:
            if self.trusted(
                os.path.join(bin_dir, "stune-health"), "STUNE_BIN"
            ):  # root runs it from every hook
                self.add(OK, "STUNE_BIN", bin_dir)

    def check_python_start(self, site_dirs: list[str] | None = None) -> None:
        """What every start of a stune command pays before stune runs: a `.pth` file in its environment runs
        at each start. setuptools' distutils-precedence.pth imports _distutils_hack, ~0.3 ms (~0.05x of a bare
        interpreter start) on every submission and TaskProlog; stune needs no setuptools to run."""
        if site_dirs is None:  # the environment this stune runs from (the venv of STUNE_BIN, normally)
            site_dirs = [d for d in sys.path if d.endswith(("site-packages", "dist-packages"))]
        for directory in site_dirs:
            pth = os.path.join(directory, "distutils-precedence.pth")
            if os.path.exists(pth):
                self.add(
                    WARNING,
                    "python start",
                    f"{pth} (setuptools) runs at every start of every stune "
                    "command, ~0.05x of an interpreter start (docs/speed.md)",
                    f"{sys.executable} -m pip uninstall setuptools, unless something else in this "
                    "environment needs it (stune does not)",
                )
                return
        self.add(OK, "python start", "no setuptools .pth in stune's environment")

    def check_spool(self) -> None:
        """The shared usage spool: nodes write job summaries, the EpilogSlurmctld merges them as root. Users
        must not be able to plant records there (docs/fairshare.md: root:slurm 2775)."""
        spool = self.env.get("STUNE_USAGE_SPOOL", "/var/spool/stune/usage")
        try:
            st = os.stat(spool)
        except OSError:
            self.add(
                WARNING,
                "usage spool",
                f"{spool} is missing (job GPU usage is not collected)",
                "stune-admin install creates it; on a shared filesystem create it once",
            )
            return
        if st.st_mode & 0o002:
            self.add(
                ERROR,
                "usage spool",
                f"{spool} is writable by others (mode {st.st_mode & 0o7777:04o}): "
                "users could forge usage records",
                f"chmod o-w {spool} (root:slurm 2775)",
            )
        else:
            self.add(OK, "usage spool", f"{spool} ({st.st_mode & 0o7777:04o})")

    def check_hooks(self, roles: set[str]) -> None:
        for piece in shipped.PIECES:
            if not piece.needed_by(roles) or piece.place == "unit_dir":
                continue
            path = os.path.join(getattr(self.layout, piece.place), piece.name)
            if self.trusted(path, piece.what, executable=bool(piece.mode & 0o111)):
                self.add(OK, piece.what, path)

    # ---- slurm.conf -----------------------------------------------------------------------------------
    def check_slurm_conf(self, conf: SlurmConf, roles: set[str], gpu_partitions: list[str]) -> None:
        for problem in conf.problems:
            self.add(ERROR, "slurm.conf", problem)
        if not conf.found:
            return
        role = "all" if len(roles) > 1 else next(iter(roles))
        for need in requirements(conf, self.layout.hook_paths(), role) + partition_needs(
            conf, gpu_partitions
        ):
            if need.ok:
                self.add(OK, need.key, need.have)
            else:
                self.add(
                    need.severity,
                    need.key,
                    f"{need.have} at {conf.where(need.key.split()[0])}: {need.why}",
                    need.line,
                )
        self.check_other_scripts(conf)
        cgroup = os.path.join(os.path.dirname(conf.path), "cgroup.conf")
        values = read_key_values(cgroup)
        if values is None or values.get("constraindevices", "").lower() != "yes":
            self.add(
                ERROR,
                "cgroup.conf ConstrainDevices",
                f"{'missing' if values is None else values.get('constraindevices', '(not set)')} in {cgroup}: "
                "a job can open GPUs it was not given",
                "ConstrainDevices=yes in cgroup.conf",
            )
        else:
            self.add(OK, "cgroup.conf ConstrainDevices", "yes")

    def check_other_scripts(self, conf: SlurmConf) -> None:
        """Every other script slurm.conf makes root run beside stune's (a site prolog in the same glob): one
        that anyone but root can write is root's code for whoever wrote it."""
        ours = {os.path.join(getattr(self.layout, p.place), p.name) for p in shipped.PIECES}
        for key in (
            "Prolog",
            "Epilog",
            "HealthCheckProgram",
            "TaskProlog",
            "EpilogSlurmctld",
            "PrologSlurmctld",
        ):
            for pattern in filter(None, (v.strip() for v in conf.get(key).split(","))):
                for path in sorted(globmod.glob(pattern)):
                    if path not in ours and os.path.isfile(path):
                        self.trusted(path, f"{key} script")

    # ---- profiles and the cluster ----------------------------------------------------------------------
    def load_profiles(self):
        directory = self.env.get("STUNE_PARTITIONS", "/etc/stune/partitions")
        if not self.trusted(directory, "profiles"):
            return {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".yaml"):
                self.trusted(os.path.join(directory, name), "profiles")
        try:
            profiles = validate_directory(directory)
        except StuneError as exc:
            self.add(ERROR, "profiles", str(exc), "stune-admin check-profiles")
            return {}
        if not profiles:
            self.add(
                ERROR,
                "profiles",
                f"no profile in {directory}",
                f"copy one of {self.layout.examples}/*.yaml there and set `partition:`",
            )
        return profiles

    def check_cluster(self, profiles) -> list:
        try:
            partitions = {p.name: p for p in self.slurm.partitions()}
            nodes = self.slurm.nodes()
        except StuneError as exc:
            self.add(ERROR, "slurm", f"cannot ask Slurm: {exc}", "is slurmctld up and SLURM_CONF right?")
            return []
        by_name = {n.name: n for n in nodes}
        for name, profile in sorted(profiles.items()):
            if name not in partitions:
                self.add(
                    ERROR,
                    f"profile {name}",
                    f"names partition {name}, which Slurm does not have "
                    f"(partitions: {', '.join(sorted(partitions)) or 'none'})",
                    f"fix `partition:` in {profile.source}",
                )
                continue
            want = profile.gpu.count
            if not want:  # the schema's "0 skips GPU checks": nothing to compare
                self.add(OK, f"profile {name}", "partition exists; gpu.count 0: GPU checks skipped")
                continue
            gres = gres_name(profile)  # gpu, or npu on Ascend (gpu.gres)
            what = "GPU(s)" if gres == "gpu" else f"{gres} device(s)"
            bad = []
            for node in (n for n in nodes if name in n.partitions):
                have = gres_gpus(node.gres) if gres == "gpu" else gres_count(node.gres, gres)
                if have != want:
                    bad.append(f"{node.name} has {have}")
            if bad:
                self.add(
                    ERROR,
                    f"profile {name}",
                    f"gpu.count is {want} but {', '.join(bad)} {what} in GRES",
                    f"fix gpu.count in {profile.source} or the nodes' Gres={gres}:N in slurm.conf",
                )
            else:
                self.add(OK, f"profile {name}", f"partition exists; GRES {gres} count {want} on every node")
        return [by_name[n] for n in sorted(by_name)]

    def check_cache_tiers(self, profiles, nodes) -> None:
        """The cache tier's per-node set-up (`stune-stage init`, stune-stage-init.service at boot), per node of
        each partition whose profile sets cache.path, wherever this host can see that node's tier: a %n path
        (the nodes share this machine) or this host's own. Without it jobs read from their sources."""
        here = socket.gethostname().split(".")[0]
        for name, profile in sorted(profiles.items()):
            if not profile.cache.path:
                continue
            members = [n.name for n in nodes if name in n.partitions]
            seen = [n for n in members if uses_node(profile.cache.path) or n == here]
            bad, good = [], []
            for node in seen:
                try:
                    with Tier(TierConfig.from_profile(profile, node)) as tier:
                        os.close(tier.ledger_fd())
                    good.append(node)
                except TierUnavailable as exc:
                    bad.append(f"{node} ({exc})")
            if bad:
                self.add(
                    WARNING,
                    f"cache tier {name}",
                    f"not set up on {', '.join(bad)}: jobs there read from their sources",
                    "`stune-stage init` as root on those nodes, at every boot: systemctl "
                    "enable --now stune-stage-init (stune-admin install --enable does it)",
                )
            if good:
                self.add(OK, f"cache tier {name}", f"set up on {', '.join(good)}")
            if len(seen) < len(members):
                self.add(
                    OK,
                    f"cache tier {name}",
                    f"node-local on {len(members) - len(seen)} other node(s), not "
                    "visible here: stune-stage-init.service sets it up at boot; `stune-stage status` there",
                )


def run(
    env_file: str, layout, roles: set[str], facts_dir: str | None, slurm, conf_given: bool = False
) -> Doctor:
    """`conf_given`: layout.slurm_conf is the file to judge; otherwise the env file's SLURM_CONF is."""
    doc = Doctor(env_file, layout, facts_dir, slurm)
    doc.check_env_file()
    doc.check_python_start()
    doc.check_hooks(roles)
    if doc.env:
        doc.check_spool()
    profiles = doc.load_profiles()
    conf = SlurmConf(layout.slurm_conf if conf_given else doc.env.get("SLURM_CONF") or layout.slurm_conf)
    with_gpus = {n for n, p in profiles.items() if (p.gpu.count or 0) > 0} | set(gpu_partitions(conf))
    doc.check_slurm_conf(conf, roles, sorted(with_gpus))
    nodes = doc.check_cluster(profiles)
    doc.drift_sysctls = sorted({k for p in profiles.values() for k in p.drift.sysctls})
    doc.node_profiles = {
        n.name: p
        for name, p in sorted(profiles.items())
        if p.accelerator != NVIDIA
        for n in nodes
        if name in n.partitions
    }
    if nodes:
        doc.check_nodes(nodes)
        doc.check_accel(profiles, nodes, conf)
        doc.check_drift(profiles, nodes)
        doc.check_cache_tiers(profiles, nodes)
        doc.check_sampler(nodes)
    if shipped.CONTROLLER in roles:
        doc.check_accountant()
    return doc


def as_json(doc: Doctor) -> str:
    return json_text(
        {
            "findings": [asdict(f) for f in doc.findings],
            "matrix": doc.matrix,
            "drift": doc.drift,
            "errors": sum(f.severity == ERROR for f in doc.findings),
            "warnings": sum(f.severity == WARNING for f in doc.findings),
        }
    )
