"""A verdict in plain words: what was seen, with the numbers, against what the partition expects, and what
to check. messages(verdict, node) gives one line per finding (worst first), then the ok or unknown line and
the notes; `node` names the node in them (`ranks on n3 used NET/Socket over eth0`). Everything said comes
from the verdict's fields, so a verdict decoded from AdminComment reads the same."""

from __future__ import annotations

from .expect import FABRIC_WORDS, TCP
from .verdict import ERRORS, FALLBACK, NO_GDR, NOT_JUDGED, OK, PLUGIN_FAILED, UNKNOWN, NodeVerdict

# ibv_wc_status (verbs.h), and what the common ones mean for a job
WC_STATUS = {
    1: "LOC_LEN_ERR",
    2: "LOC_QP_OP_ERR",
    3: "LOC_EEC_OP_ERR",
    4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR",
    6: "MW_BIND_ERR",
    7: "BAD_RESP_ERR",
    8: "LOC_ACCESS_ERR",
    9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR",
    11: "REM_OP_ERR",
    12: "RETRY_EXC_ERR",
    13: "RNR_RETRY_EXC_ERR",
    14: "LOC_RDD_VIOL_ERR",
    15: "REM_INV_RD_REQ_ERR",
    16: "REM_ABORT_ERR",
    17: "INV_EECN_ERR",
    18: "INV_EEC_STATE_ERR",
    19: "FATAL_ERR",
    20: "RESP_TIMEOUT_ERR",
    21: "GENERAL_ERR",
}
WC_HINT = {
    4: "memory the HCA may not touch, often a GPUDirect RDMA registration",
    5: "flushed after an earlier error on the same connection",
    10: "the peer refused the access",
    12: "retries exhausted: a link, switch or peer stopped answering",
    13: "the receiver was not ready, retries exhausted",
}
# HcclResult (hccl_types.h)
HCCL_RESULT = {
    1: "HCCL_E_PARA",
    2: "HCCL_E_PTR",
    3: "HCCL_E_MEMORY",
    4: "HCCL_E_INTERNAL",
    5: "HCCL_E_NOT_SUPPORT",
    6: "HCCL_E_NOT_FOUND",
    7: "HCCL_E_UNAVAIL",
    8: "HCCL_E_SYSCALL",
    9: "HCCL_E_TIMEOUT",
    10: "HCCL_E_OPEN_FILE_FAILURE",
    11: "HCCL_E_TCP_CONNECT",
    12: "HCCL_E_ROCE_CONNECT",
    13: "HCCL_E_TCP_TRANSFER",
    14: "HCCL_E_ROCE_TRANSFER",
    15: "HCCL_E_RUNTIME",
    16: "HCCL_E_DRV",
    17: "HCCL_E_PROFILING",
    18: "HCCL_E_CCE",
    19: "HCCL_E_NETWORK",
    20: "HCCL_E_AGAIN",
    21: "HCCL_E_REMOTE",
}
HCCL_CODE = {"EI0006": "getting a socket timed out", "EI9999": "inner error"}
KIND_WORDS = {
    "completion": ("IB completion error", "IB completion errors"),
    "create_qp": ("ibv_create_qp failure", "ibv_create_qp failures"),
    "ibverbs": ("other verbs error", "other verbs errors"),
    "ofi": ("libfabric (aws-ofi-nccl) error", "libfabric (aws-ofi-nccl) errors"),
    "connection": ("connection error", "connection errors"),
    "cuda": ("CUDA error", "CUDA errors"),
    "system": ("failed system call", "failed system calls"),
    "other": ("other warning", "other warnings"),
}


def _n(count: int, words: tuple[str, str]) -> str:
    return f"{count} {words[0] if count == 1 else words[1]}"


def _partition(v: NodeVerdict) -> str:
    return f"{FABRIC_WORDS.get(v.fabric, v.fabric or 'unknown fabric')} partition"


def _level(v: NodeVerdict) -> str:
    return f" (profile nccl.net_gdr_level {v.gdr_level})" if v.gdr_level else ""


def messages(v: NodeVerdict, node: str | None = None, short: bool = False) -> list[str]:
    """The verdict's lines; `short`: without per-node counts (merge groups nodes by these)."""
    return [text for _, text in tagged(v, node, short)]


