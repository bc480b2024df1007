"""judge(logs, expect) -> NodeVerdict: a node's logs against what its partition expects.

The rules (verdict.py names the statuses):
- Socket used: `Using network Socket`, or NET/Socket channel lines, or (NCCL 2.4, which printed no `Using
  network`) `NET/IB : No device found` / libibverbs missing, no working net plugin, and NET/Socket's
  interfaces listed. RDMA used: `Using network IB|IBext*|...Libfabric`, NET channels through those, or
  (2.4 again) the NICs of `NET/IB : Using ...` with no network line.
- fallback: Socket used on an ib or roce partition; on a tcp partition, a NET/Socket interface that
  fabric.socket_ifname does not admit.
- no_gdr: GDR expected and an RDMA NET channel line without /GDRDMA, per direction. GDR expected with RDMA
  used but no such line at all is the note gdr_unshown, not a finding: absence of lines proves nothing.
- plugin_failed: a net plugin loaded and NCCL's plugin loader then failed (plugin/net.cc:N -> code), or a
  plugin loaded and every network and channel was NCCL's own (IB, Socket).
- errors: WARN lines of an error kind (all but RCCL's MSCCL++ notice), watchdog timeouts, HCCL codes and
  error lines, nccl-tests' NCCL failures.
- the status is the worst finding; without one, ok when the log shows the transport (a network or channel
  this judges), else unknown with the reason as a note. No logs at all: not_judged.
Never raises: an internal error is unknown with the note parser_error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .combine import combine
from .expect import TCP, Expectation, ifname_matches
from .model import BENIGN_WARNS, CommLog
from .verdict import (
    ERRORS,
    FALLBACK,
    FINDINGS,
    NO_GDR,
    NOT_JUDGED,
    OK,
    PLUGIN_FAILED,
    UNKNOWN,
    NetUse,
    NodeVerdict,
)

NAME_MAX, ITEMS_MAX = 40, 6  # what a verdict keeps of names and lists: it travels in AdminComment
INTERNAL = ("IB", "Socket")


def is_rdma_net(net: str) -> bool:
    """NCCL's own IB (IB and RoCE alike), the SHARP plugin's IBext*, aws-ofi-nccl's (AWS) Libfabric."""
    return net == "IB" or net.startswith("IBext") or net.endswith("Libfabric")


def judge(logs: Sequence[CommLog], expect: Expectation) -> NodeVerdict:
    try:
        return _judge(list(logs), expect)
    except Exception:  # a bug in a rule must not cost the epilog: the node is then unknown
        return NodeVerdict(UNKNOWN, notes=("parser_error",), fabric=str(getattr(expect, "fabric", ""))[:16])


def net_use(log: CommLog) -> tuple[NetUse, ...]:
    per: dict[str, list[int]] = {}
    for c in log.channels:
        if not c.net:
            continue
        counts = per.setdefault(c.transport[4:], [0, 0, 0, 0])
        i = 0 if c.direction == "send" else 2
        counts[i] += c.count
        if c.gdr:
            counts[i + 1] += c.count
    return tuple(NetUse(name[:NAME_MAX], *counts) for name, counts in per.items())


