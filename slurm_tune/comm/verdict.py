"""A node's transport verdict (NodeVerdict), its statuses and notes, and its AdminComment form.

Statuses, worst first: the FINDINGS, which can hold several at once (the status is the worst of them), then
ok, unknown and not_judged:
- fallback: an RDMA partition whose job used NET/Socket, or a TCP partition whose sockets used an interface
  the profile's fabric.socket_ifname does not admit;
- no_gdr: GPUDirect RDMA expected and NET channels without /GDRDMA, in one or both directions;
- plugin_failed: a net plugin loaded, then failed (or was not used), and NCCL used its own transport;
- errors: NCCL WARN lines that are errors, PyTorch watchdog timeouts, HCCL error or return codes,
  nccl-tests' NCCL failures;
- ok: the log shows the transport used and none of the above;
- unknown: a log that shows no transport and no error (cut, narrowed NCCL_DEBUG_SUBSYS, a table, garbage);
- not_judged: no NCCL log at all (the job used gloo, or set NCCL_DEBUG / NCCL_DEBUG_FILE itself).
A NodeVerdict holds exactly what its words (words.py) need, and encode() / decode() carry all of it, so a
verdict read back from AdminComment says the same as the one the epilog made.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import encoding as wire

FALLBACK, NO_GDR, PLUGIN_FAILED, ERRORS = "fallback", "no_gdr", "plugin_failed", "errors"
OK, UNKNOWN, NOT_JUDGED = "ok", "unknown", "not_judged"
FINDINGS = (FALLBACK, NO_GDR, PLUGIN_FAILED, ERRORS)
STATUSES = (*FINDINGS, OK, UNKNOWN, NOT_JUDGED)

# Notes: facts beside the status, never a status of their own.
NOTES = (
    "gdr_unshown",  # GDR expected, RDMA used, but no NET channel line shows GDR either way
    "gdr_read_off",  # NCCL said `read 0`: GDR reads (the send side) off
    "ib_no_device",  # NET/IB : No device found
    "no_verbs",  # libibverbs could not be opened
    "ib_disabled",  # NCCL_IB_DISABLE=1 in the job's environment
    "socket_inferred",  # NCCL 2.4-era log: Socket inferred from `No device found` and no plugin
    "rdma_on_tcp",  # a TCP partition whose job used an RDMA network
    "fabric_unknown",  # the expectation names no fabric this judges
    "tables_only",  # only benchmark tables, no NCCL line
    "setup_only",  # NCCL lines, but no network choice nor channel line
    "no_nccl",  # no line of NCCL's, no error: nothing usable
    "cut",  # the log was the head and tail of a longer file
    "damaged",  # lines skipped: NUL, bytes not UTF-8, over-long
    "parser_error",  # an internal error of the parser or the judge
)

STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}  # lower is worse


@dataclass(frozen=True)
class NetUse:
    """NET channel lines of one transport (`IB`, `IBext_v8`, `Socket`, `AWS Libfabric`): per direction,
    all and those with /GDRDMA."""

    transport: str
    send: int = 0
    send_gdr: int = 0
    recv: int = 0
    recv_gdr: int = 0


@dataclass(frozen=True)
class NodeVerdict:
    """status: one of STATUSES; findings: the FINDINGS that hold, worst first; notes: NOTES codes.
    Expected: fabric, gdr (and gdr_level, the profile's nccl.net_gdr_level), socket_ifname.
    Seen: library and version; networks (`Using network`); socket_ifs (NET/Socket's interfaces, when Socket
    was used); net (NET channel lines per transport); plugin: the failed net plugin, plugin_trace the line
    that shows it, own / own_how what NCCL used instead (IB, Socket) and the evidence (channels, network,
    init); errors: (kind, count) of WARN kinds that are errors, `watchdog`, `test_failure`, `hccl_error`,
    `hccl_link_timeout`; completions: (ibv_wc_status, count); vendor_errors; hccl_codes: (EIxxxx, count);
    hccl_returns: (HCCL return code, count); benign: harmless warnings counted; gdr_reason: why NCCL said
    GDR was disabled (`distance 4 > 2`, `no module`); logs, lines, nccl_lines, not_understood: how much was
    read."""

    status: str
    findings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    fabric: str = ""
    gdr: bool = False
    gdr_level: str = ""
    socket_ifname: str = ""
    library: str = ""
    version: str = ""
    networks: tuple[str, ...] = ()
    socket_ifs: tuple[str, ...] = ()
    net: tuple[NetUse, ...] = ()
    plugin: str = ""
    plugin_trace: str = ""
    own: str = ""
    own_how: str = ""
    errors: tuple[tuple[str, int], ...] = ()
    completions: tuple[tuple[int, int], ...] = ()
    vendor_errors: tuple[int, ...] = ()
    hccl_codes: tuple[tuple[str, int], ...] = ()
    hccl_returns: tuple[tuple[int, int], ...] = ()
    benign: int = 0
    gdr_reason: str = ""
    logs: int = 0
    lines: int = 0
    nccl_lines: int = 0
    not_understood: int = 0

    def encode(self) -> str:
        """The AdminComment token (encoding.py's format)."""
        return wire.pack(self.status, [(key, dump(getattr(self, attr))) for key, attr, _ in _FIELDS])

    def error_count(self) -> int:
        return sum(n for _, n in self.errors) + sum(n for _, n in self.hccl_codes)


# key on the wire, field, how to read it back: str, int, flag, list (of str), rows<arity>:<types>
_FIELDS = (
    ("f", "findings", "list"),
    ("n", "notes", "list"),
    ("x", "fabric", "str"),
    ("g", "gdr", "flag"),
    ("gl", "gdr_level", "str"),
    ("i", "socket_ifname", "str"),
    ("l", "library", "str"),
    ("v", "version", "str"),
    ("w", "networks", "list"),
    ("s", "socket_ifs", "list"),
    ("t", "net", "netuse"),
    ("p", "plugin", "str"),
    ("pt", "plugin_trace", "str"),
    ("o", "own", "str"),
    ("oh", "own_how", "str"),
    ("e", "errors", "s~i"),
    ("c", "completions", "i~i"),
    ("u", "vendor_errors", "ints"),
    ("h", "hccl_codes", "s~i"),
    ("r", "hccl_returns", "i~i"),
    ("b", "benign", "int"),
    ("gr", "gdr_reason", "str"),
    ("k", "logs", "int"),
    ("ln", "lines", "int"),
    ("nl", "nccl_lines", "int"),
    ("nu", "not_understood", "int"),
)


def dump(value) -> str:
    if isinstance(value, bool):
        return "1" if value else ""
    if isinstance(value, int):
        return str(value) if value else ""
    if isinstance(value, str):
        return wire.escape(value)
    if value and isinstance(value[0], NetUse):
        return wire.items((u.transport, u.send, u.send_gdr, u.recv, u.recv_gdr) for u in value)
    return wire.items(value)


def _load(kind: str, raw: str):
    """The field's value from its wire text, or None when the text is not one."""
    if kind == "str":
        return wire.unescape(raw)
    if kind == "int":
        return wire.number(raw)
    if kind == "flag":
        return True if raw == "1" else None
    if kind == "list":
        rows = wire.parse_items(raw, 1)
        return None if rows is None else tuple(r[0] for r in rows)
    if kind == "ints":
        rows = wire.parse_items(raw, 1)
        nums = [wire.number(r[0]) for r in rows or []]
        return None if rows is None or None in nums else tuple(nums)
    if kind == "netuse":
        out = []
        for row in wire.parse_items(raw, 5) or [()]:
            counts = [wire.number(p) for p in row[1:]]
            if not row or None in counts:
                return None
            out.append(NetUse(row[0], *counts))  # type: ignore[arg-type]
        return tuple(out)
    first = kind.partition("~")[0]
    out2 = []
    for row in wire.parse_items(raw, 2) or [()]:
        if not row:
            return None
        a = wire.number(row[0]) if first == "i" else row[0]
        b = wire.number(row[1])
        if a is None or b is None:
            return None
        out2.append((a, b))
    return tuple(out2)


def decode(text: str) -> NodeVerdict | None:
    """The NodeVerdict an encode() made, or None for anything else (never raises)."""
    try:
        unpacked = wire.unpack(text)
        if unpacked is None or unpacked[0] not in STATUSES:
            return None
        status, raw = unpacked
        values: dict = {}
        for key, attr, kind in _FIELDS:
            if key in raw:
                value = _load(kind, raw[key])
                if value is None:
                    return None
                values[attr] = value
        if not set(values.get("findings", ())) <= set(FINDINGS):
            return None
        values["notes"] = tuple(n for n in values.get("notes", ()) if n in NOTES)
        return NodeVerdict(status, **values)
    except Exception:  # defensive: the text is anyone's
        return None
