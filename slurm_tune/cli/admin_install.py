"""`stune-admin install` and `uninstall`: where stune goes on this host (the layout: --prefix, slurm.conf and
the hook directories it names; the roles: node, controller, login, from --role or detected), what each
prints, the slurm.conf lines still missing, the cli_filter line, and --enable's systemd units. doctor
(cli/admin.py) judges the same layout and roles.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..admin.install import Layout, detect_roles, hook_dir_from, install, slurm_diffs, uninstall
from ..admin.manifest import load_manifest
from ..admin.shipped import CONTROLLER, LOGIN, NODE
from ..admin.slurmconf import SlurmConf
from ..clifilter.render import LUA_FILE, SLURM_CONF_LINE, enables_filter
from ..errors import StuneError
from ..progs import ADMIN as PROG
from .common import EXIT_ATTENTION, EXIT_OK


def host_layout(args):
    """This host's Layout (--prefix; slurm.conf from --slurm-conf, else $SLURM_CONF without a prefix, else the
    first of the packages' places that exists; the hook directories it names) and its SlurmConf."""
    prefix = os.path.abspath(args.prefix)
    conf_path = args.slurm_conf or (os.environ.get("SLURM_CONF") if prefix == "/" else None)
    if not conf_path:  # Debian/RHEL packages, older Debian, a source build's default sysconfdir
        candidates = [
            os.path.join(prefix, p)
            for p in ("etc/slurm/slurm.conf", "etc/slurm-llnl/slurm.conf", "usr/local/etc/slurm.conf")
        ]
        conf_path = next((c for c in candidates if os.path.exists(c)), candidates[0])
    conf = SlurmConf(conf_path)
    layout = Layout(
        prefix=prefix,
        slurm_conf=conf_path,
        prolog_dir=hook_dir_from(conf, "Prolog") or "",
        epilog_dir=hook_dir_from(conf, "Epilog") or "",
    )
    return layout, conf


def host_roles(args, conf, fallback_all: bool = False) -> tuple[set[str], str]:
    """--role, else detected; when nothing is detected, install asks (a login node needs no install) and
    doctor (fallback_all) checks both parts."""
    if args.role == "node":
        return {NODE}, "node part (--role node)"
    if args.role == "controller":
        return {CONTROLLER}, "controller part (--role controller)"
    if args.role == "all":
        return {NODE, CONTROLLER}, "node and controller parts (--role all)"
    if args.role == LOGIN:
        return {LOGIN}, "login node (--login): the profiles and the env file, nothing else"
    roles, why = detect_roles(conf)
    if roles:
        return roles, why
    if fallback_all:
        return {NODE, CONTROLLER}, f"{why}: checking both parts"
    raise StuneError(f"{why}: pass --role node, controller or all, or --login on a login node")


def run_install(args) -> int:
    if os.geteuid() != 0 and not args.dry_run:
        raise StuneError("install writes root's files: run it as root (or --dry-run)")
    layout, conf = host_layout(args)
    if args.enable and layout.prefix != "/":
        raise StuneError("--enable starts this host's units: only without --prefix")
    roles, why = host_roles(args, conf)
    if args.enable and args.role == "login":
        raise StuneError("--enable: a login node runs no stune unit")
    extra = dict(item.partition("=")[::2] for item in args.set or [])
    report = install(layout, roles, extra, args.dry_run, args.force, cli_filter=args.cli_filter)
    if args.verbose or report.changed or report.kept:
        print(f"{PROG} install: {why}")
    for line in report.out:
        print(line)
    login = args.role == "login"
    if login and (report.changed or args.verbose):
        print(
            f"{PROG} install --login: put the profiles your nodes have into {layout.profiles} (the same files, "
            "or mount one shared directory there): stune-sbatch plans each job by them"
        )
    diffs = "" if login else slurm_diffs(layout, conf, "all" if len(roles) > 1 else next(iter(roles)))
    if diffs and not (report.changed or report.kept or args.verbose):
        print(
            f"{PROG} install: Slurm's config still lacks stune's lines (`{PROG} install -v` shows them as diffs)"
        )
    elif diffs:
        print(
            "\nSlurm needs these lines (then `scontrol reconfigure`; restart slurmctld for EpilogSlurmctld):"
        )
        print(diffs.rstrip("\n"))
    if not report.changed and not report.kept:
        print(f"{PROG} install: nothing changed ({report.checked} files checked under {layout.prefix})")
    elif report.dry_run:
        print(f"{PROG} install --dry-run: nothing was written")
    if args.cli_filter:
        _cli_filter_line(conf)
    if args.enable and not args.dry_run:
        _enable_units(roles)
    elif (
        report.changed
        and not args.dry_run
        and not login
        and (layout.unit_dir.startswith("/etc/") or args.verbose)
    ):
        print(
            "units installed, not enabled: systemctl daemon-reload; enable stune-gpu-sampler and stune-idle-policy.timer on GPU nodes, "
            "stune-stage-init on nodes with a cache tier, stune-fairshare.timer on the accountant host "
            "(or rerun with --enable)"
        )
    return EXIT_ATTENTION if report.kept else EXIT_OK


