"""How much of a log is read, and how bytes become lines.

The epilog reads each per-process log as root with a bounded head and tail (safeio); the cap is per node:
NODE_CAP bytes of all the node's files together, each file its share() (head and tail joined by
join_head_tail). parse() holds to the cap itself, so no caller can make one call slow: data over NODE_CAP is
read as its first and last NODE_CAP/2 bytes.

Why 2 MiB: parse + judge must take <= 50 ms per node (issue 24). bench/bench_comm.py measures about 5x a
plain str.split loop over the same bytes, ~17 ms per MiB of NCCL log on the dev machine: 4 MiB would take
~65 ms. 2 MiB is about 23,000 lines at the captures' mean of 90 bytes a line, the set-up of every rank's
first communicators (versions, network, channels) in the heads and the errors at the end in the tails: a
fallback or a missing GDR shows in every channel line of the connections it concerns, so a sample of them
proves it as well as all of them.

Lines: split on LF, CRLF and CR. A line is read only when it is whole: the data's last line when no line end
follows it (a cut file) is not, nor a line over LINE_MAX characters, nor one holding NUL or bytes that are
not UTF-8 (DAMAGED): a cut or corrupted line must not pass for a shorter, valid one (`via NET/IB/0` is a
channel without GDR, `via NET/IB/0/GDRDMA` cut short).
"""

from __future__ import annotations

NODE_CAP = 2 * 1024 * 1024  # bytes of log read per node (all its processes' files together)
FILE_MIN = 16 * 1024  # a file's share is at least this: the head of one rank's set-up
LINE_MAX = 4096  # characters: longer lines are skipped, unread (NCCL's own lines are < 1 KiB)
CUT_MARKER = "[stune: log cut here; the head and the tail of a longer file]"
_CUT_LINE = b"\n" + CUT_MARKER.encode() + b"\n"
DAMAGED = ("\x00", "\ufffd")


def whole_lines(head: bytes) -> bytes:
    """`head` up to and with its last line end: a head cut inside a line loses that partial line."""
    end = max(head.rfind(b"\n"), head.rfind(b"\r"))
    return head[: end + 1]


def join_head_tail(head: bytes, tail: bytes) -> bytes:
    """The head and the tail of a longer file as one log for parse(): the head to its last line end, the
    tail from after its first, and a marker line between, so that the cut never glues two partial lines
    into one line, nor leaves a partial line that reads as a whole one. The epilog uses this when a file
    is over its share of the cap; parse() notes the marker (CommLog.cut)."""
    starts = [i for i in (tail.find(b"\n"), tail.find(b"\r")) if i >= 0]
    rest = tail[min(starts) + 1 :] if starts else b""
    return whole_lines(head) + _CUT_LINE + rest


def share(files: int) -> int:
    """Bytes to read of each of a node's `files` logs (head and tail together): NODE_CAP split evenly, at
    least FILE_MIN; the epilog reads at most NODE_CAP // FILE_MIN (128) files per node."""
    return max(NODE_CAP // max(files, 1), FILE_MIN)


def capped(data: bytes, cap: int = NODE_CAP) -> tuple[bytes, int]:
    """(data, 0) when within the cap, else (its head and tail joined, the bytes left out)."""
    if len(data) <= cap:
        return data, 0
    half = cap // 2
    return join_head_tail(data[:half], data[-half:]), len(data) - 2 * half


def split_lines(data: bytes) -> tuple[list[str], bool]:
    """The text's lines, and whether the data ended inside a line (then that partial line is left out)."""
    text = data.decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    # text.split leaves '' after a final line end; anything else there is a partial line
    partial = lines[-1] != ""
    lines.pop()
    return lines, partial
