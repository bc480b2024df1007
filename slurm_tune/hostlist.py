"""Slurm host lists, both ways: `expand_hostlist("n[1-3,5]")` -> n1 n2 n3 n5, and compress_hostlist back.

The one home of Slurm's compressed host-list form (SLURM_JOB_NODELIST, `Nodes=` in slurm.conf and
topology.conf). What compress_hostlist() writes expands back to the same names (tests/test_hostlist.py checks
the round trip on generated names). A range keeps its width: `n[08-10]` is n08 n09 n10, `n[8-10]` is n8 n9 n10.

On the TaskProlog and stune-sbatch paths: no imports beyond text.py.
"""

from __future__ import annotations

from .text import is_digits

# A range longer than this is taken literally: no host list names a million nodes, and a forged one
# (`n[0-999999999999]`) must not make a list of that size.
MAX_RANGE = 1_000_000


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's compressed host list to names: `n[1-3,5],gpu[08-10],rack[1-2]-n[1-2]` -> n1 n2 n3 n5 gpu08
    gpu09 gpu10 rack1-n1 rack1-n2 rack2-n1 rack2-n2. Zero padding is kept; a range part that is not a
    number, or an unbalanced bracket, is taken literally (sbatch judges a bad --nodelist, not stune)."""
    names: list[str] = []
    depth, term = 0, ""
    for ch in (expr or "").strip() + ",":
        if ch == "," and depth == 0:
            if term:
                names.extend(n for n in _expand_term(term) if n)  # `[]` names nothing
            term = ""
            continue
        depth += (ch == "[") - (ch == "]")
        term += ch
    if term:  # an unbalanced bracket swallowed the rest
        names.append(term[:-1])
    return names


def _expand_term(term: str) -> list[str]:
    head, sep, rest = term.partition("[")
    body, closed, tail = rest.partition("]")
    if not sep or not closed:
        return [term]
    heads: list[str] = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if dash and is_digits(lo) and is_digits(hi) and int(hi) - int(lo) < MAX_RANGE:
            heads.extend(f"{head}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
        else:
            heads.append(head + part)
    return [h + t for h in heads for t in _expand_term(tail)] if tail else heads


def compress_hostlist(names) -> str:
    """Names to Slurm's host-list form: node01,node02,node03,node07 -> node[01-03,07]; duplicates once.
    A range has a width (zero padding): `cn[1-10]` is cn1..cn10, `node[01-10]` is node01..node10, so a
    number without a leading zero joins the widest padded range it fits, else the unpadded one. Names
    that do not end in ASCII digits are listed as they are, after the ranges."""
    split: dict[str, list[str]] = {}
    plain: set[str] = set()
    for name in names:
        cut = len(name)
        while cut and "0" <= name[cut - 1] <= "9":
            cut -= 1
        if cut == len(name):
            plain.add(name)
        else:
            split.setdefault(name[:cut], []).append(name[cut:])
    groups: dict[tuple[str, int], set[int]] = {}
    for prefix, numbers in split.items():
        padded = {len(d) for d in numbers if len(d) > 1 and d.startswith("0")}
        for digits in numbers:
            if len(digits) > 1 and digits.startswith("0"):
                width = len(digits)
            else:
                width = max((w for w in padded if w <= len(digits)), default=1)
            groups.setdefault((prefix, width), set()).add(int(digits))
    parts = []
    for (prefix, width), members in sorted(groups.items()):
        ordered = sorted(members)
        if len(ordered) == 1:
            parts.append(f"{prefix}{ordered[0]:0{width}d}")
            continue
        ranges, start, prev = [], ordered[0], ordered[0]
        for n in [*ordered[1:], None]:
            if n is not None and n == prev + 1 and n - start < MAX_RANGE:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts + sorted(plain))
