"""The one reader of `sacctmgr -P show assoc` output, for the live adapter (Slurm.associations: `-n` and the
field list it asked for) and for an admin's export file (`stune-fairshare --assoc-file`: a header line).

Rules, the same for both:
- Share is a whole number, or `parent` (Fairshare=parent, shares None). Anything else (empty, a fraction, a
  word) is an AssocFormatError naming the line; the caller names the command or the file. It is never read
  as a default: a made-up share would silently change everyone's fair-share order.
- When the rows carry the tree order (LFT before Slurm 23.11, Lineage from 23.11 on), they are sorted by it:
  Slurm's fair-share code walks siblings in that order, and sacctmgr does not print rows in it. LFT must be
  a number, Lineage a path ('/physics/0-stune-alice/'). Without either, the rows keep their order.
- Columns are found by name: the format field names (ParentName, LFT) or the header titles sacctmgr prints
  for them (Par Name, Share). `sacctmgr -p`'s trailing '|' is allowed; every other line must have exactly
  as many fields as there are columns.
"""

from __future__ import annotations

from collections import namedtuple

from ..text import is_digits

# A field name or header title (lower case) -> the column it is
COLUMNS = {
    "cluster": "cluster",
    "account": "account",
    "user": "user",
    "parentname": "parent",
    "par name": "parent",
    "parent": "parent",
    "share": "share",
    "fairshare": "share",
    "partition": "partition",
    "lft": "lft",
    "lineage": "lineage",
}
REQUIRED = ("account", "user", "parent", "share")
EXPORT_FORMAT = "Account,User,ParentName,Share,LFT"  # LFT is Lineage from Slurm 23.11 on


class Association(namedtuple("Association", "account user parent shares partition order")):
    """One `sacctmgr show assoc` row: user is '' for an account, parent the parent account (accounts only),
    shares the raw Fairshare or None for Fairshare=parent. `order` is the tree-order key: the lft number
    before Slurm 23.11, the Lineage path ('/physics/0-stune-alice/') from 23.11 on, None when not read."""

    __slots__ = ()

    @property
    def lft(self):  # the field's name before 23.11 support
        return self.order


class AssocFormatError(ValueError):
    """A line that is not `sacctmgr show assoc` output as these rules read it; `line` counts from 1."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class AssocColumnsError(AssocFormatError):
    """The header (or the field list) lacks a column the tree needs."""


def parse_share(text: str) -> int | None:
    """A Share field: a whole number, or None for `parent`. ValueError for anything else."""
    share = text.strip().lower()
    if share == "parent":
        return None
    if is_digits(share):
        return int(share)
    raise ValueError(f"Share {text.strip()!r} is not a number or 'parent'")


def parse_associations(
    text: str, fields: list[str] | None = None, *, cluster: str | None = None
) -> list[Association]:
    """Rows of `sacctmgr -P show assoc`. `fields` names the columns of header-less output (`-n`, the
    format= list asked for); without it the first non-blank line is the header. `cluster`: only its rows
    (the Cluster column). Raises AssocFormatError."""
    lines = text.splitlines()
    number = 0
    if fields is None:
        while number < len(lines) and not lines[number].strip():
            number += 1
        if number == len(lines):
            raise AssocFormatError(1, "no header line")
        fields = lines[number].split("|")
        number += 1
    names = [COLUMNS.get(f.strip().lower(), f.strip().lower()) for f in fields]
    trailing = len(names) > 1 and names[-1] == ""  # sacctmgr -p ends every line with '|'
    if trailing:
        names.pop()
    header_line = number  # 0 for header-less output
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise AssocColumnsError(max(header_line, 1), f"no {', '.join(missing)} column")
    at = {name: i for i, name in reversed(list(enumerate(names)))}
    order_key = "lineage" if "lineage" in at else "lft" if "lft" in at else None
    rows = []
    for lineno, line in enumerate(lines[number:], number + 1):
        if not line.strip():
            continue
        cols = line.split("|")
        if trailing and len(cols) == len(names) + 1 and cols[-1] == "":
            cols.pop()
        if len(cols) != len(names):
            raise AssocFormatError(lineno, f"{len(cols)} fields, expected {len(names)}: {line[:120]!r}")
        if cluster and "cluster" in at and cols[at["cluster"]].strip() != cluster:
            continue
        try:
            shares = parse_share(cols[at["share"]])
        except ValueError as exc:
            raise AssocFormatError(lineno, str(exc)) from None
        order: int | str | None = None
        if order_key == "lft":
            order = cols[at["lft"]].strip()
            if not is_digits(order):
                raise AssocFormatError(lineno, f"LFT {order!r} is not a number")
            order = int(order)
        elif order_key == "lineage":
            order = cols[at["lineage"]].strip()
            if not order.startswith("/"):
                raise AssocFormatError(lineno, f"Lineage {order!r} is not a path")
        rows.append(
            Association(
                cols[at["account"]].strip(),
                cols[at["user"]].strip(),
                cols[at["parent"]].strip(),
                shares,
                cols[at["partition"]].strip() if "partition" in at else "",
                order,
            )
        )
    if order_key is not None:
        rows.sort(key=lambda a: a.order)
    return rows
