"""`stune-admin install` / `uninstall`: place what the package ships, the way config management wants it.

- Idempotent: a second run changes nothing and says so in one line.
- A file an admin edited (its content is neither what stune placed last time nor what it would place now)
  is kept and its diff shown, unless --force.
- Everything placed is listed in a manifest (path, sha256), so `uninstall` removes exactly that: files
  still as placed, and directories it created once they are empty.
- Root's writes go through safeio.write_atomic (exclusive temporary + rename).

This module holds what is placed where (Layout, the roles, the env file, the Slurm lines still needed);
manifest.py holds how one file or directory is placed and recorded.
"""

from __future__ import annotations

import difflib
import grp
import os
import re
import shlex
import socket
import sysconfig
from dataclasses import dataclass

from ..clifilter.render import cli_filter_files
from ..errors import StuneError
from ..hostlist import expand_hostlist
from ..thisnode import uses_node
from . import shipped
from .manifest import Report, load_manifest, make_dirs, place_file, read_or_none, save_manifest, sha256
from .slurmconf import (
    SlurmConf,
    diff_against,
    gpu_partitions,
    gpu_weight_need,
    partition_needs,
    read_key_values,
    requirements,
    with_reason,
)

CONSTRAIN_WHY = "a job opens only the GPUs Slurm gave it (with TaskPlugin=task/cgroup)"
GRES_WHY = "Slurm finds each node's GPUs (or name them: Name=gpu File=/dev/nvidia[0-3])"
ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
LOGIN_SETTINGS = ("STUNE_BIN", "STUNE_PARTITIONS", "SLURM_CONF")  # a login node's env file (plus any --set)


@dataclass
class Layout:
    """Every path install touches. `prefix` relocates them all ("/" on a real node)."""

    prefix: str = "/"
    slurm_conf: str = ""
    prolog_dir: str = ""
    epilog_dir: str = ""

    def p(self, path: str) -> str:
        return os.path.join(self.prefix, path.lstrip("/"))

    def __post_init__(self):
        # Slurm's configuration directory: the hook preamble, the non-glob hooks and the default prolog.d and
        # epilog.d go beside slurm.conf; a slurm.conf outside --prefix (the local cluster's) keeps them under it
        conf = self.slurm_conf
        inside = bool(conf) and os.path.commonpath([self.prefix, os.path.abspath(conf)]) == os.path.abspath(
            self.prefix
        )
        self.slurm_etc = os.path.dirname(os.path.abspath(conf)) if inside else self.p("etc/slurm")
        self.slurm_conf = conf or os.path.join(self.slurm_etc, "slurm.conf")
        self.prolog_dir = self.prolog_dir or os.path.join(self.slurm_etc, "prolog.d")
        self.epilog_dir = self.epilog_dir or os.path.join(self.slurm_etc, "epilog.d")
        self.unit_dir = self.p("etc/systemd/system")
        self.env_file = self.p("etc/default/stune")
        self.profiles = self.p("etc/stune/partitions")
        self.examples = self.p("etc/stune/examples")
        self.state_dir = self.p("var/lib/stune/health")
        self.fairshare_dir = self.p("var/lib/stune/fairshare")  # the accountant's ledger
        self.usage_dir = self.p("var/lib/stune/usage")
        self.spool_dir = self.p("var/spool/stune/usage")
        self.log_dir = self.p("var/log/stune")
        self.manifest = self.p("var/lib/stune/install-manifest.json")

    def hook_paths(self) -> dict[str, str]:
        return {
            "prolog_dir": self.prolog_dir,
            "epilog_dir": self.epilog_dir,
            "health_run": os.path.join(self.slurm_etc, "stune-health-run"),
            "task_prolog": os.path.join(self.slurm_etc, "stune-task-prolog"),
            "epilog_slurmctld": os.path.join(self.slurm_etc, "stune-usage-slurmctld"),
        }


