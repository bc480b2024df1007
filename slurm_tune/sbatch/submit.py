"""The submission: read the command line and the script, resolve the partition, plan, run sbatch, record.

stune stays out of sbatch's way wherever it cannot help: a command line sbatch would reject (said in one
line), --usage and --version, a partition without a profile, or a profile directory that does not load all
run plain sbatch with the user's words (a broken profile also prints one warning; --stage without a profile
still exports STUNE_STAGE_<NAME> at the source, with a warning). `--help` prints sbatch's help when sbatch can
give it, then stune's, and exits 0. The options are read with the installed sbatch's table (optable.py,
cached); a word that table cannot classify gets a one-line warning, asked of `sbatch --help` afresh first,
and stune's settings still apply. sbatch's stdout, stderr and exit status are always the user's to see.
"""
from __future__ import annotations

import os
import sys
import time

from ..errors import NoProfileError, StuneError
from .options import INFO_KEYS, Effective, parse_args, parse_directives

PROG = "stune-sbatch"
STUNE_HELP = """
stune-sbatch options (everything else is sbatch's, passed through untouched):
      --dry-run               print the sbatch command and environment stune would use, and where each
                              setting comes from; submit nothing
      --json                  with --dry-run: the same as JSON
      --stage=SRC[:NAME]      stage SRC into the node-local cache tier; the job finds it in
                              $STUNE_STAGE_<NAME> (repeatable)
      --stage-required        fail the job when a dataset cannot be staged (default: read the source)
      --stage-strict          reuse a cached copy only when every file still matches the source (size,
                              mtime); the default `fast` check looks at the top level only
      --checkpoint-signal     add the profile's --signal=B:USR1@300 (recovery.signal) although the script
                              does not trap it; by default only a script with `trap ... USR1` gets it
      --node-summary          each node writes one line to the job's stderr: the final NCCL/gloo/rendezvous
                              settings and whether each staged dataset is read from the cache or the source
  stune-sbatch history [-n N] [--json]       the submissions recorded for you
  stune-sbatch history diff A B [--json]     what changed between two runs (job ids, or -1 for the latest)
"""


def warn(text: str) -> None:
    from ..streams import say

    say(sys.stderr, f"{PROG}: {text}")


def read_script(argv: list[str], parsed, environ, stdin) -> tuple[str | None, bytes | None, str]:
    """(script text for the directives, bytes to feed sbatch on stdin, a label for the history)."""
    if parsed.script_index is not None:
        path = argv[parsed.script_index]
        try:
            with open(path, "rb") as fh:
                return fh.read(1 << 22).decode("utf-8", "replace"), None, path
        except OSError:
            return None, None, path  # sbatch says it cannot open it
    if any(o.key == "wrap" for o in parsed.options):
        return None, None, "--wrap"
    data = stdin.read() if stdin is not None else b""
    return data.decode("utf-8", "replace"), data, "<stdin>"


def sbatch_words(argv: list[str], parsed, added: list[str]) -> list[str]:
    """The user's words minus stune's own options, with stune's options just before the script."""
    drop = set(parsed.stune_words)
    words = [w for i, w in enumerate(argv) if i not in drop]
    if not added:
        return words
    end = parsed.dashdash if parsed.dashdash is not None else parsed.script_index
    end = len(argv) if end is None else end
    if parsed.insert_at is not None:  # an unknown option that may take the next word: before it
        end = min(end, parsed.insert_at)
    at = end - sum(1 for i in drop if i < end)
    return words[:at] + added + words[at:]


def job_id_from(stdout: str) -> tuple[str | None, str | None]:
    """(job id, cluster) from `Submitted batch job N[ on cluster C]` or --parsable's `N[;C]`."""
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("Submitted batch job "):
            words = line.split()
            return words[3], (words[6] if len(words) >= 7 and words[4:6] == ["on", "cluster"] else None)
        head, _, cluster = line.partition(";")
        if head.isdigit():
            return head, cluster or None
    return None, None