def _judge(logs: list[CommLog], expect: Expectation) -> NodeVerdict:
    gdr = bool(expect.gdr) and expect.rdma
    base = NodeVerdict(
        NOT_JUDGED,
        fabric=str(expect.fabric)[:16],
        gdr=gdr,
        gdr_level=str(expect.gdr_level)[:16] if gdr else "",
        socket_ifname=str(expect.socket_ifname)[:NAME_MAX],
    )
    if not logs:
        return base
    log = combine(logs)
    net = net_use(log)
    notes: list[str] = []
    working = [p for p in log.net_plugins if p not in log.plugins_failed]
    shown = bool(log.networks or net)
    socket_inferred = (
        not shown and (log.ib_no_device or log.ibverbs_missing) and not working and bool(log.socket_ifs)
    )
    socket_used = "Socket" in log.networks or any(u.transport == "Socket" for u in net) or socket_inferred
    rdma_used = (
        any(is_rdma_net(n) for n in log.networks)
        or any(is_rdma_net(u.transport) for u in net)
        or (not shown and bool(log.nics) and not log.ib_no_device)
    )
    findings: list[str] = []

    wrong_if = expect.fabric == TCP and bool(expect.socket_ifname)
    wrong_if = wrong_if and any(not ifname_matches(expect.socket_ifname, i) for i in log.socket_ifs)
    if socket_used and (expect.rdma or wrong_if):
        findings.append(FALLBACK)
    if socket_inferred:
        notes.append("socket_inferred")

    rdma_units = [u for u in net if is_rdma_net(u.transport)]
    if gdr and rdma_units:
        if any(u.send > u.send_gdr or u.recv > u.recv_gdr for u in rdma_units):
            findings.append(NO_GDR)
    elif gdr and rdma_used:
        notes.append("gdr_unshown")

    plugin, trace = "", ""
    if log.plugins_failed:
        plugin, trace = log.plugins_failed[0], log.plugin_failure
    elif (
        working
        and shown
        and all(n in INTERNAL for n in log.networks)
        and all(u.transport in INTERNAL for u in net)
    ):
        plugin = working[0]  # loaded, yet NCCL's own transports carried everything
    own, own_how = _own(log, net) if plugin else ("", "")
    if plugin:
        findings.append(PLUGIN_FAILED)

    errors = _errors(log)
    if errors or log.hccl_codes or log.hccl_returns:
        findings.append(ERRORS)

    findings.sort(key=FINDINGS.index)
    if findings:
        status = findings[0]
    elif socket_used or rdma_used:
        status = OK
    else:
        status = UNKNOWN
        notes.append(_why_unknown(log))
    notes.extend(_cause_notes(log, expect, rdma_used))
    return replace(
        base,
        status=status,
        findings=tuple(findings),
        notes=tuple(dict.fromkeys(notes)),
        library=log.library,
        version=log.version[:16],
        networks=tuple(n[:NAME_MAX] for n in log.networks[:ITEMS_MAX]),
        socket_ifs=tuple(i[:NAME_MAX] for i in log.socket_ifs[:ITEMS_MAX]) if socket_used else (),
        net=net[:ITEMS_MAX],
        plugin=plugin[:NAME_MAX],
        plugin_trace=trace[: NAME_MAX * 2],
        own=own,
        own_how=own_how,
        errors=errors,
        completions=tuple((int(c.code), c.count) for c in log.completions[:ITEMS_MAX]),
        vendor_errors=log.vendor_errors[:ITEMS_MAX],
        hccl_codes=tuple((c.code, c.count) for c in log.hccl_codes[:ITEMS_MAX]),
        hccl_returns=tuple((int(c.code), c.count) for c in log.hccl_returns[:ITEMS_MAX]),
        benign=sum(w.count for w in log.warns if w.kind in BENIGN_WARNS),
        gdr_reason=log.gdr_distance[:NAME_MAX],
        logs=len(logs),
        lines=log.lines,
        nccl_lines=log.nccl_lines,
        not_understood=log.not_understood,
    )


def _own(log: CommLog, net: tuple[NetUse, ...]) -> tuple[str, str]:
    """What NCCL used instead of the failed plugin, and the evidence: channels, network or init."""
    for transport in INTERNAL:
        if any(u.transport == transport for u in net):
            return transport, "channels"
    for transport in INTERNAL:
        if transport in log.networks:
            return transport, "network"
    rank = {"init": 0, "network": 1, "channels": 2}
    best = sorted(log.after_failure, key=lambda pair: -rank.get(pair[1], 0))
    return best[0] if best else ("", "")


def _errors(log: CommLog) -> tuple[tuple[str, int], ...]:
    errors = [(w.kind, w.count) for w in log.warns if w.kind not in BENIGN_WARNS]
    for kind, count in (
        ("watchdog", log.watchdog_timeouts),
        ("test_failure", log.test_failures),
        ("hccl_error", log.hccl_errors),
        ("hccl_link_timeout", log.hccl_link_timeouts),
    ):
        if count:
            errors.append((kind, count))
    return tuple(errors[:12])


def _why_unknown(log: CommLog) -> str:
    if log.error:
        return "parser_error"
    if log.nccl_lines:
        return "setup_only"
    if log.table_lines:
        return "tables_only"
    return "no_nccl"


def _cause_notes(log: CommLog, expect: Expectation, rdma_used: bool) -> list[str]:
    notes = []
    if log.ib_no_device:
        notes.append("ib_no_device")
    if log.ibverbs_missing:
        notes.append("no_verbs")
    if log.env_value("NCCL_IB_DISABLE") == "1":
        notes.append("ib_disabled")
    if log.gdr_read_off:
        notes.append("gdr_read_off")
    if expect.fabric == TCP and rdma_used:
        notes.append("rdma_on_tcp")
    if expect.fabric not in ("ib", "roce", "tcp"):
        notes.append("fabric_unknown")
    if log.cut:
        notes.append("cut")
    if log.damaged:
        notes.append("damaged")
    if log.error:
        notes.append("parser_error")
    return notes
