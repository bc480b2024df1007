"""sbatch's options, read the way sbatch reads them.

The table is Slurm 22.05's sbatch, probed from the binary itself: getopt_long lists every long option when a
prefix is ambiguous (`sbatch --a`), and says which take an argument (`requires an argument` / `doesn't allow an
argument`). Reading follows GNU getopt_long with sbatch's `+` option string: options stop at the first
non-option (the script), `--` ends them, long options may be abbreviated to a unique prefix, `--opt=value` and
`--opt value` are the same, a short option's value may be glued on (`-N2`) and flags cluster (`-HQ`).

`#SBATCH` directives are tokenised like sbatch's `_get_argument`: lines that start (column 0) with `#SBATCH`
or `#SLURM`, before the first line that is neither blank nor a comment; words split on white space, quotes
group, a backslash escapes, an unquoted `#` starts a comment. A `hetjob` line starts the next component.

Precedence is sbatch's (man sbatch, INPUT ENVIRONMENT VARIABLES): the command line beats SBATCH_*
variables, which beat `#SBATCH` directives.
"""
from __future__ import annotations

from ..text import is_digits

NO, REQUIRED, OPTIONAL = 0, 1, 2

_REQUIRED_LONG = (
    "account acctg-freq array batch begin bb bbf cluster-constraint chdir cluster clusters comment container "
    "context constraint core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
    "dependency distribution error exclude export export-file extra-node-info gid gpu-bind gpu-freq gpus "
    "gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep "
    "licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile "
    "nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres "
    "open-mode output partition power prefer priority profile qos reservation signal sockets-per-node "
    "switches tasks-per-node thread-spec threads-per-core time time-min tmp uid wait-all-nodes wckey wrap")
_FLAG_LONG = ("contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot "
              "requeue spread-job test-only usage use-min-nodes verbose version wait")
_OPTIONAL_LONG = "exclusive get-user-env nice no-kill propagate"
# Long spellings that are another option's alias: their canonical key.
_ALIASES = {"cluster": "clusters", "tasks-per-node": "ntasks-per-node"}

LONG: dict[str, tuple[int, str]] = {}
for _name in _REQUIRED_LONG.split():
    LONG[_name] = (REQUIRED, _ALIASES.get(_name, _name))
for _name in _FLAG_LONG.split():
    LONG[_name] = (NO, _name)
for _name in _OPTIONAL_LONG.split():
    LONG[_name] = (OPTIONAL, _name)

_SHORT_KEYS = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "h": "help", "H": "hold",
    "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "M": "clusters",
    "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version", "w": "nodelist",
    "W": "wait", "x": "exclude",
}
SHORT: dict[str, tuple[int, str]] = {c: (LONG[k][0], k) for c, k in _SHORT_KEYS.items()}

# Options after which sbatch only prints something: stune passes such a command line through untouched.
INFO_KEYS = frozenset(("help", "usage", "version"))

# stune's own options (exact spelling only, so sbatch's prefix matching is unchanged). `--json` is stune's only
# with --dry-run (submit.run reads the line again without it otherwise: a submission passes it to sbatch).
STUNE_LONG: dict[str, tuple[int, str]] = {
    "dry-run": (NO, "stune:dry-run"),
    "json": (NO, "stune:json"),
    "stage": (REQUIRED, "stune:stage"),
    "stage-required": (NO, "stune:stage-required"),
    "stage-strict": (NO, "stune:stage-strict"),
    "checkpoint-signal": (NO, "stune:checkpoint-signal"),
    "node-summary": (NO, "stune:node-summary"),
}

# SBATCH_* input variables that set an option stune reads (man sbatch, INPUT ENVIRONMENT VARIABLES).
ENV_OPTIONS = {
    "partition": "SBATCH_PARTITION", "export": "SBATCH_EXPORT", "requeue": "SBATCH_REQUEUE",
    "no-requeue": "SBATCH_NO_REQUEUE", "signal": "SBATCH_SIGNAL", "switches": "SBATCH_REQ_SWITCH",
    "gpu-bind": "SBATCH_GPU_BIND", "wait": "SBATCH_WAIT",
}


class Opt:
    """One option occurrence: canonical key (the long name), its value (None for a flag), and where it was
    given: `command line`, `$SBATCH_X`, or `script line N`. (A plain class: the hot-path rule, docs/speed.md.)"""

    __slots__ = ("key", "value", "where")

    def __init__(self, key: str, value: str | None, where: str):
        self.key, self.value, self.where = key, value, where

    def __eq__(self, other):
        return isinstance(other, Opt) and (self.key, self.value, self.where) == (other.key, other.value, other.where)

    def __repr__(self):
        return f"Opt({self.key!r}, {self.value!r}, {self.where!r})"


