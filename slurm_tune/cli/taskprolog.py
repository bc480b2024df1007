"""`stune-task-prolog`: the TaskProlog. Per-node NCCL variables, then dataset staging.

Install with `TaskProlog=/path/to/stune-task-prolog` in slurm.conf (or a wrapper script that sets PATH and
STUNE_* first). Slurm runs it as the job's user before every task, with the task's environment, and reads
`export NAME=value` lines from its stdout. Its stderr goes nowhere, so messages go to the job's stderr file
(once per node and step: from local task 0). It never fails a task for a stune problem; only a dataset
that --stage-required could not stage fails it.
"""
from __future__ import annotations

import os
import sys

from .common import run_console

PROG = "stune-task-prolog"


def _main(argv: list[str]) -> int:
    from ..errors import ConfigError, StuneError
    from ..stage.jobenv import JobLog

    environ = os.environ
    partition = environ.get("SLURM_JOB_PARTITION", "").split(",")[0]
    if not partition:
        return 0
    log = JobLog(environ)
    speak = environ.get("SLURM_LOCALID", "0") in ("", "0")
    from ..profiles import load_profile

    try:
        profile = load_profile(partition)
    except ConfigError as exc:
        if not (exc.key == "" and exc.problem.startswith("no profile for partition")) and speak:
            log.write(f"{PROG}: warning: {exc}; no stune settings for this task\n")
        return 0
    from ..nodeenv.taskenv import as_taskprolog, task_environment

    try:
        exports, messages = task_environment(environ, profile, progress=log)
    except StuneError as exc:  # --stage-required could not stage: the task must not start
        log.write(f"{PROG}: {exc}\n")
        return 1
    sys.stdout.write(as_taskprolog(exports))
    sys.stdout.flush()
    if speak:
        for message in messages:
            log.write(f"{PROG}: {message}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    # internal_exit=0: a bug in stune must not stop the user's task.
    return run_console(PROG, _main, argv, internal_exit=0)
