"""combine(logs) -> CommLog: the facts of several logs as one, e.g. a node's per-process files (NCCL writes
one per process with NCCL_DEBUG_FILE=...%h.%p.log). Counts add up, lists join in first-seen order within the
same bounds as one log's, flags hold when one log has them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .model import HCCL, LIST_MAX, NCCL, RCCL, UNKNOWN_LIBRARY, ChannelCount, CodeCount, CommLog, WarnCount


def _union(seqs: Iterable[tuple], limit: int = LIST_MAX) -> tuple:
    out: dict = {}
    for seq in seqs:
        for item in seq:
            if item not in out and len(out) < limit:
                out[item] = None
    return tuple(out)


def _codes(seqs: Iterable[tuple[CodeCount, ...]]) -> tuple[CodeCount, ...]:
    counts: dict[str, int] = {}
    for seq in seqs:
        for c in seq:
            if c.code in counts or len(counts) < LIST_MAX:
                counts[c.code] = counts.get(c.code, 0) + c.count
    return tuple(CodeCount(k, v) for k, v in counts.items())


def _first(values: Iterable[str]) -> str:
    return next((v for v in values if v), "")


def combine(logs: Sequence[CommLog]) -> CommLog:
    if len(logs) == 1:
        return logs[0]
    libraries = {log.library for log in logs}
    library = next((lib for lib in (RCCL, NCCL, HCCL) if lib in libraries), UNKNOWN_LIBRARY)
    versioned = next((log for log in logs if log.version), None)
    channels: dict[tuple[str, str, bool], int] = {}
    for log in logs:
        for c in log.channels:
            key = (c.transport, c.direction, c.gdr)
            channels[key] = channels.get(key, 0) + c.count
    warns: dict[str, list] = {}
    for log in logs:
        for w in log.warns:
            if w.kind in warns:
                warns[w.kind][0] += w.count
            else:
                warns[w.kind] = [w.count, w.example]
    after: dict[str, str] = {}
    rank = {"init": 0, "network": 1, "channels": 2}
    for log in logs:
        for net, how in log.after_failure:
            if net not in after or rank.get(how, 0) > rank.get(after[net], 0):
                after[net] = how
    env: dict[str, str] = {}
    for log in logs:
        for var, val in log.env:
            env.setdefault(var, val)
    return CommLog(
        library=library,
        version=versioned.version if versioned else "",
        build=versioned.build if versioned else "",
        networks=_union(log.networks for log in logs),
        net_plugins=_union(log.net_plugins for log in logs),
        collnet_plugins=_union(log.collnet_plugins for log in logs),
        plugins_failed=_union(log.plugins_failed for log in logs),
        plugin_failure=_first(log.plugin_failure for log in logs),
        after_failure=tuple(after.items()),
        no_plugin=any(log.no_plugin for log in logs),
        ib_no_device=any(log.ib_no_device for log in logs),
        ibverbs_missing=any(log.ibverbs_missing for log in logs),
        nics=_union(log.nics for log in logs),
        socket_ifs=_union(log.socket_ifs for log in logs),
        bootstrap_ifs=_union(log.bootstrap_ifs for log in logs),
        ofi_providers=_union(log.ofi_providers for log in logs),
        gdr_enabled=sum(log.gdr_enabled for log in logs),
        gdr_disabled=sum(log.gdr_disabled for log in logs),
        gdr_read_off=any(log.gdr_read_off for log in logs),
        gdr_distance=_first(log.gdr_distance for log in logs),
        channels=tuple(ChannelCount(t, d, g, n) for (t, d, g), n in channels.items()),
        env=tuple(list(env.items())[:32]),
        hosts=_union((log.hosts for log in logs), limit=64),
        warns=tuple(WarnCount(k, c, e) for k, (c, e) in warns.items()),
        completions=_codes(log.completions for log in logs),
        vendor_errors=_union(log.vendor_errors for log in logs),
        peers=_union(log.peers for log in logs),
        watchdog_timeouts=sum(log.watchdog_timeouts for log in logs),
        watchdog_ops=_union(log.watchdog_ops for log in logs),
        watchdog_timeout_ms=max((log.watchdog_timeout_ms for log in logs), default=0),
        hccl_codes=_codes(log.hccl_codes for log in logs),
        hccl_returns=_codes(log.hccl_returns for log in logs),
        hccl_errors=sum(log.hccl_errors for log in logs),
        hccl_link_timeouts=sum(log.hccl_link_timeouts for log in logs),
        test_failures=sum(log.test_failures for log in logs),
        test_failure=_first(log.test_failure for log in logs),
        formats=_union(log.formats for log in logs),
        lines=sum(log.lines for log in logs),
        nccl_lines=sum(log.nccl_lines for log in logs),
        table_lines=sum(log.table_lines for log in logs),
        not_understood=sum(log.not_understood for log in logs),
        damaged=sum(log.damaged for log in logs),
        partial=any(log.partial for log in logs),
        cut=any(log.cut for log in logs),
        bytes_read=sum(log.bytes_read for log in logs),
        bytes_skipped=sum(log.bytes_skipped for log in logs),
        error=_first(log.error for log in logs),
    )
