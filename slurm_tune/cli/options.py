"""The options every stune command spells the same way, defined once.

    -p/--partition P   --node NAME   --sysfs-root DIR   --json   --dry-run

argparse commands add them with `add(parser, "partition", ...)` (a keyword overrides the default help,
`required`, ...). stune-health's hand-made parser (its prolog cannot afford argparse) takes the same spellings
from SHARED. Each command's meaning of an option may be narrower than the help below, never different.

Old spellings that sites may have scripted stay accepted, hidden from --help, with a note on stderr:
`deprecated(parser, "--snapshot", "--gpu-snapshot", dest=...)`.
"""

from __future__ import annotations

# name: (flags, takes a value, argparse keywords)
SHARED = {
    "partition": (
        ("-p", "--partition"),
        True,
        {"metavar": "PARTITION", "help": "the partition whose profile to use"},
    ),
    "node": (
        ("--node",),
        True,
        {"metavar": "NAME", "help": "the node's name (default: $SLURMD_NODENAME, else the host name)"},
    ),
    "sysfs_root": (
        ("--sysfs-root",),
        True,
        {
            "metavar": "DIR",
            "help": "read sysfs under DIR (default: $STUNE_SYSFS_ROOT, else /; %%n = the node name)",
        },
    ),
    "json": (
        ("--json",),
        False,
        {"action": "store_true", "help": "print the result as JSON (keys sorted, indent 1)"},
    ),
    "dry_run": (
        ("--dry-run",),
        False,
        {"action": "store_true", "help": "say what would be done; change nothing"},
    ),
}


def add(parser, name: str, **overrides):
    """Add shared option `name` to an argparse parser; keywords override the defaults (help, required...)."""
    flags, _, keywords = SHARED[name]
    return parser.add_argument(*flags, dest=name, **dict(keywords, **overrides))


def store_parent(what: str):
    """The parent parser of the commands over the active store (stune-sweep, stune-validate): --store, and
    --partitions-dir. `what`: what the store holds, for the help."""
    import argparse  # (this module is read by stune-health's prolog path, which never builds a parser)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store", help=f"{what} directory (default $STUNE_ACTIVE_DIR or /var/lib/stune/active)"
    )
    common.add_argument("--partitions-dir", help="profile directory (default $STUNE_PARTITIONS)")
    return common


def flags(name: str) -> tuple[str, ...]:
    return SHARED[name][0]


def takes_value(name: str) -> bool:
    return SHARED[name][1]


def deprecated(parser, old: str, new: str, prog: str, **keywords) -> None:
    """Accept `old` as a hidden alias of `new` (same dest), saying once on stderr that `new` is the name."""
    import argparse
    import sys

    class _Note(argparse.Action):
        def __call__(self, parser_, namespace, values, option_string=None):
            print(f"{prog}: note: {old} is deprecated; use {new}", file=sys.stderr)
            setattr(namespace, self.dest, True if self.nargs == 0 else values)

    if keywords.get("action") == "store_true":
        keywords = dict(keywords, nargs=0)
        del keywords["action"]
    parser.add_argument(old, action=_Note, help=argparse.SUPPRESS, **keywords)


def parse(parser, argv: list[str]):
    """parser.parse_args(argv) for a command with subcommands, but an unknown option is refused with the
    subcommand's own usage (argparse's shows the top-level one: `stune-stage gc --dryrun` then gets `gc`'s
    options, not the list of commands) and the nearest spelling, e.g. `(did you mean --dry-run?)`."""
    import argparse
    import difflib

    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    target = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            target = action.choices.get(chosen, parser) if chosen is not None else parser
    known = [
        flag
        for action in target._actions
        for flag in action.option_strings
        if action.help is not argparse.SUPPRESS
    ]
    hint = ""
    for word in extra:
        close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1) if word.startswith("-") else []
        if close:
            hint = f" (did you mean {close[0]}?)"
            break
    target.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
