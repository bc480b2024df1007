"""The parser of Huawei's HCCL Test (`hccl_test`'s all_reduce_test) output, by reading.py's rules as parse.py's
are: bytes or text in, a Reading out. (rccl-tests prints nccl-tests' table: parse.nccl_tests reads it.)

What the tool prints (the root rank alone; tests/fixtures/comm/hcclTest-allreduce-docexample.txt):

    the minbytes is 8192, maxbytes is 67108864, iters is 20, warmup_iters is 5
    data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:
    8192              |     764.55    |       0.00998        | success
    ...
    67108864          |    2630.20    |      23.76245        | success

The binary spells the time column `aveg_time(us):`, its documentation `avg_time(us):`; neither is read. The
result column is success, failed (a rank computed a wrong result; that rank also prints `rank id N, check
result failed`) or NULL (checking off: `-c 0`, or HCCL Test's own overflow rule). The bandwidth is the
algorithm bandwidth (data size / time), in GB/s. The table has no closing line: it is complete when its
largest row reached `maxbytes`, or the next size of its own sequence (x factor, + step) would pass it. So a
run cut short (the job's limit, a crash after some sizes) is unknown, never a slower number.
"""

from __future__ import annotations

import re

from ..comm.prefix import strip_wrappers
from .reading import Reading, complete_lines, fail, first_error, number, ok, unknown

_RANGE = re.compile(r"the minbytes is ([0-9]{1,20}), maxbytes is ([0-9]{1,20}), iters is ([0-9]{1,10})")
_RANK_FAILED = re.compile(r"rank id ([0-9]{1,7}), check result failed")
_ERRORS = (
    "hccl interface return err",
    "acl interface return err",
    "This is an error in",
    "execute failed",
    "retcode:",
    "[ERROR]",
    "ERR0",
    "EI0",
    "EI9",
    "EJ0",
    "EE9",
    "mpirun noticed",
    "MPI_ABORT",
    "srun: error",
    "Segmentation fault",
    "command not found",
    "No such file or directory",
    "cannot open shared object file",
)
RESULTS = ("success", "failed", "NULL")


def hccl_test(output) -> Reading:
    """The algorithm bandwidth (GB/s) at the largest data size of a complete table. A `failed` row (or a
    rank's `check result failed`) fails: a collective that computed wrong results; an error line, no table
    or a table cut before maxbytes is unknown."""
    lines = [strip_wrappers(line) for line in complete_lines(output)]
    maxbytes: int | None = None
    header = False
    rows: list[tuple[int, float, str]] = []
    failed_ranks: list[str] = []
    for line in lines:
        m = _RANGE.match(line)
        if m:
            maxbytes = int(m.group(2))
            continue
        m = _RANK_FAILED.match(line)
        if m:
            failed_ranks.append(m.group(1))
            continue
        if line.startswith("data_size(Bytes):"):
            header = True
            continue
        if not header or "|" not in line:
            continue
        cells = [c.strip() for c in line.split("|")]
        if len(cells) != 4 or not cells[0].isdigit() or len(cells[0]) > 20 or cells[3] not in RESULTS:
            continue
        seconds, bandwidth = number(cells[1]), number(cells[2])
        if seconds is None or bandwidth is None:
            continue
        rows.append((int(cells[0]), bandwidth, cells[3]))
    extra: dict = {"rows": len(rows)}
    bad = [size for size, _, result in rows if result == "failed"]
    if bad or failed_ranks:
        where = f" at {bad[0]} B" + (f" (+{len(bad) - 1} more sizes)" if len(bad) > 1 else "") if bad else ""
        ranks = f" on rank {','.join(failed_ranks[:8])}" if failed_ranks else ""
        return fail(f"hccl_test: result check failed{where}{ranks} (wrong results on a collective)", **extra)
    error = first_error(lines, _ERRORS)
    if error:
        return unknown(f"hccl_test error: {error}", **extra)
    if not rows:
        return unknown("no result rows in the hccl_test output", **extra)
    if maxbytes is None:
        return unknown(
            "hccl_test output without its `the minbytes is ...` line: cannot tell it is whole", **extra
        )
    sizes = [size for size, _, _ in rows]
    if sizes != sorted(set(sizes)) or sizes[-1] > maxbytes:
        return unknown("hccl_test table out of order or past its maxbytes", **extra)
    if not _complete(sizes, maxbytes):
        return unknown(f"truncated hccl_test output ({len(rows)} rows, none at maxbytes {maxbytes})", **extra)
    size, best, result = rows[-1]
    extra["size"] = size
    checked = "" if result == "success" else "; results not checked (NULL)"
    return ok(best, "GB/s", f"algbw {best:g} GB/s at {size} B{checked}", **extra)


def _complete(sizes: list[int], maxbytes: int) -> bool:
    """The sequence reached maxbytes, or its next size (by its own factor, else its own step) would pass it."""
    last = sizes[-1]
    if last == maxbytes:
        return True
    if len(sizes) < 2:
        return False
    prev = sizes[-2]
    if prev > 0 and last % prev == 0 and all(b == a * (last // prev) for a, b in zip(sizes, sizes[1:])):
        return last * (last // prev) > maxbytes
    step = last - prev
    return all(b - a == step for a, b in zip(sizes, sizes[1:])) and last + step > maxbytes