def tagged(v: NodeVerdict, node: str | None = None, short: bool = False) -> list[tuple[str, str]]:
    """(kind, line) pairs: kind a finding, `ok`, `unknown`, `note` or `not_judged`."""
    on = f" on {node}" if node else ""
    who = f"ranks on {node}" if node else "NCCL"
    if v.status == NOT_JUDGED:
        return [
            (
                NOT_JUDGED,
                f"not judged{on}: no NCCL log (the job used no NCCL, e.g. gloo, or set NCCL_DEBUG or "
                "NCCL_DEBUG_FILE itself)",
            )
        ]
    out: list[tuple[str, str]] = []
    for finding in v.findings:
        if finding == FALLBACK:
            out.append((finding, fallback(v, who)))
        elif finding == NO_GDR:
            out.append((finding, no_gdr(v, on, short)))
        elif finding == PLUGIN_FAILED:
            out.append((finding, plugin_failed(v, on)))
        elif finding == ERRORS:
            out.extend((finding, text) for text in errors(v, on, short))
    if v.status == OK:
        out.append((OK, ok(v, who, short)))
    elif v.status == UNKNOWN:
        out.append((UNKNOWN, unknown(v, on, short)))
    if "gdr_unshown" in v.notes:
        out.append(
            (
                "note",
                f"GPUDirect RDMA expected{_level(v)}, but no NET channel line{on} shows whether it was used",
            )
        )
    if "rdma_on_tcp" in v.notes:
        nets = ", ".join(v.networks) or ", ".join(f"NET/{u.transport}" for u in v.net) or "IB"
        out.append(("note", f"TCP partition, but {who} used {nets}: is the profile's fabric.type right?"))
    if v.benign:
        counted = "harmless warnings" if short else _n(v.benign, ("harmless warning", "harmless warnings"))
        out.append(("note", f"{counted}{on} counted (RCCL's MSCCL++ notice)"))
    return out


def fallback(v: NodeVerdict, who: str) -> str:
    ifs = ", ".join(v.socket_ifs)
    if v.fabric == TCP:
        return (
            f"TCP partition: NCCL's sockets should use {v.socket_ifname} (profile fabric.socket_ifname), "
            f"but {who} used {ifs or 'another interface'}"
        )
    text = f"{_partition(v)}, but {who} used NET/Socket" + (f" over {ifs}" if ifs else "")
    if "ib_disabled" in v.notes:
        text += " (NCCL_IB_DISABLE=1 is set in the job's environment)"
    elif "no_verbs" in v.notes:
        text += " (NCCL could not open libibverbs: are the RDMA user libraries there, e.g. in the container?)"
    elif "ib_no_device" in v.notes:
        text += " (NET/IB found no device: are the HCA ports up and visible to the job?)"
    rdma = [u.transport for u in v.net if u.transport != "Socket"] or [n for n in v.networks if n != "Socket"]
    if rdma:
        text += f"; other connections used {', '.join(rdma)}"
    return text


def no_gdr(v: NodeVerdict, on: str, short: bool = False) -> str:
    units = [u for u in v.net if u.transport != "Socket"]
    send, send_gdr = sum(u.send for u in units), sum(u.send_gdr for u in units)
    recv, recv_gdr = sum(u.recv for u in units), sum(u.recv_gdr for u in units)
    missing = [d for d, n, g in (("send", send, send_gdr), ("receive", recv, recv_gdr)) if n > g]
    transports = "/".join(dict.fromkeys(f"NET/{u.transport}" for u in units))
    counts = "; ".join(
        f"{d}: {g} of {n} {transports} channel lines with /GDRDMA"
        for d, n, g in (("send", send, send_gdr), ("receive", recv, recv_gdr))
        if n
    )
    if missing == ["send"] and "gdr_read_off" in v.notes:
        hint = (
            "NCCL printed `read 0`: GDR reads, which the send side needs, are off by default on this "
            "platform (NCCL_NET_GDR_READ=1 turns them on)"
        )
    elif v.gdr_reason.startswith("distance"):
        hint = (
            f"NCCL said GPU Direct RDMA is disabled ({v.gdr_reason}): the GPU and the HCA are further apart "
            "than the level allows"
        )
    elif "no module" in v.gdr_reason:
        hint = "NCCL found no GPUDirect RDMA kernel module: is nvidia-peermem loaded?"
    else:
        hint = "is nvidia-peermem loaded?"
    counted = "" if short else f" ({counts})"
    return f"GPUDirect RDMA expected{_level(v)} but not used{on} for {' and '.join(missing)}{counted}: {hint}"


def plugin_failed(v: NodeVerdict, on: str) -> str:
    if v.plugin_trace:
        text = f"net plugin {v.plugin} failed{on} ({v.plugin_trace})"
    else:
        text = f"net plugin {v.plugin} loaded{on} but carried no connection"
    if v.own and v.own_how in ("channels", "network"):
        return f"{text}, NCCL used its own {v.own}"
    if v.own:
        return (
            f"{text}, NCCL used its own {v.own} (it read NCCL_IB_* after the failure; no channel line "
            "shows the connections)"
        )
    return f"{text}, NCCL used its own transport"


