"""NVIDIA Xid events from the kernel log: read `<root>/dev/kmsg` and parse each line into an event.

`<root>/dev/kmsg` is the live /dev/kmsg (one record per read), or a text copy of a kernel log, in any of
the forms people save one in (tests/fixtures/xid/ holds real lines of each, with the parse expected):

    /dev/kmsg record     4,1288,9912345678,-;NVRM: Xid (PCI:0000:47:00): 79, pid=2231, name=python, ...
    dmesg                [31543.449443] NVRM: Xid (PCI:0000:01:00): 31, Ch 0000003a, intr 10000000. ...
    dmesg --ctime        [Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', ...
    journalctl -k        Nov 29 11:28:11 zeus kernel: NVRM: Xid (PCI:0000:c1:00): 31, pid=12890, ...
    the message alone    NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 ...)

Old drivers write the address without `PCI:` (`Xid (0000:01:00): 31`). A GPU that fell off the bus may be
logged with no Xid number at all: `NVRM: GPU at 0000:01:00.0 has fallen off the bus.` is Xid 79, marked
`inferred`.

An event: `seq` (its place in the log: the record's sequence number, or for a copy without kmsg headers
its line number), `usec` (kernel time, when the line has it), `pci` (`0000:47:00`, lower case), `xid`,
`text` (the message from `NVRM:`, at most 400 characters) and `inferred` (only when true). Anything else
is not an event: a garbled line is skipped, never an error.
"""

from __future__ import annotations

import os
import stat

from ..text import is_digits

KMSG_TEXT_MAX = 4 << 20  # a copy: its first 4 MiB
LINE_MAX = 4096  # longer than any driver line; a longer one is cut before parsing
TEXT_MAX = 400
_HEX = frozenset("0123456789abcdefABCDEF")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def read_xid_events(root: str) -> list[dict]:
    """The Xid events in `<root>/dev/kmsg`, oldest first. Opened without following a symlink or blocking on
    a planted FIFO; a missing or unreadable log has no events (the caller's probe says whether it read)."""
    from .. import safeio

    path = os.path.join(root, "dev/kmsg")
    try:
        fd = os.open(path, safeio.O_FILE)
    except OSError:
        return []
    lines: list[str] = []
    live = False
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISCHR(mode):
            live = True
            while True:
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:  # the record we were at was overwritten: go on with the next
                    continue
                if not record:
                    break
                lines.append(record.decode("utf-8", "replace"))
        elif stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as fh:
                # "\n" alone ends a line, so a line's number is the one `grep -n` gives (CRLF copies too)
                lines = fh.read(KMSG_TEXT_MAX).decode("utf-8", "replace").split("\n")
    finally:
        os.close(fd)
    events = []
    for number, line in enumerate(lines, 1):
        event = parse_line(line, None if live else number)
        if event is not None:
            events.append(event)
    return events


def parse_line(line: str, number: int | None = None) -> dict | None:
    """One kernel log line in any of the module docstring's forms -> an event, or None. `number`: the line's
    place in a copy, the event's `seq` when the line has no kmsg header. Never raises on any text."""
    if not isinstance(line, str):
        return None
    line = line[:LINE_MAX].split("\n", 1)[0].rstrip("\r")  # a live record's dictionary lines follow it
    seq, usec, message = _strip_prefix(line)
    if message is None:
        return None
    if seq is None:
        if number is None:
            return None
        seq = number
    at = message.find("NVRM: ")
    if at < 0:
        return None
    body = message[at:]
    event = _xid_form(body) or _fallen_off_form(body)
    if event is None:
        return None
    event = {"seq": seq, **({"usec": usec} if usec is not None else {}), **event}
    event["text"] = body.strip()[:TEXT_MAX]
    return event


def parse_xid_record(line: str) -> dict | None:
    """A /dev/kmsg record (`prio,seq,usec,flags;message`) -> event, or None (no header: not a record)."""
    if ";" not in line[:120]:
        return None
    seq, _usec, message = _kmsg_header(line)
    return parse_line(line) if seq is not None and message is not None else None


# ---- prefixes ----------------------------------------------------------------------------------------------


def _bounded_digits(text: str, most: int) -> bool:
    """Decimal digits, at most `most` of them: a garbled record is skipped, never makes int() raise."""
    return 0 < len(text) <= most and is_digits(text)


