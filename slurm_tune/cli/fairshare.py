"""`stune-fairshare`: charge idle GPU holding in fair-share, and report who holds GPUs without using them.

stune-fairshare apply [--dry-run] [--json] [--sacct-file DUMP] [--assoc-file FILE]
stune-fairshare report [--wide | --json | --format table|csv|json] [-o FILE] [--png FILE] [--prom FILE] [--since 7d]
stune-fairshare explain [USER] [--json]              ("why is my priority low?")
stune-fairshare job JOBID [--json] [--png FILE]      ("was my job idle?"; stune-job is its new name)
stune-fairshare idle-policy [--dry-run] [--node N] [--json]   (per node, from a timer: the opt-in policy)
stune-fairshare store --job ID [--nodes n[1-4]]    (EpilogSlurmctld: job summary -> AdminComment)
stune-fairshare collect                            (sweep the usage spool for late node summaries)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import asdict

from ..durations import option
from ..fairshare import accountant, idlepolicy, report_render
from ..fairshare import explain as explain_mod
from ..fairshare import report as report_mod
from ..fairshare.accountant import PrioritySettings
from ..fairshare.ledger import LedgerError
from ..output import json_text, print_json
from ..profiles import load_profiles
from ..slurm import Slurm
from ..thisnode import job_partition, node_name
from ..usage import collect
from ..usage.config import load_config, usage_dirs
from . import job as job_cli
from . import options
from .common import EXIT_OK, guarded

PROG = "stune-fairshare"


def _since(text: str | None, now: float) -> int | None:
    """A window's start: a duration ago ('7d', '12h', '90m', '3600', '1d12h', durations' rules) or
    '@1700000000' (an epoch)."""
    if text is None:
        return None

    text = text.strip()
    if text.startswith("@") and text[1:].isdigit():
        return int(text[1:])
    return int(now - option(text, "--since"))


def _slurm(args=None):
    """The cluster, or None for an offline what-if (--sacct-file without --cluster)."""
    if args is not None and getattr(args, "sacct_file", None) and not args.cluster:
        return None
    return Slurm.from_env()


def _offline_settings(args):
    if not getattr(args, "sacct_file", None) or args.cluster:
        return None
    half_life = option(args.half_life, "--half-life") if args.half_life is not None else 7 * 86400
    return PrioritySettings(
        algorithm=args.algorithm, half_life_s=float(half_life), weight_fairshare=args.weight_fairshare
    )


def _apply(args) -> int:
    config = load_config(args.config)
    result = accountant.run_locked(
        config,
        _slurm(args),
        sacct_file=args.sacct_file,
        assoc_file=args.assoc_file,
        dry_run=args.dry_run,
        now=args.now,
        settings=_offline_settings(args),
    )
    for warning in result.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    where = (
        "dry run, nothing written"
        if args.dry_run
        else (f"ledger {result.ledger_path}" if result.ledger_path else "what-if, no ledger")
    )
    if config.report.prometheus_textfile and not args.dry_run:
        _write_metrics(result, config, None)
    if args.json:
        print_json(
            {
                "dry_run": bool(args.dry_run),
                "changes": [asdict(c) for c in result.changes],
                "kept": result.kept,
                "settled_now": result.settled_now,
                "provisional": result.provisional,
                "ledger": result.ledger_path,
                "as_of": result.as_of,
                "warnings": list(result.warnings),
            }
        )
        return EXIT_OK
    verb = "would set" if args.dry_run else "set"
    for c in result.changes:
        print(
            f"job {c.job_id} ({c.user}/{c.account}): SiteFactor {c.current} -> {c.target}  "
            f"[{verb}; fair-share slurm {c.fairshare_slurm:.3f}, stune {c.fairshare_stune:.3f}]"
        )
    print(
        f"{len(result.changes)} SiteFactor change(s) {'planned' if args.dry_run else 'applied'}, "
        f"{result.kept} pending job(s) already right; {result.settled_now} run(s) settled, "
        f"{result.provisional} provisional ({where})"
    )
    return EXIT_OK


def _write_metrics(result, config, since) -> None:
    report_render.to_prometheus(report_mod.build(result, config, since), config.report.prometheus_textfile)


def _report(args) -> int:
    config = load_config(args.config)
    now = args.now if args.now is not None else time.time()
    since = None
    if not args.sacct_file:  # live: the window reaches back at least this far
        since = _since(args.since, now) if args.since else int(now - config.report.window)
    result = accountant.run_locked(
        config,
        _slurm(args),
        sacct_file=args.sacct_file,
        assoc_file=args.assoc_file,
        dry_run=True,
        plan=False,
        since=since,
        now=args.now,
        read_sshare=True,
        settings=_offline_settings(args),
    )
    if args.sacct_file and args.since:  # a dump's window is relative to its own last record
        since = _since(args.since, result.as_of)
    rep = report_mod.build(result, config, since)
    if args.json:
        args.format = "json"
    text = None
    if args.format == "csv":
        text = report_render.to_csv(rep)
    elif args.format == "json":
        text = report_render.to_json(rep)
    if text is not None:
        if args.output:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            sys.stdout.write(text)
    elif args.format == "table":
        if args.output:  # a file gets the plain table (no colour codes), as wide as it needs
            Console = report_render._need("rich.console", "the terminal table").Console
            with open(args.output, "w", encoding="utf-8") as fh:
                report_render.to_table(
                    rep, Console(file=fh, width=200, color_system=None, force_terminal=False), wide=args.wide
                )
        else:
            report_render.to_table(rep, wide=args.wide)
    if args.png:
        report_render.to_png(rep, args.png)
        print(f"{PROG}: wrote {args.png}", file=sys.stderr)
    prom = args.prom or config.report.prometheus_textfile
    if prom:
        report_render.to_prometheus(rep, prom)
        print(f"{PROG}: wrote {prom}", file=sys.stderr)
    return EXIT_OK


def _explain(args) -> int:
    user = args.user or explain_mod.current_user()
    if not explain_mod.may_see(user):
        raise explain_mod.NotYours(
            f"{user}: only root explains another user's priority; run it without a name"
        )
    config = load_config(args.config)
    slurm = _slurm()
    now = time.time()
    since = int(now - config.report.window)
    try:
        # the ledger is read, never written: no lock needed (it is replaced atomically)
        result = accountant.run(config, slurm, dry_run=True, plan=False, since=since, read_sshare=True)
    except LedgerError:
        # a ledger this user cannot read: the same computation over sacct's whole history window (slower;
        # an admin makes explain cheap by leaving the ledger readable, see docs/fairshare.md)
        result = accountant.run(config, slurm, read_sshare=True, use_ledger=False)
    pending = slurm.sprio()
    doc = explain_mod.explain(result, config, user, pending)
    sys.stdout.write(json_text(doc) if args.json else explain_mod.explain_text(doc))
    return EXIT_OK


def _job(args) -> int:
    return job_cli.show(args, PROG)  # stune-job's, under its older name


def _idle_policy(args) -> int:
    config = load_config(args.config)
    node = args.node or node_name()
    local, _ = usage_dirs(config, node=node)
    profiles = load_profiles(args.partitions)
    slurm = _slurm()
    with open(args.log, "a", encoding="utf-8") if args.log else contextlib.nullcontext() as log_file:

        def log(line: str) -> None:
            print(line, flush=True, file=sys.stderr if args.json else sys.stdout)
            if log_file is not None:
                log_file.write(
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {node} {'dry-run ' if args.dry_run else ''}{line}\n"
                )
                log_file.flush()

        decisions = idlepolicy.evaluate(slurm, profiles, local, node)
        idlepolicy.act(slurm, decisions, profiles, local, dry_run=args.dry_run, log=log)
    if args.json:
        sys.stdout.write(idlepolicy.to_json(decisions))
    return EXIT_OK


def _store(args) -> int:
    config = load_config(args.config)
    _, spool = usage_dirs(config)
    wait = config.usage.collect_wait if args.wait is None else args.wait
    partition = job_partition(os.environ)  # EpilogSlurmctld's: the nodes' fio baselines for the verdict
    outcome = collect.store_job(_slurm(), spool, args.job, args.nodes, wait_s=wait, partition=partition)
    print(f"{PROG}: job {args.job}: {outcome}", file=sys.stderr)
    return EXIT_OK


def _collect(args) -> int:
    config = load_config(args.config)
    _, spool = usage_dirs(config)
    # younger directories may still have an EpilogSlurmctld waiting on them
    min_age = args.min_age if args.min_age is not None else config.usage.collect_wait + 30
    for job, outcome in collect.sweep(
        _slurm(), spool, min_age_s=min_age, max_age_s=config.usage.spool_max_age
    ):
        print(f"job {job}: {outcome}")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="GPU-utilization fair-share for Slurm")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def common(p, sacct=True):
        p.add_argument(
            "--config", help="fair-share YAML (default $STUNE_FAIRSHARE_CONFIG or /etc/stune/fairshare.yaml)"
        )
        if sacct:
            p.add_argument(
                "--sacct-file",
                help="a `sacct -P` dump with header: a what-if, no ledger, offline unless --cluster",
            )
            p.add_argument(
                "--assoc-file", help="`sacctmgr -P show assoc format=Account,User,ParentName,Share`"
            )
            p.add_argument(
                "--cluster",
                action="store_true",
                help="with --sacct-file: take priority settings, associations and pending jobs from "
                "the live cluster",
            )
            p.add_argument(
                "--algorithm",
                choices=("fair_tree", "classic"),
                default="fair_tree",
                help="offline what-if: Slurm's fair-share algorithm (default fair_tree)",
            )
            p.add_argument(
                "--half-life",
                help="offline what-if: PriorityDecayHalfLife, e.g. 7d (default), 2w or 7-00:00:00",
            )
            p.add_argument(
                "--weight-fairshare",
                type=int,
                default=10000,
                help="offline what-if: PriorityWeightFairshare (default 10000)",
            )
            p.add_argument("--now", type=int, help=argparse.SUPPRESS)

    p = sub.add_parser("apply", help="charge new jobs, then set SiteFactor on pending jobs")
    common(p)
    options.add(p, "dry_run", help="show the changes; write nothing")
    options.add(p, "json", help="print the changes and the summary as JSON")
    p = sub.add_parser("report", help="per account/user GPU-hours held vs used, fair-share, idle jobs")
    common(p)
    p.add_argument("--format", choices=("table", "csv", "json", "none"), default="table")
    options.add(p, "json", help="the same as --format json")
    p.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column (sshare's live fair share, all jobs); about 110 columns",
    )
    p.add_argument("-o", "--output", help="write the table, CSV or JSON here instead of stdout")
    p.add_argument("--png", help="write a chart of held vs used GPU-hours per account")
    p.add_argument("--prom", help="write Prometheus metrics to this textfile")
    p.add_argument("--since", help="window: 7d, 12h, 2w, @EPOCH (default: report.window from the config)")
    p = sub.add_parser("explain", help="why a user's priority is what it is (default: you)")
    common(p, sacct=False)
    p.add_argument("user", nargs="?", help="the user (root only; others see themselves)")
    options.add(p, "json")
    p = sub.add_parser("job", help="what happened to a job: usage, charge, bottleneck (also: stune-job)")
    job_cli.add_arguments(p)
    p = sub.add_parser(
        "idle-policy", help="warn, then cancel, jobs whose GPUs stay idle (per-partition opt-in)"
    )
    common(p, sacct=False)
    options.add(p, "dry_run", help="list what would be done; change nothing")
    options.add(p, "node", help="judge this node's jobs (default: this node)")
    p.add_argument(
        "--partitions",
        help="partition profiles directory (default $STUNE_PARTITIONS or /etc/stune/partitions)",
    )
    p.add_argument("--log", help="also append every decision to this file")
    options.add(p, "json", help="the decisions as JSON (the log lines go to stderr)")
    p = sub.add_parser("store", help="EpilogSlurmctld: merge a job's node summaries into AdminComment")
    common(p, sacct=False)
    p.add_argument("--job", required=True)
    p.add_argument("--nodes", help="the job's node list (SLURM_JOB_NODELIST)")
    p.add_argument("--wait", type=float, help="seconds to wait for every node (default usage.collect_wait)")
    p = sub.add_parser("collect", help="store summaries that arrived after EpilogSlurmctld gave up")
    common(p, sacct=False)
    p.add_argument(
        "--min-age",
        type=float,
        help="leave job directories younger than this alone (default usage.collect_wait + 30 s)",
    )
    return parser


def _main(argv: list[str]) -> int:
    args = options.parse(_parser(), argv)
    return {
        "apply": _apply,
        "report": _report,
        "store": _store,
        "collect": _collect,
        "explain": _explain,
        "job": _job,
        "idle-policy": _idle_policy,
    }[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