def errors(v: NodeVerdict, on: str, short: bool = False) -> list[str]:
    """One line per source: NCCL's warnings, PyTorch's watchdog, nccl-tests, HCCL; `short`: no counts."""

    def count(n: int, words: tuple[str, str]) -> str:
        return words[1] if short else _n(n, words)

    def times(n: int) -> str:
        return "" if short else f" x{n}"

    out = []
    counts = dict(v.errors)
    parts = []
    for kind, words in KIND_WORDS.items():
        if counts.get(kind):
            part = count(counts[kind], words)
            if kind == "completion" and v.completions:
                part += f" ({completion_words(v, short)})"
            parts.append(part)
    if parts:
        out.append(f"NCCL warnings{on}: {', '.join(parts)}")
    if counts.get("watchdog"):
        timed_out = count(counts["watchdog"], ("collective timed out", "collectives timed out"))
        out.append(f"PyTorch watchdog{on}: {timed_out}")
    if counts.get("test_failure"):
        out.append(f"nccl-tests{on}: {count(counts['test_failure'], ('NCCL failure', 'NCCL failures'))}")
    hccl = [
        f"{code}{times(n)}" + (f" ({HCCL_CODE[code]})" if code in HCCL_CODE else "")
        for code, n in v.hccl_codes
    ]
    hccl += [
        f"return code {r}" + (f" {HCCL_RESULT[r]}" if r in HCCL_RESULT else "") + times(n)
        for r, n in v.hccl_returns
    ]
    if counts.get("hccl_error"):
        hccl.append(count(counts["hccl_error"], ("error line", "error lines")))
    if counts.get("hccl_link_timeout"):
        hccl.append(count(counts["hccl_link_timeout"], ("link timed out", "links timed out")))
    if hccl:
        out.append(f"HCCL errors{on}: {', '.join(hccl)}")
    return out


def completion_words(v: NodeVerdict, short: bool = False) -> str:
    parts = []
    for status, n in v.completions:
        name = WC_STATUS.get(status, "")
        hint = WC_HINT.get(status, "")
        counted = "" if short else f", x{n}"
        parts.append(
            f"status {status}" + (f" {name}" if name else "") + (f": {hint}" if hint else "") + counted
        )
    text = "; ".join(parts)
    if v.vendor_errors:
        text += f"; vendor err {', '.join(str(e) for e in v.vendor_errors)}"
    return text


def ok(v: NodeVerdict, who: str, short: bool = False) -> str:
    units = [u for u in v.net if u.transport != "Socket"]
    socket = bool(v.socket_ifs) or "Socket" in v.networks or len(units) < len(v.net)
    if socket and not units:
        ifs = f" over {', '.join(v.socket_ifs)}" if v.socket_ifs else ""
        return f"{_partition(v)}: {who} used NET/Socket{ifs}"
    if not units:
        return f"{who} used {', '.join(v.networks) or 'IB'} (no channel line in the log)"
    parts = []
    for u in units:
        lines = u.send + u.recv
        if u.send_gdr == u.send and u.recv_gdr == u.recv:
            gdr = " with GPUDirect RDMA in both directions"
        elif u.send_gdr or u.recv_gdr:
            gdr = " with GPUDirect RDMA in part"
        else:
            gdr = " without GPUDirect RDMA"
        counted = "" if short else f" ({_n(lines, ('channel line', 'channel lines'))})"
        parts.append(f"NET/{u.transport}{gdr}{counted}")
    return f"{who} used {', '.join(parts)}"


def unknown(v: NodeVerdict, on: str, short: bool = False) -> str:
    if "parser_error" in v.notes:
        return f"the log{on} could not be read (an internal error of stune's parser)"
    if v.networks:
        return f"NCCL{on} used network {', '.join(v.networks)}, which stune does not judge"
    if "setup_only" in v.notes:
        return (
            f"no transport shown{on}: {'' if short else f'{v.nccl_lines} '}NCCL lines but no network choice nor channel line "
            "(the log was cut before NCCL connected, or NCCL_DEBUG_SUBSYS leaves out INIT and NET)"
        )
    if "tables_only" in v.notes:
        return f"no NCCL log line{on}: only a benchmark table, which shows no transport"
    return f"nothing usable{on}: {'lines' if short else _n(v.lines, ('line', 'lines'))}, none of them NCCL's"