def _kmsg_header(line: str) -> tuple[int | None, int | None, str | None]:
    header, sep, message = line.partition(";")
    fields = header.split(",")
    if (
        not sep
        or len(fields) < 3
        or not _bounded_digits(fields[0].strip(), 4)
        or not _bounded_digits(fields[1].strip(), 20)
        or not _bounded_digits(fields[2].strip(), 20)
    ):
        return None, None, None
    return int(fields[1]), int(fields[2]), message


def _strip_prefix(line: str) -> tuple[int | None, int | None, str | None]:
    """(kmsg seq or None, kernel usec or None, the rest): a kmsg header, a `[sec.usec]` or `[ctime]` dmesg
    stamp, a syslog/journal `Mon DD HH:MM:SS host kernel:` prefix (which may carry a dmesg stamp after it),
    or none. (None, None, None) for a line that starts like a kmsg header but is not a well-formed one."""
    if line[:1].isdigit() and ";" in line[:200]:
        seq, usec, message = _kmsg_header(line)
        return (seq, usec, message) if seq is not None else (None, None, None)
    text = line.lstrip()
    usec = None
    if text[:3] in _MONTHS and text[3:4] == " ":
        marker = text.find(" kernel: ", 0, 200)
        if marker > 0:
            text = text[marker + len(" kernel: ") :]
    if text.startswith("["):
        close = text.find("]", 0, 64)
        if close > 0:
            stamp = text[1:close].strip()
            usec = _dmesg_usec(stamp)
            if usec is not None or _is_ctime(stamp):
                text = text[close + 1 :]
    return None, usec, text


def _dmesg_usec(stamp: str) -> int | None:
    whole, dot, frac = stamp.partition(".")
    if not dot or not _bounded_digits(whole, 12) or not _bounded_digits(frac, 9):
        return None
    return int(whole) * 1_000_000 + int((frac + "000000")[:6])


def _is_ctime(stamp: str) -> bool:
    """`Fri Aug 30 11:43:09 2024` (dmesg --ctime / -T)."""
    parts = stamp.split()
    return (
        len(parts) == 5
        and parts[0] in _DAYS
        and parts[1] in _MONTHS
        and _bounded_digits(parts[2], 2)
        and len(parts[3]) == 8
        and parts[3].count(":") == 2
        and _bounded_digits(parts[4], 4)
    )


# ---- messages ----------------------------------------------------------------------------------------------


def pci_address(text: str) -> str | None:
    """`0000:47:00` from `PCI:0000:47:00`, `0000:47:00.0` or `00000000:47:00.0` (lower case, no function);
    None unless the text is exactly such an address."""
    text = text.strip()
    if text[:4].upper() == "PCI:":
        text = text[4:]
    base, dot, function = text.partition(".")
    if dot and not (len(function) == 1 and function in "01234567"):
        return None
    parts = base.split(":")
    if (
        len(parts) != 3
        or not 4 <= len(parts[0]) <= 8
        or len(parts[1]) != 2
        or len(parts[2]) != 2
        or not all(c in _HEX for c in base.replace(":", ""))
    ):
        return None
    return base.lower()


def _xid_form(body: str) -> dict | None:
    """`NVRM: Xid (PCI:0000:47:00): 79, rest` -> {pci, xid}."""
    marker = "NVRM: Xid ("
    if not body.startswith(marker):
        return None
    rest = body[len(marker) :]
    address, sep, tail = rest.partition("):")
    pci = pci_address(address) if sep and len(address) <= 24 else None
    if pci is None:
        return None
    code = tail.strip().split(",", 1)[0].strip()
    if not _bounded_digits(code, 6):
        return None
    return {"pci": pci, "xid": int(code)}


def _fallen_off_form(body: str) -> dict | None:
    """`NVRM: GPU at 0000:01:00.0 has fallen off the bus.` (no Xid number) -> Xid 79, inferred."""
    marker = "NVRM: GPU at "
    if not body.startswith(marker) or "has fallen off the bus" not in body:
        return None
    address = body[len(marker) :].split(" ", 1)[0].rstrip(":")
    pci = pci_address(address)
    return {"pci": pci, "xid": 79, "inferred": True} if pci else None
