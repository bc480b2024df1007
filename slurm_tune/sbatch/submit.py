"""The submission, in stages: what the user asked (request.py: the command line, the script, the options in
effect, read once into one Request), the plan (the partition, its profile, plan.build_plan), then the dry
run's explanation, or sbatch and the history.

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
from . import PROG

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
    """The submission, in stages: what the user asked (request.read_request, read once), the plan
    (make_plan), then the dry run's explanation or sbatch and the history. Where stune cannot help, the
    user's words go to sbatch as given (_refused, _unprofiled, _plain)."""
    # One copy of os.environ: each later dict() of it (the job's environment, the history's) is then a plain
    # dict's copy, not one more decoding of every variable.
    environ = dict(os.environ) if environ is None else environ
    if slurm is None:  # the commands alone: a plain submission asks Slurm nothing (_queries when it must)
        from ..slurm.commands import SlurmCommands

        slurm = SlurmCommands.from_env()
    from .request import read_request

    req = read_request(argv, environ, stdin if stdin is not None else _stdin_buffer(), slurm)
    if req.help:
        return _help(slurm, environ)
    if req.refusal is not None or req.info or req.eff is None:
        return _refused(req, slurm, environ)
    try:
        plan = make_plan(req, environ, slurm)
    except _NoProfile as exc:
        return _unprofiled(req, exc, slurm, environ)
    except StuneError as exc:
        if req.dry_run or _stage_error(exc):
            raise
        return _plain(req, slurm, environ, f"warning: {exc}; submitting without stune settings")
    except Exception as exc:  # a bug in stune must not stop a submission: fail open, loudly
        if req.dry_run or environ.get("STUNE_DEBUG"):
            raise
        return _plain(
            req,
            slurm,
            environ,
            f"warning: internal error: {type(exc).__name__}: {exc}; submitting "
            "without stune settings (set STUNE_DEBUG=1 for a traceback)",
        )
    words = sbatch_words(argv, req.parsed, plan.options)
    if req.dry_run:
        return _explain(req, plan, words)
    return _submit(req, plan, words, slurm, environ)


def _refused(req, slurm, environ) -> int:
    """A command line or script sbatch refuses, or one after which sbatch only prints (--usage, --version):
    sbatch gets the user's words as given (a dry run says what sbatch would refuse)."""
    refusal = req.refusal
    if req.dry_run:
        for problem in refusal.problems if refusal else ():
            warn(f"sbatch would refuse {refusal.what}: {problem}")
        return 2 if refusal else 0
    if refusal:
        warn(
            f"warning: sbatch will refuse {refusal.what} ({'; '.join(refusal.problems)}): passed to it as given, "
            "without stune's settings"
        )
    return _sbatch(slurm, sbatch_words(req.argv, req.parsed, []), req.stdin_bytes, environ)


def _plain(req, slurm, environ, why: str) -> int:
    """Plain sbatch with the user's words, after saying why (a broken profile, a bug in stune)."""
    _say_unknown(req.unknown)
    warn(why)
    return _sbatch(slurm, sbatch_words(req.argv, req.parsed, []), req.stdin_bytes, environ)


def _unprofiled(req, exc: _NoProfile, slurm, environ) -> int:
    """A partition without a profile: plain sbatch, but each --stage dataset's variable at its source."""
    from .staging import unprofiled_stage

    _say_unknown(req.unknown)
    stage_env, stage_options, stage_warnings = unprofiled_stage(req.stage_args, req.eff, os.getcwd())
    words = sbatch_words(req.argv, req.parsed, stage_options)
    if req.as_json:
        from ..output import print_json

        print_json(
            {
                "submitted": False,
                "partition": exc.partition,
                "profile": None,
                "note": str(exc),
                "sbatch": ["sbatch", *words],
                "env": stage_env,
                "warnings": list(stage_warnings),
            }
        )
        return 0
    if req.dry_run:
        from .dryrun import command_text

        print(f"{PROG} --dry-run: {exc}; the job would be submitted without stune settings:")
        print("  " + command_text(["sbatch", *words]))
        for name, value in stage_env.items():
            print(f"  {name}={value}")
        for text in stage_warnings:
            print(f"warning: {text}")
        return 0
    rc = _sbatch(slurm, words, req.stdin_bytes, dict(environ, **stage_env))
    if rc == 0 and exc.partition:
        warn(f"note: {exc}; submitted without stune settings")
    for text in stage_warnings:
        warn(f"warning: {text}")
    return rc


def _explain(req, plan, words: list[str]) -> int:
    from .dryrun import explain, explain_doc

    if req.as_json:
        from ..output import print_json

        print_json(explain_doc(plan, words, req.label))
    else:
        sys.stdout.write(explain(plan, words, req.label))
    return 0


