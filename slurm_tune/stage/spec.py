"""What a job asks to stage: `SRC[:NAME]` requests and their encoding in the job environment.

stune-sbatch parses `--stage SRC[:NAME]` (repeatable) with `parse_stage_arg`, and puts
`encode_requests(requests, required)` in the job's STUNE_STAGE variable; the TaskProlog decodes it on every
node. This module runs inside stune-sbatch and the TaskProlog, so its imports stay light (`os`,
`collections`, `thisnode`).

The encoded form is readable text, one field per `;`:

    v1;optional;IMAGENET=/lustre/datasets/imagenet;COCO=/lustre/coco.tar

A source path escapes `%` as `%25` and `;` as `%3B` (names cannot hold either).
"""

from __future__ import annotations

import os

from ..frozen import Record
from ..thisnode import STAGE_VAR as ENV_VAR
from .errors import StageRequestError

EXPORT_PREFIX = "STUNE_STAGE_"
LOG_VAR = "STUNE_STAGE_LOG"  # the job's stderr file for stage messages (stage.jobenv.JobLog); not a dataset
FORMAT = "v1"
MAX_NAME = 64
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_REST = _NAME_FIRST | frozenset("0123456789")
# Archive suffixes, longest first: a default NAME drops them ("imagenet.tar.gz" -> "IMAGENET").
ARCHIVE_SUFFIXES = (
    ".tar.gz",
    ".tar.bz2",
    ".tar.xz",
    ".tar.zst",
    ".tar.zstd",
    ".tgz",
    ".tbz2",
    ".txz",
    ".tzst",
    ".tar",
)


class StageRequest(Record):
    """Stage `source` (an absolute, normalized path) and export it as STUNE_STAGE_<name>."""

    __slots__ = ("source", "name")
    source: str
    name: str

    @property
    def variable(self) -> str:
        return EXPORT_PREFIX + self.name

    def __str__(self):
        return f"{self.source}:{self.name}"


def check_name(name: str, arg: str | None = None) -> str:
    """NAME must make a valid environment variable suffix: letters, digits, `_`, not starting with a digit.
    That also rules out `/`, `..` and the empty name."""
    where = f"--stage {arg!r}: " if arg is not None else ""
    if not name:
        raise StageRequestError(f"{where}NAME is empty (use SRC or SRC:NAME)")
    if "/" in name or ".." in name:
        raise StageRequestError(
            f"{where}NAME {name!r} must not contain '/' or '..': it names a variable, not a path"
        )
    if len(name) > MAX_NAME:
        raise StageRequestError(f"{where}NAME {name!r} is longer than {MAX_NAME} characters")
    if name[0] not in _NAME_FIRST or any(c not in _NAME_REST for c in name):
        raise StageRequestError(
            f"{where}NAME {name!r} is not a valid variable suffix for "
            f"{EXPORT_PREFIX}<NAME> (letters, digits and '_'; not starting with a digit)"
        )
    return name


def default_name(source: str) -> str:
    """The NAME for a bare SRC: its basename without an archive suffix, upper-cased, other characters
    turned into `_` ("/data/imagenet-1k.tar.gz" -> "IMAGENET_1K")."""
    base = os.path.basename(source.rstrip("/"))
    lower = base.lower()
    for suffix in ARCHIVE_SUFFIXES:
        if lower.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    name = "".join(c if c in _NAME_REST else "_" for c in base.upper())
    if name and name[0].isdigit():
        name = "_" + name
    return name[:MAX_NAME]


def check_source(source: str, cwd: str | None = None, arg: str | None = None) -> str:
    """An absolute, normalized source path. A relative SRC is taken from `cwd` (the submission directory,
    where the job also starts), but one that climbs out of it with `..` is refused."""
    where = f"--stage {arg!r}: " if arg is not None else ""
    if not source:
        raise StageRequestError(f"{where}SRC is empty")
    if "\0" in source or "\n" in source:
        raise StageRequestError(f"{where}SRC contains a NUL or newline")
    if not source.startswith("/"):
        if ".." in source.split("/"):
            raise StageRequestError(
                f"{where}SRC {source!r} climbs out of the submission directory with '..'; "
                "give an absolute path"
            )
        source = os.path.join(cwd or os.getcwd(), source)
    resolved = os.path.normpath(source)
    if resolved.startswith("//"):  # normpath keeps a POSIX double slash
        resolved = "/" + resolved.lstrip("/")
    if not resolved.startswith("/"):
        raise StageRequestError(f"{where}SRC {source!r} is not an absolute path")
    if resolved == "/":
        raise StageRequestError(f"{where}SRC must not be the root directory")
    return resolved


