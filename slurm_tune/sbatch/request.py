"""What the user asked stune-sbatch for, read once: the first stage of a submission (submit.py).

`read_request` reads the command line with the installed sbatch's option table (optable.learn, cached; asked
afresh when a word is unknown to a cached table), the batch script (file or stdin) and its `#SBATCH`
directives, and the options in effect (options.Effective: command line > SBATCH_* > directives). Everything
later stages need is in the one Request it returns; none of them reads the command line or the script again.
"""

from __future__ import annotations

from .directives import parse_directives
from .options import INFO_KEYS, Effective, Opt, ParsedArgs, parse_args


class Refusal:
    """What sbatch would refuse (stune then passes the words to sbatch as given, or a dry run says so):
    `what`: "this command line" or "this script's #SBATCH lines"; `problems`: sbatch's reasons."""

    __slots__ = ("what", "problems")

    def __init__(self, what: str, problems: list[str]):
        self.what, self.problems = what, problems


class Request:
    """The submission the user asked for. `parsed`: the command line (options.ParsedArgs); `eff`: the options
    in effect; `text`: the script's text (None: --wrap, or a script sbatch cannot open); `stdin_bytes`: what
    to feed sbatch (a script read from stdin); `label`: the script for the history (a path, `--wrap`,
    `<stdin>`); `het`: a heterogeneous job (`:` or `#SBATCH hetjob`); `unknown`: one warning line per word
    the option table cannot classify; `refusal`: what sbatch would refuse, else None; `info`: --usage or
    --version (sbatch only prints); `help`: --help. stune's own options: `dry_run`, `as_json`, `stage_args`
    (each --stage), `stage_required`, `stage_strict`, `checkpoint_signal`, `node_summary`."""

    __slots__ = (
        "argv",
        "parsed",
        "eff",
        "text",
        "stdin_bytes",
        "label",
        "het",
        "unknown",
        "refusal",
        "info",
        "help",
        "dry_run",
        "as_json",
        "stage_args",
        "stage_required",
        "stage_strict",
        "checkpoint_signal",
        "node_summary",
    )

    def __init__(self, argv: list[str], parsed: ParsedArgs):
        self.argv, self.parsed = argv, parsed
        self.eff: Effective | None = None
        self.text: str | None = None
        self.stdin_bytes: bytes | None = None
        self.label = ""
        self.het = parsed.het
        self.unknown: list[str] = list(parsed.unknown)
        self.refusal: Refusal | None = None
        self.info = self.help = False
        self._stune(parsed.stune)

    def _stune(self, stune: list[Opt]) -> None:
        keys = {o.key for o in stune}
        self.dry_run = "stune:dry-run" in keys
        self.as_json = self.dry_run and "stune:json" in keys
        self.stage_args = [o.value for o in stune if o.key == "stune:stage"]
        self.stage_required = "stune:stage-required" in keys
        self.stage_strict = "stune:stage-strict" in keys
        self.checkpoint_signal = "stune:checkpoint-signal" in keys
        self.node_summary = "stune:node-summary" in keys

    @property
    def script(self) -> str | None:
        """What a trap is looked for in: the --wrap command, else the script's text."""
        wrap = self.eff.get("wrap") if self.eff is not None else None
        return wrap.value if wrap is not None and wrap.value else self.text


def read_request(argv: list[str], environ, stdin, slurm) -> Request:
    """The Request for `argv`. Stops early (and says why in `help`, `info` or `refusal`) where stune stays out
    of sbatch's way; the script is read only once the command line is one sbatch accepts."""
    from .optable import learn

    first = parse_args(argv)
    if any(o.key == "help" for o in first.options):
        req = Request(argv, first)
        req.help = True
        return req
    info = any(o.key in INFO_KEYS for o in first.options)
    how = "built-in" if info else learn(slurm, environ)  # the installed sbatch's table (cached)
    parsed = parse_args(argv)
    if (
        parsed.unknown and how == "cached"
    ):  # the plugin stack may have changed under the same files: ask afresh
        how = learn(slurm, environ, fresh=True)
        parsed = parse_args(argv)
    keys = {o.key for o in parsed.stune}
    as_json = "stune:dry-run" in keys and "stune:json" in keys
    if "stune:json" in keys and not as_json:
        parsed = parse_args(argv, stune_json=False)  # only a dry run's: a submission gives --json to sbatch
    req = Request(argv, parsed)
    req.info = info
    if parsed.problems or info:
        req.refusal = Refusal("this command line", parsed.problems) if parsed.problems else None
        return req
    if req.dry_run and parsed.script_index is not None:
        problem = _unreadable(argv[parsed.script_index])
        if problem:
            req.refusal = Refusal("this command line", [problem])
            return req
    req.text, req.stdin_bytes, req.label = read_script(argv, parsed, stdin)
    problems: list[str] = []
    directives, script_het = parse_directives(req.text, problems, req.unknown) if req.text else ([], False)
    if (
        len(req.unknown) > len(parsed.unknown) and how == "cached"
    ):  # a directive's: ask afresh, read both again
        learn(slurm, environ, fresh=True)
        parsed = parse_args(argv, stune_json=as_json)
        req.parsed, req.unknown, problems = parsed, list(parsed.unknown), []
        dry_run = req.dry_run
        req._stune(parsed.stune)  # the stage options as read again; the dry run stays what it was
        req.dry_run, req.as_json = dry_run, as_json
        directives, script_het = (
            parse_directives(req.text, problems, req.unknown) if req.text else ([], False)
        )
    if problems:  # the script's directives hold what sbatch refuses: the same verdict as for the command line
        req.refusal = Refusal("this script's #SBATCH lines", problems)
        return req
    req.het = parsed.het or script_het
    req.eff = Effective(parsed.options, directives, environ)
    return req


def read_script(argv: list[str], parsed: ParsedArgs, stdin) -> tuple[str | None, bytes | None, str]:
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


def _unreadable(path: str) -> str | None:
    """Why sbatch could not open the batch script `path` (it refuses the submission), else None."""
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"cannot open the batch script {path!r}: {exc.strerror}"
    return None