def _cli_filter_plugins(conf) -> list[str]:
    return [p.strip() for p in conf.get("CliFilterPlugins").split(",") if p.strip()]


def _cli_filter_line(conf) -> None:
    """--cli-filter: the slurm.conf line that turns the filter on, unless slurm.conf already has it."""
    if enables_filter(conf.get("CliFilterPlugins")):
        return
    plugins = _cli_filter_plugins(conf)
    line = SLURM_CONF_LINE if not plugins else f"CliFilterPlugins={','.join([*plugins, 'cli_filter/lua'])}"
    print(
        f"\nsbatch, salloc and srun read cli_filter.lua once {conf.path} says (no restart needed; every "
        f"submission host and node needs the files above):\n{line}"
    )


def _keep_a_cli_filter_in_use(layout, conf, force: bool) -> None:
    """uninstall refuses to remove the cli_filter.lua install placed while slurm.conf still enables the plugin:
    without its script, sbatch, salloc and srun refuse to run at all."""
    lua = os.path.join(os.path.dirname(os.path.abspath(layout.slurm_conf)), LUA_FILE)
    if force or not enables_filter(conf.get("CliFilterPlugins")):
        return
    if lua in load_manifest(layout.manifest)["files"] and os.path.exists(lua):
        raise StuneError(
            f"{conf.where('CliFilterPlugins')} enables cli_filter/lua: take that line out first "
            f"(without {lua}, sbatch, salloc and srun refuse to run); --force removes it anyway"
        )


def _enable_units(roles: set[str]) -> None:
    """--enable: daemon-reload, then enable --now the role's units (the sampler on a node, the accountant's
    timer on the controller). Asked for explicitly: install alone never starts anything."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise StuneError("--enable: systemctl not found (no systemd here); start the units your own way")
    units = (
        ["stune-gpu-sampler.service", "stune-idle-policy.timer", "stune-stage-init.service"]
        if NODE in roles
        else []
    ) + (["stune-fairshare.timer"] if CONTROLLER in roles else [])
    for argv in ([systemctl, "daemon-reload"], [systemctl, "enable", "--now", *units]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise StuneError(f"--enable: {' '.join(argv[1:])} did not finish within 60s") from None
        if proc.returncode != 0:
            raise StuneError(
                f"--enable: systemctl {' '.join(argv[1:])} failed: "
                f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
            )
    print(f"enabled and started: {', '.join(units)}")


def run_uninstall(args) -> int:
    layout, conf = host_layout(args)
    _keep_a_cli_filter_in_use(layout, conf, args.force)
    report = uninstall(layout, args.dry_run, args.force)
    for line in report.out:
        print(line)
    if report.changed and not args.dry_run:
        print(
            f"{PROG} uninstall: remove stune's lines from slurm.conf (Prolog/Epilog hooks are gone, "
            "HealthCheckProgram, TaskProlog, EpilogSlurmctld) and disable its units if you enabled them"
        )
    return EXIT_ATTENTION if report.kept else EXIT_OK