def parse_stage_arg(text: str, cwd: str | None = None) -> StageRequest:
    """Parse one `--stage SRC[:NAME]` value. The NAME is after the last `:`; without one, NAME comes from
    the source's basename. Raises StageRequestError with a one-line message naming the argument."""
    if not isinstance(text, str) or not text.strip():
        raise StageRequestError("--stage needs SRC or SRC:NAME")
    text = text.strip()
    src, sep, name = text.rpartition(":")
    if not sep:
        src, name = text, ""
    source = check_source(src, cwd, text)
    if not sep:
        name = default_name(source)
        if not name:
            raise StageRequestError(f"--stage {text!r}: cannot make a NAME from the source; use SRC:NAME")
    return StageRequest(source, check_name(name, text))


def parse_profile_stage(entries, cwd: str = "/") -> list[StageRequest]:
    """A profile's `cache.stage` list (the same SRC[:NAME] syntax; relative paths are refused there)."""
    out = []
    for entry in entries or ():
        if not str(entry).startswith("/"):
            raise StageRequestError(f"cache.stage entry {entry!r}: SRC must be an absolute path")
        out.append(parse_stage_arg(str(entry), cwd))
    return out


def merge_requests(defaults, requests) -> list[StageRequest]:
    """Profile defaults first, then the job's own; a job's request replaces a default with the same NAME."""
    mine = {r.name for r in requests}
    return [r for r in defaults if r.name not in mine] + list(requests)


def _escape(path: str) -> str:
    return path.replace("%", "%25").replace(";", "%3B")


def _unescape(text: str) -> str:
    return text.replace("%3B", ";").replace("%3b", ";").replace("%25", "%")


def encode_requests(requests, required: bool) -> str:
    """The STUNE_STAGE value for these requests. Duplicate NAMEs are refused (each is one variable)."""
    seen: dict[str, str] = {}
    fields = [FORMAT, "required" if required else "optional"]
    for req in requests:
        check_name(req.name)
        if check_source(req.source) != req.source:
            raise StageRequestError(f"source {req.source!r} is not an absolute, normalized path")
        if req.name in seen:
            raise StageRequestError(
                f"--stage NAME {req.name!r} is given twice ({seen[req.name]} and {req.source})"
            )
        seen[req.name] = req.source
        fields.append(f"{req.name}={_escape(req.source)}")
    return ";".join(fields)


def decode_requests(text: str) -> tuple[list[StageRequest], bool]:
    """(requests, required) from a STUNE_STAGE value; every field is re-checked (the value is user input)."""
    fields = (text or "").rstrip("\n").split(";")
    if fields[0] != FORMAT or len(fields) < 2 or fields[1] not in ("required", "optional"):
        raise StageRequestError(
            f"{ENV_VAR}={text!r} is not a stage request list "
            f"(expected '{FORMAT};optional|required;NAME=SRC;...')"
        )
    required = fields[1] == "required"
    requests, names = [], set()
    for field in fields[2:]:
        if not field:
            continue
        name, sep, source = field.partition("=")
        if not sep:
            raise StageRequestError(f"{ENV_VAR}: field {field!r} is not NAME=SRC")
        req = StageRequest(check_source(_unescape(source)), check_name(name))
        if req.source != _unescape(source):
            raise StageRequestError(
                f"{ENV_VAR}: source {_unescape(source)!r} is not an absolute, normalized path"
            )
        if name in names:
            raise StageRequestError(f"{ENV_VAR}: NAME {name!r} is given twice")
        names.add(name)
        requests.append(req)
    return requests, required
