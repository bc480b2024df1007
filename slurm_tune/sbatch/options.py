"""sbatch's options, read the way sbatch reads them.

The table in effect is the installed sbatch's, learned from its `sbatch --help` (optable.py, cached per Slurm
release and plugin stack) and laid over a built-in one: Slurm 22.05's sbatch, probed from the binary itself
(getopt_long lists every long option when a prefix is ambiguous, `sbatch --a`, and says which take an
argument), which keeps the options `--help` does not show. A word the table still cannot classify (an option
of a newer release or a plugin the help does not list) is not a refusal: it is recorded in `unknown`, read by
the rule of `_unknown_option`, and the submission warns about it in one line and keeps stune's settings.

Reading follows GNU getopt_long with sbatch's `+` option string: options stop at the first non-option (the
script), `--` ends them, long options may be abbreviated to a unique prefix, `--opt=value` and `--opt value`
are the same, a short option's value may be glued on (`-N2`) and flags cluster (`-HQ`).

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
    "switches tasks-per-node thread-spec threads-per-core time time-min tmp uid wait-all-nodes wckey wrap"
)
_FLAG_LONG = (
    "contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot "
    "requeue spread-job test-only usage use-min-nodes verbose version wait"
)
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
    "a": "array",
    "A": "account",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "h": "help",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "V": "version",
    "w": "nodelist",
    "W": "wait",
    "x": "exclude",
}
SHORT: dict[str, tuple[int, str]] = {c: (LONG[k][0], k) for c, k in _SHORT_KEYS.items()}
BUILTIN_LONG, BUILTIN_SHORT = dict(LONG), dict(SHORT)

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
    "partition": "SBATCH_PARTITION",
    "export": "SBATCH_EXPORT",
    "requeue": "SBATCH_REQUEUE",
    "no-requeue": "SBATCH_NO_REQUEUE",
    "signal": "SBATCH_SIGNAL",
    "switches": "SBATCH_REQ_SWITCH",
    "gpu-bind": "SBATCH_GPU_BIND",
    "wait": "SBATCH_WAIT",
}


class Opt:
    """One option occurrence: canonical key (the long name), its value (None for a flag), and where it was
    given: `command line`, `$SBATCH_X`, or `script line N`. (A plain class: the hot-path rule, docs/speed.md.)"""

    __slots__ = ("key", "value", "where")
    __hash__ = None  # type: ignore[assignment]  # as __eq__ alone implies: compared, never hashed

    def __init__(self, key: str, value: str | None, where: str):
        self.key, self.value, self.where = key, value, where

    def __eq__(self, other):
        return isinstance(other, Opt) and (self.key, self.value, self.where) == (
            other.key,
            other.value,
            other.where,
        )

    def __repr__(self):
        return f"Opt({self.key!r}, {self.value!r}, {self.where!r})"


class ParsedArgs:
    """The command line, read. `options`: sbatch options before the script; `stune`: stune's own;
    `script_index`: argv index of the script path (None: stdin or --wrap); `problems`: what sbatch would
    reject (stune then stays out of the way and lets sbatch say it); `het`: a `:` heterogeneous job;
    `dashdash`: argv index of a `--` that ended the options, else None; `stune_words`: argv indices that
    hold stune's own options (removed before sbatch sees the command line); `unknown`: one line per word the
    option table cannot classify (how it was read, where); `insert_at`: the argv index before which stune's
    own sbatch options must go (an unknown option that may take the next word as its value), else None."""

    __slots__ = (
        "options",
        "stune",
        "script_index",
        "problems",
        "het",
        "dashdash",
        "stune_words",
        "unknown",
        "insert_at",
    )

    def __init__(
        self, options, stune, script_index, problems, het, dashdash, stune_words, unknown=(), insert_at=None
    ):
        self.options, self.stune, self.script_index, self.problems = options, stune, script_index, problems
        self.het, self.dashdash, self.stune_words = het, dashdash, stune_words
        self.unknown, self.insert_at = list(unknown), insert_at

    def __repr__(self):
        return (
            f"ParsedArgs(options={self.options!r}, stune={self.stune!r}, script_index={self.script_index!r}, "
            f"problems={self.problems!r}, het={self.het!r})"
        )


AMBIGUOUS = (-1, "")


def lookup_long(name: str) -> tuple[int, str] | None:
    """getopt_long's resolution: the exact name, else the one option the prefix abbreviates; AMBIGUOUS for a
    prefix of several options, unless they are the same option (--clus: cluster and clusters); None: unknown."""
    found = LONG.get(name)
    if found is not None or not name:
        return found
    matches = {LONG[n] for n in LONG if n.startswith(name)}
    if len(matches) > 1:
        return AMBIGUOUS
    return matches.pop() if matches else None


def use_learned(longs: dict[str, int], shorts: dict[str, str], plugins=()) -> None:
    """Make the installed sbatch's options (optable.learn) the table in effect, over the built-in one. An
    option the built-in table knows keeps its argument rule: it was probed from getopt, while the help prints
    some falsely (`--wrap[=command string]` takes a required argument, `-k, --no-kill` an optional one). A new
    option the help prints without an argument is read as taking an optional one, the reading that refuses
    nothing sbatch might accept."""
    LONG.clear()
    LONG.update(BUILTIN_LONG)
    SHORT.clear()
    SHORT.update(BUILTIN_SHORT)
    for name, has_arg in longs.items():
        if name not in BUILTIN_LONG:
            LONG[name] = (OPTIONAL if has_arg == NO else has_arg, name)
    for letter, name in shorts.items():
        if letter not in SHORT and name in LONG:
            SHORT[letter] = LONG[name]
    PLUGIN_KEYS.clear()
    PLUGIN_KEYS.update(n for n in plugins if n not in BUILTIN_LONG)


def parse_args(
    argv: list[str],
    *,
    where: str = "command line",
    wheres: list[str] | None = None,
    allow_stune: bool = True,
    stune_json: bool = True,
) -> ParsedArgs:
    """Read sbatch options from argv (without the program name) the way getopt_long("+...") does.
    Each option records `where` it came from, or wheres[i] for the word i it started at."""
    options: list[Opt] = []
    stune: list[Opt] = []
    problems: list[str] = []
    unknown: list[str] = []
    insert_at: int | None = None
    het = False
    stune_words: list[int] = []

    def done(script_index, dashdash=None) -> ParsedArgs:
        return ParsedArgs(
            options, stune, script_index, problems, het, dashdash, stune_words, unknown, insert_at
        )

    i, n = 0, len(argv)
    while i < n:
        tok = argv[i]
        at = wheres[i] if wheres else where
        if tok == "--":
            return done(i + 1 if i + 1 < n else None, i)
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
            if entry is AMBIGUOUS:
                problems.append(f"option '--{name}' is ambiguous")
                i += 1
                continue
            if entry is None:
                took, line = _unknown_option(argv, i, tok, bool(eq), at)
                unknown.append(line)
                if took and insert_at is None:
                    insert_at = i
                i += 1 + took
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
                if (
                    entry is None
                ):  # an option letter this sbatch's table does not list: the rest may be its value
                    glued = j + 1 < len(tok)
                    took, line = _unknown_option(argv, i, f"-{tok[j]}", glued, at)
                    unknown.append(line)
                    if took and insert_at is None:
                        insert_at = i
                    i += took
                    break
                has_arg, key = entry
                if has_arg == NO:
                    options.append(Opt(key, None, at))
                    j += 1
                    continue
                rest = tok[j + 1 :]
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
        return done(i)
    return done(None)


def _unknown_option(argv: list[str], i: int, option: str, has_value: bool, at: str) -> tuple[int, str]:
    """How to read an option the table does not know, at argv[i]: (how many words after it it takes, the
    warning line). With its value in the same word (`--x=v`, `-Xv`) it takes nothing more. Followed by a word
    that is not an option, that word is its value when the rest of the line still names a script (or --wrap),
    or when the word is no file (the script then comes on stdin); else the word is the script and the option
    a flag. Either way stune's options go before it (ParsedArgs.insert_at), where neither reading can move."""
    shown = argv[i] if len(argv[i]) <= 60 else argv[i][:57] + "..."
    head = f"{shown!r} ({at}) is not in this Slurm's sbatch option table (sbatch --help)"
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    if has_value or nxt is None or nxt.startswith("-") or nxt == ":":
        return 0, f"{head}: passed to sbatch as given"
    rest = parse_args(argv[i + 2 :], allow_stune=False)
    import os

    if rest.script_index is not None or any(o.key == "wrap" for o in rest.options) or not os.path.isfile(nxt):
        return 1, f"{head}: read {nxt!r} as its value"
    return 0, f"{head}: read as a flag, {nxt!r} as the script"