def _submit(req, plan, words: list[str], slurm, environ) -> int:
    """sbatch with stune's settings, then the history (a job id in the output means a submission)."""
    for text in plan.warnings:
        warn(f"warning: {text}")
    env = dict(environ)
    for name in plan.unset:
        env.pop(name, None)
    env.update(plan.env)
    sys.stdout.flush()
    submitted = {
        "time": int(time.time()),
        "cwd": os.getcwd(),
    }  # now: with --wait, sbatch returns at the job's end
    rc, stdout = slurm.sbatch_passthrough(words, req.stdin_bytes, env)
    # A job id in the output means a submission, whatever the exit status (--wait returns the job's);
    # rc 0 without one is a --quiet submission. --test-only submits nothing.
    if (rc == 0 or job_id_from(stdout)[0]) and req.eff.get("test-only") is None:
        _record(submitted, req, words, plan, environ, stdout)
    return rc


def _help(slurm, environ) -> int:
    """sbatch's help when sbatch can give it (it needs a Slurm configuration), then stune's; always exit 0."""
    from .optable import ask_sbatch

    text = ask_sbatch(slurm, environ)
    if text:
        sys.stdout.write(text)
    else:
        sys.stdout.write(
            f"Usage: {PROG} [sbatch options] [stune-sbatch options] [script [args...]]\n"
            "(sbatch's own options: `sbatch --help`, which cannot answer here: no reachable Slurm "
            "configuration, or no sbatch)\n"
        )
    sys.stdout.write(STUNE_HELP)
    return 0


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


def _queries(slurm):
    """The adapter's queries on the submission's handle, for the rare path that asks Slurm something (its
    default partition, its nodes' features): the commands alone (SlurmCommands, a plain submission's) become
    the whole adapter, loaded only here; any other handle (a Slurm, a test's stand-in) answers as it is."""
    from ..slurm.commands import SlurmCommands

    if not isinstance(slurm, SlurmCommands):
        return slurm
    from ..slurm.adapter import queries_on

    return queries_on(slurm)


def make_plan(req, environ, slurm):
    """The plan for the Request `req`: its partition (the options in effect, else Slurm's default), that
    partition's profile, then plan.build_plan. Raises _NoProfile when there is no profile to apply."""
    from ..profilestore import load_profile, profile_dir
    from .plan import build_plan

    opt = req.eff.get("partition")
    if opt is not None and opt.value:
        partition, source = opt.value, ("command line" if opt.where == "command line" else opt.where)
    else:
        try:
            partition, source = _queries(slurm).default_partition(), "Slurm's default partition"
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

    def degraded_nodes() -> list[str]:
        from ..nodestate import DEGRADED_FEATURE

        features = _queries(slurm).node_features(partition)
        return sorted(n for n, feats in features.items() if DEGRADED_FEATURE in feats)

    return build_plan(
        partition=partition,
        partition_source=source,
        profile=profile,
        eff=req.eff,
        environ=environ,
        cwd=os.getcwd(),
        stage_args=req.stage_args,
        stage_required=req.stage_required,
        degraded_nodes=degraded_nodes,
        het=req.het,
        script=req.script,
        checkpoint_signal=req.checkpoint_signal,
        stage_strict=req.stage_strict,
        node_summary=req.node_summary,
        unknown=req.unknown,
        requeue_option=lambda expedite: _queries(slurm).requeue_option(expedite),
    )


def _stdin_buffer():
    return getattr(sys.stdin, "buffer", None)


def _sbatch(slurm, words: list[str], stdin_bytes: bytes | None, environ) -> int:
    sys.stdout.flush()
    rc, _ = slurm.sbatch_passthrough(words, stdin_bytes, dict(environ))
    return rc


def _entry(submitted: dict, req, words, plan, environ) -> dict:
    """The history record of this submission (`submitted`: its time and directory), all but the job id."""
    from . import history
    from .export import job_environment, parse_export

    text = req.text
    return {
        "time": submitted["time"],
        "job_id": None,
        "cluster": None,
        "partition": plan.partition,
        "argv": list(req.argv),
        "sbatch": words,
        "added": plan.options,
        "cwd": submitted["cwd"],
        "script": req.label,
        "profile": plan.profile.source,
        "digest": plan.profile.digest,
        "script_sha256": (
            history.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]
            if text is not None
            else None
        ),
        "env": history.recorded_env(job_environment(plan.env, parse_export(req.eff.get("export")), environ)),
    }


def _record(submitted: dict, req, words, plan, environ, stdout: str) -> None:
    """The submission's entry in the user's history. After sbatch, not while it runs: overlapped, the two
    processes slowed each other more than the overlap saved (docs/speed.md)."""
    from . import history

    try:
        entry = _entry(submitted, req, words, plan, environ)
    except Exception as exc:  # the history must never cost the user their submission
        warn(f"warning: job submitted, but the history was not written: {type(exc).__name__}: {exc}")
        return
    entry["job_id"], entry["cluster"] = job_id_from(stdout)
    try:
        history.record(entry, environ)
    except OSError as exc:  # the job is submitted; a history that cannot be written must not hide that
        warn(f"warning: job submitted, but the history was not written: {exc}")  # names the file
