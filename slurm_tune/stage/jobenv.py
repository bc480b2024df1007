"""The job side of staging: what the TaskProlog (and `stune-env`, `stune-stage fetch`) call before a task.

    exports, messages = prepare_for_task(job, progress=JobLog(os.environ))

takes the job context its entry point built (thisnode.JobContext: node, partition, profile, job id,
environment), reads STUNE_STAGE (stune-sbatch's encoded `--stage` list) and the profile's `cache.stage`
defaults, stages each request once per node per job (the first task copies, concurrent tasks wait on the
source's lock, later tasks find the job's hold), and returns `{"STUNE_STAGE_<NAME>": local path}` plus
one-line messages for the job's stderr. When the tier is missing, full or over quota, the variable names the
source and a warning says why; with --stage-required it raises StageRequiredError instead.

How a TaskProlog turns that into output (verified on Slurm 22.05):
- print `export NAME=VALUE` lines on stdout: Slurm sets them in the task's environment;
- a TaskProlog's stderr goes to /dev/null, and `print TEXT` lines reach the task's stdout only after the
  TaskProlog exits: so messages and live progress go to the job's stderr file (JobLog);
- on StageRequiredError, exit non-zero: slurmstepd logs "TaskProlog failed status=N" to the job's stderr,
  the task never starts, and the job ends FAILED with exit code N (the node is not drained).

This module is on the TaskProlog path: the copy machinery (subprocess, tempfile) loads only on a miss.
"""

from __future__ import annotations

import os

from ..errors import StuneError
from ..frozen import Record
from ..streams import say
from .errors import SourceError, StageRequestError, StageRequiredError, TierUnavailable
from .spec import ENV_VAR, LOG_VAR, StageRequest, decode_requests, merge_requests, parse_profile_stage

TYPE_CHECKING = False  # typing's own flag costs importing typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:  # for annotations only: tier is imported when a task stages
    from .tier import TierConfig


def prepare_for_task(job, progress=None) -> tuple[dict[str, str], list[str]]:
    """Stage the datasets of `job` (a thisnode.JobContext) on its node; return (exports, messages).
    `progress` is a writable text stream for live progress lines and the messages (None: neither is
    written). Raises StageRequiredError (a StuneError) when the job asked for --stage-required and a dataset
    could not be staged, and StageRequestError when STUNE_STAGE is malformed."""
    stage = resolve(job)
    if not stage.requests:
        return {}, []
    freshness = job.environ.get(FRESHNESS_VAR) or None
    if freshness not in (None, "fast", "strict"):
        freshness = None  # user input: an unknown mode keeps the tier's own
    return stage_requests(
        stage.requests,
        stage.required,
        stage.config,
        stage.job_id,
        progress,
        problem=stage.problem,
        freshness=freshness,
    )


# stune-sbatch --stage-strict sets it: this job's requests are checked with `strict` freshness (every file's
# size and mtime), whatever the tier's cache.freshness.
FRESHNESS_VAR = "STUNE_FRESHNESS"  # not STUNE_STAGE_*: that prefix names datasets


class JobStage(Record):
    """What a task must stage: requests (profile defaults merged), the tier (config) or why there is none
    (problem, a TierUnavailable), and the job id holds are taken for."""

    __slots__ = ("requests", "required", "config", "problem", "job_id")
    requests: list[StageRequest]
    required: bool
    config: TierConfig | None
    problem: TierUnavailable | None
    job_id: str | None


def resolve(job, with_defaults: bool = True) -> JobStage:
    """What `job` (a thisnode.JobContext: its profile is loaded, or profile_error says why not) stages:
    STUNE_STAGE's requests, after the profile's `cache.stage` defaults unless `with_defaults` is False."""
    text = job.environ.get(ENV_VAR, "")
    requests, required = decode_requests(text) if text.strip() else ([], False)
    profile, problem = job.profile, _no_profile(job)
    if profile is not None and with_defaults:
        try:
            requests = merge_requests(parse_profile_stage(profile.cache.stage), requests)
        except StageRequestError as exc:
            problem = TierUnavailable("missing", f"profile {job.partition!r}: {exc}")
    config = None
    if profile is not None and problem is None and requests:
        from .tier import TierConfig

        try:
            config = TierConfig.from_profile(profile, job.node)
        except TierUnavailable as exc:
            problem = exc
    return JobStage(requests, required, config, problem, job.job_id)