class ParsedArgs:
    """The command line, read. `options`: sbatch options before the script; `stune`: stune's own;
    `script_index`: argv index of the script path (None: stdin or --wrap); `problems`: what sbatch would
    reject (stune then stays out of the way and lets sbatch say it); `het`: a `:` heterogeneous job;
    `dashdash`: argv index of a `--` that ended the options, else None; `stune_words`: argv indices that
    hold stune's own options (removed before sbatch sees the command line)."""

    __slots__ = ("options", "stune", "script_index", "problems", "het", "dashdash", "stune_words")

    def __init__(self, options, stune, script_index, problems, het, dashdash, stune_words):
        self.options, self.stune, self.script_index, self.problems = options, stune, script_index, problems
        self.het, self.dashdash, self.stune_words = het, dashdash, stune_words

    def __repr__(self):
        return (f"ParsedArgs(options={self.options!r}, stune={self.stune!r}, script_index={self.script_index!r}, "
                f"problems={self.problems!r}, het={self.het!r})")


def lookup_long(name: str) -> tuple[int, str] | None:
    """getopt_long's resolution: the exact name, else the one option the prefix abbreviates. A prefix of
    several options is ambiguous unless they are the same option (--clus: cluster and clusters)."""
    found = LONG.get(name)
    if found is not None or not name:
        return found
    matches = {LONG[n] for n in LONG if n.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def parse_args(argv: list[str], *, where: str = "command line", wheres: list[str] | None = None,
               allow_stune: bool = True, stune_json: bool = True) -> ParsedArgs:
    """Read sbatch options from argv (without the program name) the way getopt_long("+...") does.
    Each option records `where` it came from, or wheres[i] for the word i it started at."""
    options: list[Opt] = []
    stune: list[Opt] = []
    problems: list[str] = []
    het = False
    stune_words: list[int] = []
    i, n = 0, len(argv)
    while i < n:
        tok = argv[i]
        at = wheres[i] if wheres else where
        if tok == "--":
            return ParsedArgs(options, stune, i + 1 if i + 1 < n else None, problems, het, i, stune_words)
        if tok == ":":
            het = True
            i += 1
            continue
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            entry = STUNE_LONG.get(name) if allow_stune and (stune_json or name != "json") else None
            into = stune
            if entry is None:
                entry, into = lookup_long(name), options
            if entry is None:
                problems.append(f"unrecognized option '{tok}'")
                i += 1
                continue
            has_arg, key = entry
            value = None
            if has_arg == NO:
                if eq:
                    problems.append(f"option '--{name}' doesn't allow an argument")
            elif has_arg == REQUIRED:
                if eq:
                    value = val
                elif i + 1 < n:
                    i += 1
                    value = argv[i]
                else:
                    problems.append(f"option '--{name}' requires an argument")
                    break
            elif eq:
                value = val
            into.append(Opt(key, value, at))
            if into is stune:
                stune_words.extend(range(i - (1 if has_arg == REQUIRED and not eq else 0), i + 1))
            i += 1
            continue
        if tok.startswith("-") and tok != "-":
            j = 1
            while j < len(tok):
                entry = SHORT.get(tok[j])
                if entry is None:
                    problems.append(f"invalid option -- '{tok[j]}'")
                    j += 1
                    continue
                has_arg, key = entry
                if has_arg == NO:
                    options.append(Opt(key, None, at))
                    j += 1
                    continue
                rest = tok[j + 1:]
                if has_arg == REQUIRED and not rest:
                    if i + 1 >= n:
                        problems.append(f"option requires an argument -- '{tok[j]}'")
                        break
                    i += 1
                    rest = argv[i]
                options.append(Opt(key, rest or None, at))
                break
            i += 1
            continue
        return ParsedArgs(options, stune, i, problems, het, None, stune_words)
    return ParsedArgs(options, stune, None, problems, het, None, stune_words)


# ---- #SBATCH directives ------------------------------------------------------------------------------------

MAGIC_WORDS = ("#SBATCH", "#SLURM")


def directive_tokens(script: str) -> tuple[list[tuple[int, str]], bool]:
    """(line number, word) for every word of the first job component's directives, and whether the script
    declares more components (`#SBATCH hetjob`)."""
    words: list[tuple[int, str]] = []
    for lineno, line in enumerate(script.split("\n"), 1):
        rest = None
        for magic in MAGIC_WORDS:
            if line.startswith(magic):
                rest = line[len(magic):]
                break
        if rest is None:
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                break  # the first command: sbatch reads no further directives
            continue
        lower = rest.lower()
        if "hetjob" in lower or "packjob" in lower:
            return words, True
        words.extend((lineno, w) for w in split_directive(rest))
    return words, False


def split_directive(text: str) -> list[str]:
    """Words of one directive line, as sbatch's _get_argument splits them."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return words
        chars: list[str] = []
        quote = ""
        escaped = False
        while i < n and (quote or not text[i].isspace()):
            c = text[i]
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
                i += 1
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    i += 1
                    continue
            elif c in "\"'":
                quote = c
                i += 1
                continue
            elif c == "#":
                break
            chars.append(c)
            i += 1
        if not chars:  # a comment, or an empty quoted word: sbatch stops reading this line there
            return words
        words.append("".join(chars))


def parse_directives(script: str, problems: list[str] | None = None) -> tuple[list[Opt], bool]:
    """The sbatch options a script's directives set (first component), and whether it is a het job.
    What sbatch would refuse is appended to `problems` when given."""
    words, het = directive_tokens(script)
    if not words:
        return [], het
    parsed = parse_args([w for _, w in words], wheres=[f"script line {ln}" for ln, _ in words],
                        allow_stune=False)
    if problems is not None:
        problems.extend(parsed.problems)
    return parsed.options, het


# ---- SPANK plugin options (pyxis's --container-image, ...) ----------------------------------------------------

PLUGIN_HEADER = "Options provided by plugins:"
PLUGIN_KEYS: set[str] = set()  # the options learned from the site's plugins (for the explanation)


def unrecognized(problems: list[str]) -> bool:
    """Whether sbatch's refusal may only be a plugin option stune does not know yet."""
    return any(p.startswith("unrecognized option '--") for p in problems)


def parse_plugin_help(text: str) -> dict[str, tuple[int, str]]:
    """The SPANK options in `sbatch --help` output: after "Options provided by plugins:", each line that
    starts with `--NAME`; Slurm prints `--NAME=ARGINFO` for an option with an argument and `--NAME` for a
    flag (spank.c's option printer; a `[=ARG]` form is read as an optional argument)."""
    found: dict[str, tuple[int, str]] = {}
    _, header, section = text.partition(PLUGIN_HEADER)
    if not header:
        return found
    for line in section.split("\n"):
        word = line.strip().split(" ", 1)[0] if line.startswith(" ") else ""
        if not word.startswith("--") or len(word) < 3:
            continue
        body = word[2:]
        cut = min([i for i in (body.find("="), body.find("[")) if i >= 0] or [len(body)])
        name = body[:cut]
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            continue
        has_arg = OPTIONAL if body[cut:cut + 2] == "[=" else REQUIRED if body[cut:cut + 1] == "=" else NO
        found[name] = (has_arg, name)
    return found


def add_plugin_options(found: dict[str, tuple[int, str]]) -> None:
    """Teach the reader the site's plugin options: sbatch's getopt table holds them too (so abbreviations
    and ambiguity follow sbatch's)."""
    for name, entry in found.items():
        if name not in LONG:
            LONG[name] = entry
            PLUGIN_KEYS.add(name)


# ---- the options in effect ---------------------------------------------------------------------------------

class Effective:
    """The value each option ends up with, and where it came from: command line > SBATCH_* > #SBATCH."""

    def __init__(self, command_line: list[Opt], directives: list[Opt], environ):
        self.command_line, self.directives, self.environ = command_line, directives, environ

    def get(self, key: str) -> Opt | None:
        for opt in reversed(self.command_line):
            if opt.key == key:
                return opt
        var = ENV_OPTIONS.get(key)
        if var and var in self.environ:
            return Opt(key, self.environ[var], f"${var}")
        for opt in reversed(self.directives):
            if opt.key == key:
                return opt
        return None

    def given(self, *keys: str) -> Opt | None:
        """The first of `keys` the user gave anywhere (for 'unless the user gave their own')."""
        for key in keys:
            found = self.get(key)
            if found is not None:
                return found
        return None


def node_range(text: str | None) -> tuple[int, int] | None:
    """`-N` value `min[-max]` -> (min, max); max 0 means open. None when unreadable."""
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    lo_n, hi_n = _count(lo), _count(hi) if sep else None
    if lo_n is None or (sep and hi_n is None):
        return None
    return lo_n, (hi_n if sep else lo_n)


def _count(text: str) -> int | None:
    text = text.strip().lower()
    scale = 1
    if text.endswith("k"):
        text, scale = text[:-1], 1024
    return int(text) * scale if is_digits(text) else None