def hook_dir_from(conf: SlurmConf, key: str) -> str | None:
    """The directory of a `Prolog=/dir/*` glob in the live slurm.conf: install puts the hooks there."""
    value = conf.get(key)
    if value and "," not in value and value.endswith("/*") and os.path.isabs(value):
        return value[:-2]
    return None


def detect_roles(conf: SlurmConf) -> tuple[set[str], str]:
    """Node and/or controller, from slurm.conf: a SlurmctldHost (primary or backup) naming this host ->
    controller; a NodeName or NodeHostname naming it (or slurmd installed) -> node. Neither found: an empty
    set and the reason (install asks for --role; doctor checks everything)."""
    host = socket.gethostname().split(".")[0]
    roles = set()
    ctld = [
        s.value.split("(")[0].strip()
        for k in ("slurmctldhost", "controlmachine", "backupcontroller")
        for s in conf.every.get(k, [])
    ]
    if host in ctld:
        roles.add(shipped.CONTROLLER)
    for rec in conf.nodes():
        names = expand_hostlist(rec.get("NodeName", "")) + expand_hostlist(rec.get("NodeHostname", ""))
        if host in names:
            roles.add(shipped.NODE)
    if not roles and os.path.exists("/usr/sbin/slurmd"):
        roles.add(shipped.NODE)
    if not roles:
        where = conf.path if conf.found else f"{conf.path} (not found)"
        return set(), f"{host} is neither a node nor the controller in {where}"
    return roles, f"{host}: {' and '.join(sorted(roles))} (from {conf.path})"


def stune_bin() -> str:
    return sysconfig.get_paths()["scripts"]


def _quote(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value) else shlex.quote(value)


def env_file_text(layout: Layout, settings: dict[str, str]) -> str:
    lines = [
        "# The one environment file every stune hook, the TaskProlog and the units read (Slurm gives hooks",
        "# an empty environment). Written by `stune-admin install` from what it detected; edit freely: a",
        "# later install shows the difference and keeps your edits unless --force. Keep it root-owned, 0644.",
        "# %n in STUNE_SYSFS_ROOT, STUNE_GPU_SNAPSHOT, STUNE_STATE_DIR, STUNE_USAGE_DIR is the node name",
        "# (hardware-less mode: docs/admin.md).",
    ]
    lines += [f"{k}={_quote(v)}" for k, v in settings.items()]
    if "STUNE_HEALTH_PARTITION" not in settings:
        lines.append(
            "# STUNE_HEALTH_PARTITION=hdr   # the profile this node is judged by (default: its first partition)"
        )
    return "\n".join(lines) + "\n"


def env_settings(layout: Layout, extra: dict[str, str]) -> dict[str, str]:
    profiles = (os.environ.get("STUNE_PARTITIONS") if layout.prefix == "/" else None) or layout.profiles
    settings = {
        "STUNE_BIN": stune_bin(),
        "STUNE_PARTITIONS": profiles,
        "SLURM_CONF": layout.slurm_conf,
        "STUNE_STATE_DIR": layout.state_dir,
        "STUNE_USAGE_DIR": layout.usage_dir,
        "STUNE_USAGE_SPOOL": layout.spool_dir,
        "STUNE_USAGE_LOG": os.path.join(layout.log_dir, "usage-store.log"),
    }
    if (
        layout.prefix != "/"
    ):  # the ledger moves too; without --prefix fairshare.yaml's accountant.state_dir rules
        settings["STUNE_FAIRSHARE_STATE_DIR"] = layout.fairshare_dir
    settings.update(extra)
    return settings


