"""Parsing a node's NCCL logs in the epilog at the size cap (comm.NODE_CAP, 2 MiB per node). Goal (issue 24):
<= 50 ms, parse and judge together.

Subjects, interleaved in the same process and rounds, each over the same bytes:
- str.split loop (baseline): decode the bytes and split every line into words, the least any line reader does;
- node, 1 file: parse() of one log of NODE_CAP bytes and judge() of it;
- node, 8 files: the same bytes as 8 per-process logs (cap.share(8) each), each parse()d, then judge() of the 8;
- node, no NCCL line: NODE_CAP bytes of benchmark tables, tracebacks, HCCL and nccl-tests lines (the captures
  that are not NCCL logs), the path that tries the most readers per line;
- node, 4 MiB given: a log of twice the cap handed to parse(), which reads its head and tail within the cap.

The logs are the captures of tests/fixtures/comm repeated up to the cap: the NCCL / RCCL INFO logs (channel,
network, plugin, warning lines) for the first two, the rest for the third. Wall time of the call (no
subprocess: the epilog's hook runs parse in its own process, whose start is the epilog's cost, not this).

    .venv/bin/python bench/bench_comm.py [--rounds 30]
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from common import compare

from slurm_tune.comm import NODE_CAP, Expectation, judge, parse
from slurm_tune.comm.cap import share

FIX = REPO / "tests" / "fixtures" / "comm"
EXPECT = Expectation("ib", gdr=True, gdr_level="PHB", socket_ifname="ib0")


def corpus(nccl: bool, size: int = NODE_CAP) -> bytes:
    """The captures repeated to the cap, each repetition as another process: pids and ranks renumbered, so
    that no repetition's lines equal another's (a real node's logs repeat little but their prefixes)."""
    names = sorted(p.name for p in FIX.glob("*.txt"))
    picked = [n for n in names if n.startswith(("nccl-", "rccl-", "torch-")) == nccl]
    one = b"".join((FIX / n).read_bytes().rstrip(b"\n") + b"\n" for n in picked).decode()
    pid = re.compile(r":([0-9]+):([0-9]+) \[")
    rank = re.compile(r"(?<![0-9])([0-9]{1,3})\[")
    parts, k = [], 0
    total = 0
    while total < size:
        text = pid.sub(lambda m, k=k: f":{int(m.group(1)) + k}:{int(m.group(2)) + k} [", one)
        text = rank.sub(lambda m, k=k: f"{int(m.group(1)) + 16 * k}[", text)
        parts.append(text.encode())
        total += len(parts[-1])
        k += 1
    data = b"".join(parts)
    return data[: data.rindex(b"\n", 0, size) + 1]


def timed(fn):
    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def split_loop(data: bytes) -> int:
    words = 0
    for line in data.decode("utf-8", "replace").split("\n"):
        words += len(line.split())
    return words


def main() -> None:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 30
    node = corpus(nccl=True)
    other = corpus(nccl=False)
    double = corpus(nccl=True, size=2 * NODE_CAP)
    part = share(8)
    files, start = [], 0
    for i in range(8):
        end = len(node) if i == 7 else node.rindex(b"\n", start, start + part) + 1
        files.append(node[start:end])
        start = end
    assert sum(map(len, files)) == len(node) <= NODE_CAP
    log = parse(node)
    assert log.bytes_skipped == 0 and log.error == "" and judge([log], EXPECT).status != "unknown"
    assert parse(double).bytes_skipped == len(double) - NODE_CAP
    print(
        f"node log {len(node)} bytes, {log.lines} lines ({log.nccl_lines} NCCL's); other {len(other)} bytes"
    )
    result = compare(
        "comm-parse",
        {
            "str.split loop": timed(lambda: split_loop(node)),
            "node, 1 file": timed(lambda: judge([parse(node)], EXPECT)),
            "node, 8 files": timed(lambda: judge([parse(f) for f in files], EXPECT)),
            "node, no NCCL line": timed(lambda: judge([parse(other)], EXPECT)),
            "node, 4 MiB given": timed(lambda: judge([parse(double)], EXPECT)),
        },
        rounds=rounds,
        warmup=2,
    )
    worst = max(v for k, v in result["median_s"].items() if k.startswith("node"))
    print(f"\nworst node case {worst * 1000:.1f} ms at the {NODE_CAP >> 20} MiB cap (goal <= 50 ms)")


if __name__ == "__main__":
    main()