def run(argv: list[str], environ=None, stdin=None, slurm=None) -> int:
    # One copy of os.environ: each later dict() of it (the job's environment, the history's) is then a plain
    # dict's copy, not one more decoding of every variable.
    environ = dict(os.environ) if environ is None else environ
    if slurm is None:  # the commands alone: a plain submission asks Slurm nothing (queries() when it must)
        from ..slurm.commands import SlurmCommands

        slurm = SlurmCommands.from_env()
    parsed = parse_args(argv)
    if any(o.key == "help" for o in parsed.options):
        return _help(slurm, environ)
    info = any(o.key in INFO_KEYS for o in parsed.options)
    from .optable import learn

    how = "built-in" if info else learn(slurm, environ)  # the installed sbatch's table (cached)
    parsed = parse_args(argv)
    if parsed.unknown and how == "cached":  # the plugin stack may have changed under the same files: ask afresh
        how = learn(slurm, environ, fresh=True)
        parsed = parse_args(argv)
    dry_run = any(o.key == "stune:dry-run" for o in parsed.stune)
    as_json = dry_run and any(o.key == "stune:json" for o in parsed.stune)
    if not dry_run and any(o.key == "stune:json" for o in parsed.stune):
        parsed = parse_args(argv, stune_json=False)  # only a dry run's: a submission gives --json to sbatch
    if parsed.problems or info:
        if dry_run:
            for problem in parsed.problems:
                warn(f"sbatch would refuse this command line: {problem}")
            return 2 if parsed.problems else 0
        if parsed.problems:
            warn(f"warning: sbatch will refuse this command line ({'; '.join(parsed.problems)}): passed to it "
                 "as given, without stune's settings")
        return _sbatch(slurm, sbatch_words(argv, parsed, []), None, environ)
    if dry_run and parsed.script_index is not None:
        problem = _unreadable(argv[parsed.script_index])
        if problem:
            warn(f"sbatch would refuse this command line: {problem}")
            return 2
    text, stdin_bytes, script_label = read_script(argv, parsed, environ,
                                                  stdin if stdin is not None else _stdin_buffer())
    problems: list[str] = []
    unknown = list(parsed.unknown)
    directives, script_het = parse_directives(text, problems, unknown) if text else ([], False)
    if len(unknown) > len(parsed.unknown) and how == "cached":  # a directive's: ask afresh, read both again
        learn(slurm, environ, fresh=True)
        parsed = parse_args(argv, stune_json=as_json)
        unknown, problems = list(parsed.unknown), []
        directives, script_het = parse_directives(text, problems, unknown)
    if problems:  # the script's directives hold what sbatch refuses: the same verdict as for the command line
        if dry_run:
            for problem in problems:
                warn(f"sbatch would refuse this script's #SBATCH lines: {problem}")
            return 2
        warn(f"warning: sbatch will refuse this script's #SBATCH lines ({'; '.join(problems)}): passed to it as "
             "given, without stune's settings")
        return _sbatch(slurm, sbatch_words(argv, parsed, []), stdin_bytes, environ)
    eff = Effective(parsed.options, directives, environ)
    try:
        plan = make_plan(argv, parsed, eff, environ, slurm, het=parsed.het or script_het, script=text,
                         unknown=unknown)
    except _NoProfile as exc:
        from .staging import unprofiled_stage

        _say_unknown(unknown)
        stage_args = [o.value for o in parsed.stune if o.key == "stune:stage"]
        stage_env, stage_options, stage_warnings = unprofiled_stage(stage_args, eff, os.getcwd())
        words = sbatch_words(argv, parsed, stage_options)
        if as_json:
            from ..output import print_json

            print_json({"submitted": False, "partition": exc.partition, "profile": None, "note": str(exc),
                        "sbatch": ["sbatch", *words], "env": stage_env, "warnings": list(stage_warnings)})
            return 0
        if dry_run:
            print(f"{PROG} --dry-run: {exc}; the job would be submitted without stune settings:")
            from .dryrun import command_text

            print("  " + command_text(["sbatch", *words]))
            for name, value in stage_env.items():
                print(f"  {name}={value}")
            for text_ in stage_warnings:
                print(f"warning: {text_}")
            return 0
        rc = _sbatch(slurm, words, stdin_bytes, dict(environ, **stage_env))
        if rc == 0 and exc.partition:
            warn(f"note: {exc}; submitted without stune settings")
        for text_ in stage_warnings:
            warn(f"warning: {text_}")
        return rc
    except StuneError as exc:
        if dry_run or _stage_error(exc):
            raise
        _say_unknown(unknown)
        warn(f"warning: {exc}; submitting without stune settings")
        return _sbatch(slurm, sbatch_words(argv, parsed, []), stdin_bytes, environ)
    except Exception as exc:  # a bug in stune must not stop a submission: fail open, loudly
        if dry_run or environ.get("STUNE_DEBUG"):
            raise
        _say_unknown(unknown)
        warn(f"warning: internal error: {type(exc).__name__}: {exc}; submitting without stune settings "
             "(set STUNE_DEBUG=1 for a traceback)")
        return _sbatch(slurm, sbatch_words(argv, parsed, []), stdin_bytes, environ)
    words = sbatch_words(argv, parsed, plan.options)
    if dry_run:
        from .dryrun import explain, explain_doc

        if as_json:
            from ..output import print_json

            print_json(explain_doc(plan, words, script_label))
        else:
            sys.stdout.write(explain(plan, words, script_label))
        return 0
    for text_ in plan.warnings:
        warn(f"warning: {text_}")
    env = dict(environ)
    for name in plan.unset:
        env.pop(name, None)
    env.update(plan.env)
    sys.stdout.flush()
    submitted = {"time": int(time.time()), "cwd": os.getcwd()}  # now: with --wait, sbatch returns at the job's end
    rc, stdout = slurm.sbatch_passthrough(words, stdin_bytes, env)
    # A job id in the output means a submission, whatever the exit status (--wait returns the job's);
    # rc 0 without one is a --quiet submission. --test-only submits nothing.
    if (rc == 0 or job_id_from(stdout)[0]) and eff.get("test-only") is None:
        _record(submitted, argv, words, plan, eff, environ, script_label, text, stdout)
    return rc


