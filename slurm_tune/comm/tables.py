"""Benchmark tables: recognised so that they are not taken for garbage, and read for nothing else.

nccl-tests and rccl-tests print a `#` header and one row per size, in four layouts (NCCL 1's `bytes N type
op ... res`, ncclTests5; 2.6's without redop, nccl340; `redop` + `error`, rccl929 and ncclTests24; `redop root
#wrong`, the a3mega capture and rccl1490 with srun's ` 0: ` labels); ncclperf-interleaved-nccl1453 splits a
row around NCCL INFO lines, leaving bare number fragments. hccl_test prints a `|`-separated table with a
`check_result` column (hcclTest-allreduce-docexample). A table says how fast a test ran, not which transport
a job used: a log of tables alone is `unknown` (verdict.py).
"""

from __future__ import annotations

from .model import FMT_HCCL_TEST, FMT_TABLE
from .state import State, note

_NUMBER_CHARS = frozenset("0123456789.-+eE")


def _numeric(token: str) -> bool:
    return token.lstrip("-+.")[:1].isdigit() and set(token) <= _NUMBER_CHARS


def read_table(st: State, line: str) -> bool:
    """`line`: without launcher prefixes. True for a table line (header, row or row fragment)."""
    if line.startswith(("#", "nThread ", "the minbytes is ")):
        return _table(st, FMT_HCCL_TEST if line.startswith("the minbytes") else FMT_TABLE)
    if "|" in line:
        cells = [c.strip() for c in line.split("|")]
        if cells[0].startswith("data_size(Bytes):") or (
            len(cells) >= 3 and cells[0].isdigit() and cells[-1] in ("success", "failed", "fail")
        ):
            return _table(st, FMT_HCCL_TEST)
        return False
    tokens = line.split()
    if len(tokens) >= 7 and tokens[0].isdigit() and tokens[1].isdigit() and tokens[2].isalpha():
        return _table(st, FMT_TABLE)  # size, count, type, ...
    if 1 <= len(tokens) <= 12 and all(_numeric(t) for t in tokens):
        return _table(st, FMT_TABLE)  # a fragment of a row split by interleaved lines
    return False


def _table(st: State, fmt: str) -> bool:
    st.table_lines += 1
    note(st.formats, fmt)
    return True