# ---- SPANK plugin options (pyxis's --container-image, ...): learned from `sbatch --help` (optable.py) ------

PLUGIN_KEYS: set[str] = set()  # the options learned from the site's plugins (for the explanation)


# ---- the options in effect ---------------------------------------------------------------------------------


class Effective:
    """The value each option ends up with, and where it came from: command line > SBATCH_* > #SBATCH. Resolved
    once, when made (the SBATCH_* variables are read then): `get` is a lookup."""

    def __init__(self, command_line: list[Opt], directives: list[Opt], environ):
        self.command_line, self.directives = command_line, directives
        resolved: dict[str, Opt] = {opt.key: opt for opt in directives}  # the last of each key wins
        for key, var in ENV_OPTIONS.items():
            value = environ.get(var)
            if value is not None:
                resolved[key] = Opt(key, value, f"${var}")
        resolved.update((opt.key, opt) for opt in command_line)
        self._resolved = resolved

    def get(self, key: str) -> Opt | None:
        return self._resolved.get(key)

    def given(self, *keys: str) -> Opt | None:
        """The first of `keys` the user gave anywhere (for 'unless the user gave their own')."""
        for key in keys:
            found = self._resolved.get(key)
            if found is not None:
                return found
        return None


def node_range(text: str | None) -> tuple[int, int] | None:
    """`-N` value `min[-max]` -> (min, max); max 0 means open. None when unreadable."""
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    lo_n = _count(lo)
    hi_n = _count(hi) if sep else lo_n
    if lo_n is None or hi_n is None:
        return None
    return lo_n, hi_n


def _count(text: str) -> int | None:
    text = text.strip().lower()
    scale = 1
    if text.endswith("k"):
        text, scale = text[:-1], 1024
    return int(text) * scale if is_digits(text) else None