def _help(slurm, environ) -> int:
    """sbatch's help when sbatch can give it (it needs a Slurm configuration), then stune's; always exit 0."""
    from .optable import ask_sbatch

    text = ask_sbatch(slurm, environ)
    if text:
        sys.stdout.write(text)
    else:
        sys.stdout.write(f"Usage: {PROG} [sbatch options] [stune-sbatch options] [script [args...]]\n"
                         "(sbatch's own options: `sbatch --help`, which cannot answer here: no reachable Slurm "
                         "configuration, or no sbatch)\n")
    sys.stdout.write(STUNE_HELP)
    return 0


def _unreadable(path: str) -> str | None:
    """Why sbatch could not open the batch script `path` (it refuses the submission), else None."""
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"cannot open the batch script {path!r}: {exc.strerror}"
    return None


def _say_unknown(unknown: list[str]) -> None:
    for line in unknown:
        warn(f"warning: {line}")


class _NoProfile(StuneError):
    def __init__(self, message: str, partition: str | None):
        self.partition = partition
        super().__init__(message)


def _stage_error(exc: StuneError) -> bool:
    from ..stage.errors import StageRequestError

    return isinstance(exc, StageRequestError)  # a bad --stage is the user's to fix: refuse


def make_plan(argv, parsed, eff: Effective, environ, slurm, het: bool, script: str | None = None,
              unknown: list[str] | None = None):
    from ..profilestore import load_profile, profile_dir
    from .plan import build_plan

    opt = eff.get("partition")
    if opt is not None and opt.value:
        partition, source = opt.value, ("command line" if opt.where == "command line" else opt.where)
    else:
        try:
            partition, source = slurm.queries().default_partition(), "Slurm's default partition"
        except StuneError:
            raise _NoProfile("cannot ask Slurm for its default partition", None) from None
        if not partition:
            raise _NoProfile("Slurm has no default partition", None)
    first = partition.split(",")[0].strip()
    try:
        profile = load_profile(first)
    except NoProfileError:
        raise _NoProfile(f"partition {first!r} has no stune profile in {profile_dir()}", first) from None
    if first != partition:
        source += f"; the profile of {first!r}, the first of {partition!r}"
    stage_args = [o.value for o in parsed.stune if o.key == "stune:stage"]
    stage_required = any(o.key == "stune:stage-required" for o in parsed.stune)

    def degraded_nodes() -> list[str]:
        from ..nodestate import DEGRADED_FEATURE

        features = slurm.queries().node_features(partition)
        return sorted(n for n, feats in features.items() if DEGRADED_FEATURE in feats)

    wrap = eff.get("wrap")
    return build_plan(partition=partition, partition_source=source, profile=profile, eff=eff, environ=environ,
                      cwd=os.getcwd(), stage_args=stage_args, stage_required=stage_required,
                      degraded_nodes=degraded_nodes, het=het,
                      script=wrap.value if wrap is not None and wrap.value else script,
                      checkpoint_signal=any(o.key == "stune:checkpoint-signal" for o in parsed.stune),
                      stage_strict=any(o.key == "stune:stage-strict" for o in parsed.stune),
                      node_summary=any(o.key == "stune:node-summary" for o in parsed.stune),
                      unknown=unknown or [])


def _stdin_buffer():
    return getattr(sys.stdin, "buffer", None)


def _sbatch(slurm, words: list[str], stdin_bytes: bytes | None, environ) -> int:
    sys.stdout.flush()
    rc, _ = slurm.sbatch_passthrough(words, stdin_bytes, dict(environ))
    return rc


def _entry(submitted: dict, argv, words, plan, eff, environ, script_label: str,
           script_text: str | None = None) -> dict:
    """The history record of this submission (`submitted`: its time and directory), all but the job id."""
    from . import history
    from .export import job_environment, parse_export

    return {
        "time": submitted["time"], "job_id": None, "cluster": None, "partition": plan.partition,
        "argv": list(argv), "sbatch": words, "added": plan.options, "cwd": submitted["cwd"], "script": script_label,
        "profile": plan.profile.source, "digest": plan.profile.digest,
        "script_sha256": (history.sha256(script_text.encode("utf-8", "surrogateescape")).hexdigest()[:16]
                          if script_text is not None else None),
        "env": history.recorded_env(job_environment(plan.env, parse_export(eff.get("export")), environ)),
    }


def _record(submitted: dict, argv, words, plan, eff, environ, script_label, text, stdout: str) -> None:
    """The submission's entry in the user's history. After sbatch, not while it runs: overlapped, the two
    processes slowed each other more than the overlap saved (docs/speed.md)."""
    from . import history

    try:
        entry = _entry(submitted, argv, words, plan, eff, environ, script_label, text)
    except Exception as exc:  # the history must never cost the user their submission
        warn(f"warning: job submitted, but the history was not written: {type(exc).__name__}: {exc}")
        return
    entry["job_id"], entry["cluster"] = job_id_from(stdout)
    try:
        history.record(entry, environ)
    except OSError as exc:  # the job is submitted; a history that cannot be written must not hide that
        warn(f"warning: job submitted, but the history was not written: {exc}")  # names the file
