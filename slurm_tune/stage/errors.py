"""Errors of the staging tier, all in the StuneError family. Light: imported on the TaskProlog path."""

from __future__ import annotations

from ..errors import StuneError


class StageRequestError(StuneError):
    """A `--stage` argument or an encoded STUNE_STAGE value is malformed or unsafe."""


class SourceError(StuneError):
    """The source to stage is missing, unreadable, or of a kind stune cannot stage."""


class TierUnavailable(StuneError):
    """The cache tier cannot take this entry: it is missing, unsafe, full, or over quota. Without
    --stage-required the job then reads from the source. `kind` is one of KINDS."""

    KINDS = ("missing", "unsafe", "disk-full", "over-quota", "copy-failed")

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class StageRequiredError(StuneError):
    """A job asked for --stage-required and a dataset could not be staged: the TaskProlog must fail the
    task (exit non-zero) so the job fails cleanly instead of running against the source."""

    def __init__(self, name: str, cause: StuneError):
        self.name, self.cause = name, cause
        super().__init__(f"--stage-required: {name}: {cause}")
