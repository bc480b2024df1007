"""`stune-stage`: dataset staging to the node-local cache tier.

    stune-stage fetch [SRC[:NAME] ...] [--required]   stage now on this node; prints `export` lines for eval
                                                      (no SRC: the job's STUNE_STAGE and profile defaults)
    stune-stage ls [--json]                           entries: user, source, size, last use, holding jobs
    stune-stage status [--json]                       quota, usage, watermarks, free disk, per tier
    stune-stage gc [--dry-run] [--to-low|--evict-all] reclaim dead stagers' and dead jobs' leftovers; evict LRU
    stune-stage release [--job ID]                    drop a job's holds
    stune-stage epilog                                the node epilog (as root): release $SLURM_JOB_ID's holds,
                                                      evict above the high watermark; never fails
    stune-stage init                                  create a tier root (root only): mode 1777, ledger

Tiers come from the partition profiles' `cache` sections: --partition picks one (default: the job's, else
every profile's); --node expands %n in cache.path (default: $SLURMD_NODENAME, else this host's short name);
--path names a tier root directly.

Old spellings still accepted (hidden from --help, with a note on stderr): `gc -n` (now `--dry-run`; `-n` is a
count elsewhere), `release --epilog` (now the `epilog` command, as in stune-health and stune-gpu-sampler).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import StuneError
from ..nodeenv.taskenv import as_shell, as_taskprolog
from ..output import print_json, table
from ..profiles import load_profile
from ..slurm import Slurm
from ..stage import jobenv
from ..stage.admin import age, evict_above_high, init, list_entries, release_job, status, tiers_for
from ..stage.errors import TierUnavailable
from ..stage.gc import gc
from ..stage.spec import ENV_VAR, encode_requests, parse_stage_arg
from ..stage.tier import Tier
from ..stage.watch import human
from ..text import is_digits
from ..thisnode import job_context, job_partition, node_name
from . import options
from .common import EXIT_ERROR, EXIT_INTERNAL, EXIT_OK, guarded

PROG = "stune-stage"


def _job_id(text: str) -> str:
    """A Slurm job id: digits (an array task's own id). `12a` or `12_3` would silently take no hold.
    Bad input, not a usage error: one line and exit 1 (a StuneError passes through argparse to guarded())."""
    if not is_digits(text):
        raise StuneError(
            f"--job {text!r}: not a Slurm job id (digits only; for an array task use its own job "
            "id, $SLURM_JOB_ID)"
        )
    return text


def _copy_jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        raise StuneError(f"--jobs {text!r}: the number of copy threads must be 1 to 256")
    return value


def _parser():
    parser = argparse.ArgumentParser(prog=PROG, description="Stage datasets into the node-local cache tier.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name, help_text, aliases=()):
        p = sub.add_parser(name, help=help_text, aliases=list(aliases))
        options.add(p, "partition", help="the partition whose tier to use")
        options.add(
            p, "node", help="node name for %%n in cache.path (default: $SLURMD_NODENAME, else the host name)"
        )
        p.add_argument("--path", help="a tier root, instead of the profiles' cache.path")
        return p

    fetch = add("fetch", "stage SRC[:NAME] now on this node and print export lines", aliases=("stage",))
    fetch.add_argument("requests", nargs="*", metavar="SRC[:NAME]")
    fetch.add_argument("--required", action="store_true", help="fail instead of falling back to the source")
    fetch.add_argument(
        "--job", type=_job_id, help="hold the entries for this job id (default: $SLURM_JOB_ID)"
    )
    fetch.add_argument(
        "--freshness", choices=("fast", "strict"), help="override the profile's freshness mode"
    )
    fetch.add_argument(
        "--jobs",
        "-j",
        type=_copy_jobs,
        metavar="N",
        help="parallel copy threads, 1 to 256 (default: $STUNE_STAGE_JOBS, else 2 per core, 4-16)",
    )
    fetch.add_argument(
        "--format",
        choices=("shell", "taskprolog", "paths"),
        default="shell",
        help="shell: export NAME='path' (for eval); taskprolog: unquoted; paths: NAME path",
    )
    for name, text in (("ls", "list the tier's entries"), ("status", "the tier's quota, usage and health")):
        options.add(add(name, text), "json")
    gc = add("gc", "reclaim leftovers of dead stagers and jobs; evict LRU above the high watermark")
    options.add(gc, "dry_run", help="say what would go, change nothing")
    options.deprecated(gc, "-n", "--dry-run", PROG, dest="dry_run", action="store_true")
    gc.add_argument(
        "--to-low", action="store_true", help="evict down to the low watermark even below the high"
    )
    gc.add_argument("--evict-all", action="store_true", help="evict every entry no running job holds")
    release = add("release", "drop a job's holds")
    release.add_argument("--job", type=_job_id, help="job id (default: $SLURM_JOB_ID)")
    options.deprecated(release, "--epilog", "`stune-stage epilog`", PROG, dest="epilog", action="store_true")
    epilog = add(
        "epilog",
        "the node epilog (as root): release $SLURM_JOB_ID's holds (its user from "
        "$SLURM_JOB_UID), then evict above the high watermark; never fails (a cache problem "
        "must not drain the node)",
    )
    epilog.add_argument("--job", type=_job_id, help="job id (default: $SLURM_JOB_ID)")
    epilog.set_defaults(epilog=True)
    add("init", "create the tier root (root only)")
    return parser


def _node(args) -> str:
    return args.node or node_name()


def _tiers(args, partition=None):
    tiers = tiers_for(args.partition or partition, _node(args), args.path)
    if not tiers:
        raise StuneError(
            "no cache tier: no profile sets cache.path"
            + (f" for partition {args.partition}" if args.partition else "")
        )
    return tiers


# ---- fetch ------------------------------------------------------------------------------------------------


def cmd_fetch(args) -> int:
    env = dict(os.environ)
    if args.job is not None:
        env["SLURM_JOB_ID"] = args.job
    elif env.get("SLURM_JOB_ID") and not (env["SLURM_JOB_ID"].isascii() and env["SLURM_JOB_ID"].isdigit()):
        raise StuneError(f"SLURM_JOB_ID={env['SLURM_JOB_ID']!r} is not a job id: pass --job ID")
    if args.requests:
        env[ENV_VAR] = encode_requests([parse_stage_arg(r) for r in args.requests], args.required)
    elif not env.get(ENV_VAR):
        raise StuneError(f"nothing to stage: give SRC[:NAME], or run inside a job with {ENV_VAR} set")
    partition = args.partition or None
    if not partition and not job_partition(env) and not args.path:
        partition = Slurm.from_env().default_partition() or ""
    context = job_context(env, partition=partition, node=_node(args)).with_profile(load_profile)
    job = jobenv.resolve(context, with_defaults=not args.requests)
    config, problem = job.config, job.problem
    if args.path:
        ((_label, config),) = _tiers(args)
        problem = None
    if config is not None and args.freshness:
        config = config._replace(freshness=args.freshness)
    exports, _messages = jobenv.stage_requests(
        job.requests,
        job.required or args.required,
        config,
        job.job_id,
        sys.stderr,
        problem=problem,
        jobs=args.jobs,
    )
    for name, value in exports.items():
        if args.format == "paths":
            print(f"{name} {value}")
        elif args.format == "taskprolog":
            sys.stdout.write(as_taskprolog({name: value}))
        else:
            sys.stdout.write(as_shell({name: value}))
    return EXIT_OK


# ---- ls / status ------------------------------------------------------------------------------------------


def cmd_ls(args) -> int:
    rows_out = []
    unreadable = 0
    for _label, config in _tiers(args):
        problems: list[str] = []
        with Tier(config) as tier:
            try:
                rows = list_entries(tier, problems)
            except (TierUnavailable, OSError) as exc:  # one broken tier must not hide the others
                print(f"{PROG}: {config.root}: {exc}", file=sys.stderr)
                unreadable += 1
                continue
        for problem in problems:
            print(f"{PROG}: warning: {problem}", file=sys.stderr)
        rows_out += [(config.root, r) for r in rows]
    if args.json:
        print_json([dict(r._asdict(), tier=root) for root, r in rows_out])
        return EXIT_ERROR if unreadable else EXIT_OK

    if unreadable and not rows_out:  # nothing to list: the error lines said why
        return EXIT_ERROR
    header = ("TIER", "USER", "SOURCE", "KIND", "SIZE", "FILES", "LAST USE", "HELD BY", "ENTRY")
    sys.stdout.write(
        table(
            [
                (
                    root,
                    r.user,
                    r.source,
                    r.kind,
                    human(r.bytes),
                    f"{r.files:,}",
                    age(r.last_use),
                    ",".join(r.holds) or "-",
                    r.entry + ("" if r.current else " (old)"),
                )
                for root, r in rows_out
            ],
            header,
        )
    )
    return EXIT_ERROR if unreadable else EXIT_OK  # a tier that is missing or unreadable is an error


def cmd_status(args) -> int:
    results = []
    for label, config in _tiers(args):
        with Tier(config) as tier:
            results.append((label, status(tier)))
    if args.json:
        print_json([dict(s._asdict(), partitions=label) for label, s in results])
        return EXIT_OK
    bad = 0
    for label, s in results:
        print(f"{s.root}  (partitions: {label})")
        if s.problem and not s.quota and not s.fs_size:
            print(f"  problem: {s.problem}")
            bad += 1
            continue
        pct = 100 * s.usage / s.quota if s.quota else 0
        print(
            f"  usage      {human(s.usage)} of {human(s.quota)} quota ({pct:.0f}%); "
            f"evicts above {s.high:.0%} down to {s.low:.0%}"
        )
        print(f"  disk       {human(s.fs_free)} free of {human(s.fs_size)} ({human(s.reserve)} kept free)")
        print(
            f"  entries    {s.entries} ready, {s.pending} being copied, {s.held} held by running jobs, "
            f"{s.users} namespace(s)"
        )
        for line in s.ledger_problems:
            print(f"  ledger: {line}")
        for line in s.namespace_problems:
            print(f"  problem: bad namespace: {line} (`stune-stage init` repairs it)")
            bad += 1
        if s.problem:
            print(f"  problem: {s.problem}")
            bad += 1
    return EXIT_ERROR if bad else 0


# ---- gc / release / init ----------------------------------------------------------------------------------


def cmd_gc(args) -> int:
    verb = "would remove" if args.dry_run else "removed"
    for _label, config in _tiers(args):
        with Tier(config) as tier:
            report = gc(tier, dry_run=args.dry_run, to_low=args.to_low, evict_all=args.evict_all)
        print(f"{config.root}:")
        for user, job in report.stale_holds:
            print(f"  {verb} stale holds of job {job} ({user}): the job is no longer running")
        for item in report.tmp_removed:
            print(f"  {verb} leftover {item}")
        for item in report.ledger_fixed:
            print(f"  ledger: {item}")
        for item in report.old_removed:
            print(f"  {verb} old copy {item}")
        for user, entry, nbytes in report.evicted:
            print(
                f"  {'would evict' if args.dry_run else 'evicted'} {user}/{entry} ({human(nbytes)}), "
                "least recently used"
            )
        for item in report.locks_removed:
            print(f"  {verb} unused lock {item}")
        for problem in report.bad_namespaces:
            print(f"  bad namespace: {problem} (jobs of that user fall back; `stune-stage init` repairs it)")
        for problem in report.problems:
            print(f"{PROG}: warning: {config.root}: {problem}", file=sys.stderr)
        if not any(report[:-2]):
            print("  nothing to do" if not report.bad_namespaces else "  nothing else to do")
    return EXIT_OK


def cmd_release(args) -> int:
    context = job_context(os.environ, node=_node(args))
    job = getattr(args, "job", None) or context.job_id or ""
    if not job.isdigit():
        raise StuneError("release needs a job id (--job, or $SLURM_JOB_ID)")
    uid = user = None
    if args.epilog:
        uid = os.environ.get("SLURM_JOB_UID")
        user = os.environ.get("SLURM_JOB_USER") or None
        if not (uid or "").isdigit():
            print(f"{PROG}: epilog: SLURM_JOB_UID is not set; nothing released", file=sys.stderr)
            return EXIT_OK
    partition = context.partition if args.epilog and not args.partition else None
    try:
        tiers = _tiers(args, partition)
    except StuneError as exc:
        if not args.epilog:
            raise
        print(f"{PROG}: epilog: job {job}: {exc}", file=sys.stderr)
        return EXIT_OK
    for _label, config in tiers:
        with Tier(config) as tier:
            try:
                release_job(tier, job, int(uid) if uid else None, user)
                if args.epilog and os.geteuid() == 0:
                    evict_above_high(tier)
            except Exception as exc:
                if not args.epilog:
                    raise

                if not (isinstance(exc, TierUnavailable) and exc.kind == "missing"):
                    print(f"{PROG}: epilog: {config.root}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return EXIT_OK


def cmd_init(args) -> int:
    if not (args.partition or args.path) and not tiers_for(None, _node(args)):
        # every node runs this at boot (stune-stage-init.service): no tier configured is nothing to do
        print(f"{PROG}: no profile sets cache.path: no cache tier to set up on this node")
        return EXIT_OK
    for _label, config in _tiers(args):
        for line in init(config) or [f"{config.root}: already set up"]:
            print(line)
    return EXIT_OK


COMMANDS = {
    "fetch": cmd_fetch,
    "stage": cmd_fetch,
    "ls": cmd_ls,
    "status": cmd_status,
    "gc": cmd_gc,
    "release": cmd_release,
    "epilog": cmd_release,
    "init": cmd_init,
}


def _main(argv: list[str]) -> int:
    args = options.parse(_parser(), argv)
    return COMMANDS[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The epilog must never fail: a bug here is reported, and the node stays in service.
    internal_exit = EXIT_OK if argv[:1] == ["epilog"] or "--epilog" in argv else EXIT_INTERNAL
    return guarded(PROG, _main, argv, internal_exit=internal_exit)
