"""#SBATCH directives: the words of a batch script's directive lines, split as sbatch splits them, and the
options they set (the first job component's)."""

from __future__ import annotations

from .options import Opt, parse_args

MAGIC_WORDS = ("#SBATCH", "#SLURM")


def directive_tokens(script: str) -> tuple[list[tuple[int, str]], bool]:
    """(line number, word) for every word of the first job component's directives, and whether the script
    declares more components (`#SBATCH hetjob`)."""
    words: list[tuple[int, str]] = []
    for lineno, line in enumerate(script.split("\n"), 1):
        rest = None
        for magic in MAGIC_WORDS:
            if line.startswith(magic):
                rest = line[len(magic) :]
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


def parse_directives(
    script: str, problems: list[str] | None = None, unknown: list[str] | None = None
) -> tuple[list[Opt], bool]:
    """The sbatch options a script's directives set (first component), and whether it is a het job.
    What sbatch would refuse is appended to `problems`, and the words the table cannot classify to `unknown`,
    when given."""
    words, het = directive_tokens(script)
    if not words:
        return [], het
    parsed = parse_args(
        [w for _, w in words], wheres=[f"script line {ln}" for ln, _ in words], allow_stune=False
    )
    if problems is not None:
        problems.extend(parsed.problems)
    if unknown is not None:
        unknown.extend(parsed.unknown)
    return parsed.options, het
