"""`stune-task-prolog`: the TaskProlog. Per-node NCCL and rendezvous variables, then dataset staging.

Install with `TaskProlog=/path/to/stune-task-prolog` in slurm.conf (or a wrapper script that sets PATH and
STUNE_* first). Slurm runs it as the job's user before every task, with the task's environment, and reads
`export NAME=value` / `unset NAME` lines from its stdout. Its stderr goes nowhere, so messages go to the
job's stderr file: each problem once per job (the first node to see it says so, naming itself), and with
`stune-sbatch --node-summary` one line per node and step with the final settings. It never fails a task
for a stune problem; only a dataset that --stage-required could not stage fails it.

    stune-task-prolog            (run by slurmstepd; no arguments)
    stune-task-prolog --help
"""

from __future__ import annotations

import os
import sys

from .common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, run_console

PROG = "stune-task-prolog"


def _main(argv: list[str]) -> int:
    if argv:
        if argv[0] in ("-h", "--help"):
            sys.stdout.write(__doc__)
            return EXIT_OK
        sys.stderr.write(f"{PROG}: takes no arguments (Slurm runs it as TaskProlog); see --help\n")
        return EXIT_USAGE
    from ..thisnode import job_context

    job = job_context(os.environ)  # the one place this task's node, partition and job are read
    if not job.partition:
        return EXIT_OK
    from ..errors import NoProfileError, StuneError
    from ..profilestore import load_profile

    log = _JobLogOnUse(job.environ)
    speak = job.environ.get("SLURM_LOCALID", "0") in ("", "0")
    job = job.with_profile(load_profile)
    if job.profile is None:
        exc = job.profile_error
        if speak and not isinstance(exc, NoProfileError):
            log.say_once(f"{PROG}: warning: {exc}; no stune settings for this task", job.node)
        return EXIT_OK
    from ..nodeenv.managed import SUMMARY_VAR
    from ..nodeenv.taskenv import as_taskprolog, task_environment

    try:
        exports, messages = task_environment(job, progress=log)
    except StuneError as exc:  # --stage-required could not stage: the task must not start
        log.write(f"{PROG}: {exc}\n")
        return EXIT_ERROR
    sys.stdout.write(as_taskprolog(exports))
    sys.stdout.flush()
    if speak:
        for message in messages:
            log.say_once(f"{PROG}: {message}", job.node)
        if job.environ.get(SUMMARY_VAR):
            log.write(summary_line(job, exports) + "\n")
    return EXIT_OK


class _JobLogOnUse:
    """stage.jobenv.JobLog, imported and made at the first write: a task with nothing to say and nothing to
    stage (the common case) never loads the stage package."""

    def __init__(self, environ):
        self.environ, self._log = environ, None

    def _open(self):
        if self._log is None:
            from ..stage.jobenv import JobLog

            self._log = JobLog(self.environ)
        return self._log

    def write(self, text: str) -> int:
        return self._open().write(text)

    def flush(self) -> None:
        pass

    def say_once(self, text: str, node: str) -> None:
        self._open().say_once(text, node)


def summary_line(job, exports: dict) -> str:
    """One line: the settings this node's tasks finally get, and where each staged dataset is read from."""
    from ..nodeenv.envrules import NODE_NAMES
    from ..nodeenv.managed import BATCH_STEP_IDS
    from ..stage.spec import EXPORT_PREFIX, LOG_VAR

    environ = job.environ
    final = dict(environ)
    for name, value in exports.items():
        if value is None:
            final.pop(name, None)
        else:
            final[name] = value
    step = environ.get("SLURM_STEP_ID") or "batch"  # the batch step's TaskProlog has none
    step = "batch" if step in BATCH_STEP_IDS else step
    words = [f"{name}={final[name]}" if name in final else f"{name}=-" for name in NODE_NAMES]
    for name in sorted(n for n in final if n.startswith(EXPORT_PREFIX) and n != LOG_VAR):
        source = _stage_source(environ, name[len(EXPORT_PREFIX) :])
        if source is None:  # a profile default: not in STUNE_STAGE
            words.append(f"{name}={final[name]}")
        else:
            words.append(
                f"{name}={final[name]} [{'source: not staged' if final[name] == source else 'cache'}]"
            )
    return f"stune: {job.node} step {step}: " + " ".join(words)


def _stage_source(environ, name: str) -> str | None:
    from ..stage.spec import ENV_VAR, decode_requests

    text = environ.get(ENV_VAR, "")
    if not text.strip():
        return None
    try:
        requests, _ = decode_requests(text)
    except Exception:
        return None
    return next((r.source for r in requests if r.name == name), None)


def main(argv: list[str] | None = None) -> int:
    # internal_exit=0: a bug in stune must not stop the user's task.
    return run_console(PROG, _main, argv, internal_exit=0)