def relocate(piece: shipped.Piece, data: bytes, layout: Layout, settings: dict[str, str]) -> bytes:
    """Point a shipped file at this install: the hook preamble's and the env file's paths in the hooks, the bin
    dir in the units."""
    text = data.decode()
    text = text.replace(
        '"${0%/*}/../' + shipped.HOOK_ENV + '"',
        f'"{os.path.join(layout.slurm_etc, os.path.basename(shipped.HOOK_ENV))}"',
    )
    if layout.env_file != "/etc/default/stune":
        text = text.replace(
            "${STUNE_ENV_FILE:-/etc/default/stune}", f"${{STUNE_ENV_FILE:-{layout.env_file}}}"
        )
        text = text.replace("EnvironmentFile=-/etc/default/stune", f"EnvironmentFile=-{layout.env_file}")
    if piece.place == "unit_dir":
        text = text.replace("/opt/stune/bin/", settings["STUNE_BIN"].rstrip("/") + "/")
        text = text.replace("file:///opt/stune/docs/", f"file://{shipped.share_root()}/docs/")
    return text.encode()


def spool_group() -> tuple[int | None, int, str]:
    """The shared spool: root:slurm 2775 where a slurm group exists (docs/fairshare.md), else root 0755."""
    try:
        return grp.getgrnam("slurm").gr_gid, 0o2775, "root:slurm 2775"
    except KeyError:
        return None, 0o755, "root:root 0755 (no slurm group here)"


def install(
    layout: Layout,
    roles: set[str],
    extra_env: dict[str, str],
    dry_run: bool,
    force: bool,
    cli_filter: bool = False,
) -> Report:
    for key, value in extra_env.items():
        if not ENV_KEY.match(key) or "\n" in value:
            raise StuneError(f"--set {key}={value!r}: expected NAME=VALUE with NAME like STUNE_SYSFS_ROOT")
    report = Report(dry_run)
    manifest = load_manifest(layout.manifest)
    root = shipped.share_root()
    settings = env_settings(layout, extra_env)
    login = not roles & {
        shipped.NODE,
        shipped.CONTROLLER,
    }  # a login node: profiles and env file, nothing else
    if login:  # no hook or unit reads state, usage or spool there
        settings = {k: v for k, v in settings.items() if k in LOGIN_SETTINGS or k in extra_env}
    for piece in shipped.PIECES:
        if not piece.needed_by(roles):
            continue
        data = relocate(piece, shipped.read_piece(root, piece), layout, settings)
        place_file(
            report, manifest, os.path.join(getattr(layout, piece.place), piece.name), data, piece.mode, force
        )
    place_file(report, manifest, layout.env_file, env_file_text(layout, settings).encode(), 0o644, force)
    for name in sorted(os.listdir(os.path.join(root, "partitions"))):
        if name.endswith(".yaml"):
            with open(os.path.join(root, "partitions", name), "rb") as fh:
                place_file(report, manifest, os.path.join(layout.examples, name), fh.read(), 0o644, force)
    make_dirs(report, manifest, layout.profiles, 0o755)
    # the directories the env file names (a --set moves them), except per-node ones (%n: the hooks make them)
    dirs = (
        []
        if login
        else [
            settings["STUNE_STATE_DIR"],
            settings["STUNE_USAGE_DIR"],
            os.path.dirname(settings["STUNE_USAGE_LOG"]),
        ]
    )
    if shipped.CONTROLLER in roles and settings.get("STUNE_FAIRSHARE_STATE_DIR"):
        dirs.append(settings["STUNE_FAIRSHARE_STATE_DIR"])
    for d in dirs:
        if not uses_node(d):
            make_dirs(report, manifest, d, 0o755)
    if not login:
        gid, mode, _ = spool_group()
        make_dirs(report, manifest, settings["STUNE_USAGE_SPOOL"], mode, gid)
    if (
        cli_filter
    ):  # --cli-filter: cli_filter.lua and its rendered data beside slurm.conf (slurm_tune/clifilter)
        for path, data in cli_filter_files(layout.slurm_conf, settings["STUNE_PARTITIONS"]).items():
            place_file(report, manifest, path, data, 0o644, force)
    if not dry_run and (report.changed or report.manifest_dirty or not os.path.exists(layout.manifest)):
        manifest["prefix"] = layout.prefix
        make_dirs(report, manifest, os.path.dirname(layout.manifest), 0o755)
        save_manifest(layout.manifest, manifest)
    return report


