"""`stune-admin`: tools for the cluster admin (install, doctor, profile validation, topology). install and
uninstall are admin_install.py's."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys

from ..admin import doctor
from ..admin.topology import (
    build_topology,
    empty_reason,
    host_name,
    parse_ibnetdiscover,
    parse_node_name_map,
    render,
)
from ..errors import ConfigError
from ..output import print_json, table
from ..profiles import profile_dir, validate_directory
from ..progs import ADMIN as PROG
from ..slurm import Slurm
from . import options
from .admin_install import host_layout, host_roles, run_install, run_uninstall
from .common import EXIT_ERROR, EXIT_OK, guarded


def _check_profiles(args) -> int:
    directory = args.directory or profile_dir()
    profiles = validate_directory(directory)
    if args.json:
        print_json(
            {
                "directory": directory,
                "profiles": {
                    name: {
                        "source": p.source,
                        "digest": p.digest,
                        "fabric": p.fabric.type,
                        "gpus": p.gpu.count,
                        "hcas": [f"{h.device}:{h.port}" for h in p.fabric.hcas],
                    }
                    for name, p in profiles.items()
                },
            }
        )
        return EXIT_OK

    print(
        table(
            [
                (
                    name,
                    p.fabric.type,
                    f"hcas={','.join(f'{h.device}:{h.port}' for h in p.fabric.hcas) or '-'}",
                    f"gpus={p.gpu.count}",
                    f"digest={p.digest}",
                    f"({p.source})",
                )
                for name, p in sorted(profiles.items())
            ]
        ),
        end="",
    )
    print(f"{len(profiles)} profile(s) OK in {directory}")
    return EXIT_OK


def _topology(args) -> int:
    def read(path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError as exc:
            raise ConfigError(path, None, "", f"cannot read: {exc.strerror}") from None

    source = "<stdin>" if args.input == "-" else args.input
    if args.input == "-":
        if sys.stdin.isatty():
            raise ConfigError(
                source,
                None,
                "",
                "give ibnetdiscover output: `ibnetdiscover | stune-admin "
                "topology` or `stune-admin topology FILE`",
            )
        text = sys.stdin.read()
    else:
        text = read(args.input)
    names = parse_node_name_map(read(args.node_name_map), args.node_name_map) if args.node_name_map else None
    keep = (lambda name: any(fnmatch.fnmatchcase(name, g) for g in args.match)) if args.match else None
    fabric = parse_ibnetdiscover(text, source, names)
    if fabric.warnings:
        print(
            f"{PROG} topology: skipped {fabric.warnings} ibnetdiscover warning line(s) in {source}: parts of "
            "the fabric may be missing",
            file=sys.stderr,
        )
    topology = build_topology(fabric, keep=keep, hca=args.hca, all_rails=args.all_rails)
    if not topology.leaves:
        hosts = [host_name(d.description) for d in fabric.devices.values() if d.kind == "ca"]
        matched = keep is None or any(h and keep(h) for h in hosts)
        raise ConfigError(source, None, "", empty_reason(fabric, matched=matched, hca=args.hca))
    conf = render(topology, source)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(conf)
        except OSError as exc:
            raise ConfigError(args.output, None, "", f"cannot write: {exc.strerror}") from None
        print(
            f"wrote {args.output}: {len(topology.leaves)} leaf switch(es), "
            f"{sum(len(v) for v in topology.leaves.values())} node placement(s)",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(conf)
    return EXIT_OK


def _doctor(args) -> int:
    env_file = (
        args.env_file
        or os.environ.get("STUNE_ENV_FILE")
        or os.path.join(os.path.abspath(args.prefix), "etc/default/stune")
    )
    env = {}
    if os.path.isfile(env_file):
        try:
            env = doctor.read_env_file(env_file)
        except OSError:
            env = {}
    # The slurm.conf judged: --slurm-conf, else the one the hooks use (the env file's SLURM_CONF).
    if not args.slurm_conf and env.get("SLURM_CONF"):
        args.slurm_conf = env["SLURM_CONF"]
    layout, conf = host_layout(args)
    roles, _ = host_roles(args, conf, fallback_all=True)
    slurm = Slurm(conf=env.get("SLURM_CONF") or layout.slurm_conf, timeout=args.timeout)  # the live cluster
    result = doctor.run(env_file, layout, roles, args.facts, slurm, conf_given=True)
    if args.json:
        sys.stdout.write(doctor.as_json(result))
    else:
        for finding in result.findings:
            if finding.severity != doctor.OK or args.verbose:
                print(finding.line())
        table = result.matrix_table()
        if table:
            print("\nversion matrix (? = not recorded):\n" + table.rstrip("\n"))
        drift = result.drift_tables()
        if drift:
            print("\n" + drift.rstrip("\n"))
        errors = sum(f.severity == doctor.ERROR for f in result.findings)
        warnings = sum(f.severity == doctor.WARNING for f in result.findings)
        oks = sum(f.severity == doctor.OK for f in result.findings)
        print(f"{PROG} doctor: {errors} error(s), {warnings} warning(s), {oks} ok (-v lists them)")
    return EXIT_ERROR if any(f.severity == doctor.ERROR for f in result.findings) else EXIT_OK


def _common(p) -> None:
    p.add_argument(
        "--prefix",
        default="/",
        help="install root (default /): stune's files, env file, state and "
        "manifest lie under it; the Prolog/Epilog directories are "
        "the ones slurm.conf's globs name, when it names them",
    )
    p.add_argument(
        "--slurm-conf",
        metavar="FILE",
        help="the live slurm.conf (default: $SLURM_CONF, else the "
        "first of PREFIX/etc/slurm/, etc/slurm-llnl/, "
        "usr/local/etc/)",
    )
    p.add_argument(
        "--role",
        choices=("detect", "node", "controller", "all"),
        default="detect",
        help="node part (hooks, TaskProlog, sampler unit), controller part (EpilogSlurmctld, "
        "accountant units), or all; default: detected from slurm.conf",
    )
    p.add_argument("-v", "--verbose", action="store_true")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split(":", 1)[1].strip())
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser(
        "check-profiles", help="validate partitions/*.yaml and site.yaml; one line per error"
    )
    check.add_argument(
        "directory", nargs="?", help="profile directory (default: $STUNE_PARTITIONS or /etc/stune/partitions)"
    )
    options.add(
        check,
        "json",
        help="each valid profile's source, digest, fabric, GPUs and HCAs as JSON (an "
        "invalid directory is still one line per error on stderr, exit 1)",
    )
    topo = sub.add_parser(
        "topology",
        help="ibnetdiscover output to topology.conf",
        description="Read `ibnetdiscover` output (a file, or stdin) and write a Slurm "
        "topology.conf for topology/tree.",
    )
    topo.add_argument("input", nargs="?", default="-", help="ibnetdiscover output file (default: stdin)")
    topo.add_argument("-o", "--output", help="write topology.conf here (default: stdout)")
    topo.add_argument(
        "--match",
        action="append",
        metavar="GLOB",
        help="keep only nodes whose name matches (repeatable), e.g. 'gpu*'",
    )
    topo.add_argument(
        "--hca",
        metavar="NAME",
        help="place each node by the HCA with this name in its "
        "description (e.g. mlx5_0); default: its first HCA",
    )
    topo.add_argument("--all-rails", action="store_true", help="list a node under every leaf its HCAs reach")
    topo.add_argument(
        "--node-name-map",
        metavar="FILE",
        help="GUID -> name map in ibnetdiscover's format "
        '(`<guid> "<name>"` per line), for HCAs that keep '
        "the driver's default description",
    )
    inst = sub.add_parser(
        "install",
        help="place hooks, TaskProlog, EpilogSlurmctld, units, env file, dirs",
        description="Place everything stune ships (idempotent; an admin-edited file is kept "
        "and its diff shown unless --force), write the env file from what it "
        "detects, create the state/usage/spool dirs, install units without "
        "enabling them, and print the Slurm lines it needs as diffs. Exit 3 "
        "(EXIT_ATTENTION) when an edited file was kept.",
    )
    _common(inst)
    inst.add_argument(
        "--login",
        dest="role",
        action="store_const",
        const="login",
        help="a login (submission) node: the profile directory, example profiles and the env "
        "file, nothing else (no hooks, units or state)",
    )
    options.add(inst, "dry_run", help="say what would change; write nothing")
    inst.add_argument("--force", action="store_true", help="replace files an admin edited")
    inst.add_argument(
        "--enable",
        action="store_true",
        help="also systemctl enable --now the role's units "
        "(the sampler, the idle-policy timer and the cache "
        "tier's set-up on a node, "
        "the accountant's timer on the controller); only "
        "with --prefix /",
    )
    inst.add_argument(
        "--cli-filter",
        action="store_true",
        help="also place cli_filter.lua and its data (rendered from the profiles) beside slurm.conf, "
        "so plain sbatch/salloc/srun get the partition's settings; prints the slurm.conf line",
    )
    inst.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="extra env file setting (repeatable), e.g. STUNE_SYSFS_ROOT=/srv/hw/%%n/sysfs",
    )
    uninst = sub.add_parser("uninstall", help="remove exactly what install placed (its manifest)")
    _common(uninst)
    options.add(uninst, "dry_run", help="say what would be removed; remove nothing")
    uninst.add_argument("--force", action="store_true", help="also remove files edited since install")
    doc = sub.add_parser(
        "doctor",
        help="check the live cluster: one line per finding, exit 1 on errors",
        description="Check slurm.conf/cgroup.conf, hooks and files root runs, profiles "
        "against partitions and GRES, homogeneous partitions and the version "
        "matrix, the sampler and the accountant.",
    )
    _common(doc)
    options.add(doc, "json", help="findings and the version matrix as JSON")
    doc.add_argument(
        "--env-file", metavar="FILE", help="default: $STUNE_ENV_FILE, else PREFIX/etc/default/stune"
    )
    doc.add_argument(
        "--facts", metavar="DIR", help="per-node captures, DIR/<node>.json (`stune-health capture -o`)"
    )
    doc.add_argument("--timeout", type=float, default=10.0, help="seconds per Slurm call (default 10)")
    return parser


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    handlers = {
        "check-profiles": _check_profiles,
        "install": run_install,
        "uninstall": run_uninstall,
        "doctor": _doctor,
        "topology": _topology,
    }
    return handlers[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