def stage_requests(
    requests,
    required: bool,
    config,
    job_id: str | None,
    progress=None,
    problem=None,
    jobs: int | None = None,
    freshness: str | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Stage each request into `config`'s tier (or fall back, for `problem`): (exports, messages)."""
    exports: dict[str, str] = {}
    messages: list[str] = []
    for req in requests:
        path, message = _stage_one(req, config, problem, job_id, required, progress, jobs, freshness)
        exports[req.variable] = path
        if message:
            messages.append(message)
            say(progress, message)
    return exports, messages


def _no_profile(job) -> TierUnavailable | None:
    """Why `job` has no profile to take a cache tier from (None: it has one)."""
    if job.profile is not None:
        return None
    if not job.partition:
        return TierUnavailable("missing", "SLURM_JOB_PARTITION is not set: no cache tier to stage into")
    why = job.profile_error or "its profile was not loaded"
    return TierUnavailable("missing", f"no cache tier for partition {job.partition!r}: {why}")


def _stage_one(req, config, problem, job_id, required, progress, jobs, freshness=None) -> tuple[str, str]:
    from .stager import stage

    try:
        if problem is not None:
            raise problem
        result = stage(req, config, job_id=job_id, progress_stream=progress, jobs=jobs, freshness=freshness)
    except (TierUnavailable, SourceError) as exc:
        return _fallback(req, exc, required)
    except StuneError as exc:
        return _fallback(req, TierUnavailable("copy-failed", str(exc)), required)
    except OSError as exc:  # the tier's disk misbehaving: the job can still read the source
        return _fallback(req, TierUnavailable("copy-failed", f"{exc.strerror or exc}"), required)
    except Exception as exc:  # a bug in stune must not kill the job, unless it insisted on a local copy
        return _fallback(
            req, TierUnavailable("copy-failed", f"internal error: {type(exc).__name__}: {exc}"), required
        )
    if result.status == "fallback":  # an earlier task of this job on this node already fell back
        if required:
            raise StageRequiredError(req.name, TierUnavailable("copy-failed", result.note or "not staged"))
        return req.source, ""
    return result.path, result.message()


def _fallback(req, exc: StuneError, required: bool) -> tuple[str, str]:
    if required:
        raise StageRequiredError(req.name, exc)
    return req.source, (
        f"stune-stage: warning: {req.name}: not staged ({exc}); "
        f"{req.variable} points at the source {req.source}"
    )


class JobLog:
    """A text stream onto the job's stderr file, opened at the first write (a cache hit writes nothing,
    so it costs nothing). The path is $STUNE_STAGE_LOG (spec.LOG_VAR) when set (stune-sbatch may pass it), else the
    job's StdErr from `scontrol show job` with %N expanded. Unresolvable: writes are dropped."""

    def __init__(self, environ, slurm=None):
        self.environ, self.slurm = environ, slurm
        self._fd: int | None = None
        self._tried = False

    def path(self) -> str | None:
        if not hasattr(self, "_path"):  # asked once: it may cost an scontrol call
            self._path = self._resolve()
        return self._path

    def _resolve(self) -> str | None:
        explicit = self.environ.get(LOG_VAR)
        if explicit:
            return explicit
        job_id = self.environ.get("SLURM_JOB_ID", "")
        if not job_id.isdigit():
            return None
        from ..slurm import Slurm

        slurm = self.slurm or Slurm.from_env(timeout=10)
        try:
            record = slurm.job_record(job_id)
        except StuneError:
            return None
        path = record.get("StdErr") or record.get("StdOut")
        if (
            path and "%N" in path
        ):  # slurmd's %N is its short host name, not the NodeName (fname.c: conf->hostname)
            from ..thisnode import host_name

            path = path.replace("%N", host_name())
        return path if path and "%" not in path else None

    def write(self, text: str) -> int:
        if not self._tried:
            self._tried = True
            path = self.path()
            if path:
                try:
                    self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC)
                except OSError:
                    self._fd = None
        if self._fd is not None:
            try:
                os.write(self._fd, text.encode("utf-8", "replace"))
            except OSError:
                pass
        return len(text)

    def flush(self) -> None:
        pass

    HEAD = 1 << 18

    def say_once(self, text: str, node: str) -> None:
        """Write `text` once per job: skipped when the job's stderr file already holds it (another node or an
        earlier step said it; the messages come before a step's output, so the file's first 256 KiB are
        read). Nodes that start at the same instant may both say it."""
        path = self.path()
        if path:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
                try:
                    head = os.read(fd, self.HEAD)
                finally:
                    os.close(fd)
                if (text + " [").encode("utf-8", "replace") in head:
                    return
            except OSError:
                pass
        self.write(f"{text} [{node}; said once per job]\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