def slurm_diffs(layout: Layout, conf: SlurmConf, role: str) -> str:
    """The slurm.conf / cgroup.conf / gres.conf lines stune needs, as diffs against the live files."""
    out = []
    needs = requirements(conf, layout.hook_paths(), role) + partition_needs(conf, gpu_partitions(conf))
    if conf.found:
        out.append(diff_against(conf.path, conf.text, needs))
    else:
        missing = [with_reason(n.line, n.why) for n in needs if not n.ok]
        weight = gpu_weight_need("...", "")  # no slurm.conf: no partition known, so the line for each GPU one
        missing.append(with_reason(f"PartitionName=... {weight.line}", weight.why))
        out.append(
            f"# {conf.path} not found; stune needs these lines in slurm.conf:\n" + "\n".join(missing) + "\n"
        )
    etc = os.path.dirname(conf.path)
    cgroup = os.path.join(etc, "cgroup.conf")
    values = read_key_values(cgroup)
    if (values or {}).get("constraindevices", "").lower() != "yes":
        text = (read_or_none(cgroup) or b"").decode(errors="replace")
        line = with_reason("ConstrainDevices=yes", CONSTRAIN_WHY)
        new = (
            re.sub(r"(?im)^\s*ConstrainDevices\s*=.*$", line, text)
            if re.search(r"(?im)^\s*ConstrainDevices\s*=", text)
            else text + ("" if text.endswith("\n") or not text else "\n") + line + "\n"
        )
        out.append(
            "".join(
                difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), cgroup, cgroup + " (with stune)"
                )
            )
        )
    gres = os.path.join(etc, "gres.conf")
    text = (read_or_none(gres) or b"").decode(errors="replace")
    if not re.search(r"(?im)^\s*(AutoDetect\s*=\s*nvml|.*Name\s*=\s*gpu)", text):
        line = with_reason("AutoDetect=nvml", GRES_WHY)
        out.append(
            "".join(
                difflib.unified_diff(
                    text.splitlines(True), (text + line + "\n").splitlines(True), gres, gres + " (with stune)"
                )
            )
        )
    return "".join(s for s in out if s)


def uninstall(layout: Layout, dry_run: bool, force: bool) -> Report:
    report = Report(dry_run)
    manifest = load_manifest(layout.manifest)
    if not os.path.exists(layout.manifest):
        report.say(f"nothing to remove: no install manifest at {layout.manifest}")
        return report
    for path, entry in sorted(manifest["files"].items()):
        report.checked += 1
        current = read_or_none(path)
        if current is None:
            continue
        if sha256(current) != entry.get("sha256") and not force:
            report.kept.append(path)
            report.say(f"kept (edited since install; --force removes it): {path}")
            continue
        report.changed.append(path)
        report.say(f"{'would remove' if dry_run else 'removed'}: {path}")
        if not dry_run:
            os.unlink(path)
    if not dry_run and not report.kept:
        os.unlink(layout.manifest)
    kept_dirs = []
    for d in sorted(manifest["dirs"], key=len, reverse=True):
        try:
            if dry_run:
                if os.path.isdir(d) and not os.listdir(d):
                    report.say(f"would remove: {d}/")
                continue
            os.rmdir(d)
            report.changed.append(d)
            report.say(f"removed: {d}/")
        except FileNotFoundError:
            pass
        except OSError:
            kept_dirs.append(d)
            report.say(f"left in place (holds files stune did not place: data or the admin's): {d}/")
    if not dry_run and report.kept:
        manifest["files"] = {p: e for p, e in manifest["files"].items() if p in report.kept}
        manifest["dirs"] = kept_dirs
        save_manifest(layout.manifest, manifest)
    return report
