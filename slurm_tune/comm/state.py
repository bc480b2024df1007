"""The parser's running tally of one log: what the line readers (channels.py, netinfo.py, problems.py,
tables.py) add to as parse() goes, and freeze() turns into the CommLog.

Every collection is bounded: at most model.LIST_MAX distinct keys (then new keys are dropped, counts of
known ones still grow), names cut to model.NAME_MAX characters, so no log can make the tally large.
"""

from __future__ import annotations

from .model import (
    EXAMPLE_MAX,
    FMT_BARE,
    FMT_NCCL,
    HCCL,
    LIST_MAX,
    NAME_MAX,
    NCCL,
    RCCL,
    UNKNOWN_LIBRARY,
    ChannelCount,
    CodeCount,
    CommLog,
    WarnCount,
)

INTERNAL_NETS = ("IB", "Socket")  # NCCL's own transports; any other network is a plugin's


def note(keys: dict, key, limit: int = LIST_MAX) -> None:
    """Add `key` to the ordered set `keys` while it has room."""
    if key not in keys and len(keys) < limit:
        keys[key] = None


def bump(counts: dict, key, by: int = 1, limit: int = LIST_MAX) -> None:
    if key in counts:
        counts[key] += by
    elif len(counts) < limit:
        counts[key] = by


def name(text: str) -> str:
    return text[:NAME_MAX]


class State:
    def __init__(self) -> None:
        self.rccl = self.hccl = self.torch = False
        self.version = self.build = ""
        self.networks: dict = {}
        self.net_plugins: dict = {}
        self.collnet_plugins: dict = {}
        self.plugins_failed: dict = {}
        self.plugin_failure = ""
        self.pending_plugin = ""  # the last net plugin loaded, until it fails or is used
        self.after_failure: dict = {}
        self.no_plugin = self.ib_no_device = self.ibverbs_missing = False
        self.nics: dict = {}
        self.nic_lines: dict[str, bool] = {}  # NIC lists read already, and whether they named a NIC
        self.socket_ifs: dict = {}
        self.bootstrap_ifs: dict = {}
        self.ofi_providers: dict = {}
        self.gdr_enabled = self.gdr_disabled = 0
        self.gdr_read_off = False
        self.gdr_distance = ""
        self.channels: dict = {}  # (transport, direction, gdr) -> lines
        self.env: dict = {}
        self.hosts: dict = {}
        self.warns: dict = {}  # kind -> [count, example]
        self.completions: dict = {}
        self.vendor_errors: dict = {}
        self.peers: dict = {}
        self.watchdog_timeouts = self.watchdog_timeout_ms = 0
        self.watchdog_ops: dict = {}
        self.hccl_codes: dict = {}
        self.hccl_returns: dict = {}
        self.hccl_errors = self.hccl_link_timeouts = 0
        self.test_failures = 0
        self.test_failure = ""
        self.formats: dict = {}
        self.lines = self.nccl_lines = self.bare_lines = self.table_lines = 0
        self.not_understood = self.damaged = 0

    # ---- what several readers share -------------------------------------------------------------------
    def plugin_loaded(self, plugin: str) -> None:
        plugin = name(plugin)
        if plugin and plugin not in INTERNAL_NETS:
            note(self.net_plugins, plugin)
            self.pending_plugin = plugin

    def plugin_failed(self, evidence: str) -> None:
        """A failure from NCCL's plugin loader (`plugin/net.cc:118 -> 2`), after a plugin loaded."""
        if self.pending_plugin:
            note(self.plugins_failed, self.pending_plugin)
            self.plugin_failure = self.plugin_failure or evidence[:EXAMPLE_MAX]
            self.pending_plugin = ""

    def internal_used(self, net: str, how: str) -> None:
        """NCCL showed its own transport `net` (IB, Socket) in use; `how`: network, channels or init. After a
        plugin failure, that is what NCCL went on with; the strongest evidence is kept per transport."""
        if self.plugins_failed and net in INTERNAL_NETS:
            rank = {"init": 0, "network": 1, "channels": 2}
            old = self.after_failure.get(net)
            if old is None or rank[how] > rank[old]:
                self.after_failure[net] = how

    def warn(self, kind: str, message: str) -> None:
        if kind in self.warns:
            self.warns[kind][0] += 1
        else:
            self.warns[kind] = [1, message.strip()[:EXAMPLE_MAX]]

    # ---- the CommLog ------------------------------------------------------------------------------------
    def library(self) -> str:
        if self.rccl:
            return RCCL
        if self.nccl_lines or self.bare_lines or self.version:
            return NCCL
        if self.hccl:
            return HCCL
        return NCCL if self.torch else UNKNOWN_LIBRARY

    def freeze(self, *, partial: bool, cut: bool, bytes_read: int, bytes_skipped: int) -> CommLog:
        formats = dict(self.formats)
        if self.nccl_lines:
            formats = {FMT_NCCL: None, **formats}
        if self.bare_lines:
            note(formats, FMT_BARE)
        return CommLog(
            library=self.library(),
            version=self.version,
            build=self.build,
            networks=tuple(self.networks),
            net_plugins=tuple(self.net_plugins),
            collnet_plugins=tuple(self.collnet_plugins),
            plugins_failed=tuple(self.plugins_failed),
            plugin_failure=self.plugin_failure,
            after_failure=tuple(self.after_failure.items()),
            no_plugin=self.no_plugin,
            ib_no_device=self.ib_no_device,
            ibverbs_missing=self.ibverbs_missing,
            nics=tuple(self.nics),
            socket_ifs=tuple(self.socket_ifs),
            bootstrap_ifs=tuple(self.bootstrap_ifs),
            ofi_providers=tuple(self.ofi_providers),
            gdr_enabled=self.gdr_enabled,
            gdr_disabled=self.gdr_disabled,
            gdr_read_off=self.gdr_read_off,
            gdr_distance=self.gdr_distance,
            channels=tuple(ChannelCount(t, d, g, n) for (t, d, g), n in self.channels.items()),
            env=tuple(self.env.items()),
            hosts=tuple(self.hosts),
            warns=tuple(WarnCount(k, c, e) for k, (c, e) in self.warns.items()),
            completions=tuple(CodeCount(str(k), v) for k, v in self.completions.items()),
            vendor_errors=tuple(self.vendor_errors),
            peers=tuple(self.peers),
            watchdog_timeouts=self.watchdog_timeouts,
            watchdog_ops=tuple(self.watchdog_ops),
            watchdog_timeout_ms=self.watchdog_timeout_ms,
            hccl_codes=tuple(CodeCount(k, v) for k, v in self.hccl_codes.items()),
            hccl_returns=tuple(CodeCount(str(k), v) for k, v in self.hccl_returns.items()),
            hccl_errors=self.hccl_errors,
            hccl_link_timeouts=self.hccl_link_timeouts,
            test_failures=self.test_failures,
            test_failure=self.test_failure,
            formats=tuple(formats),
            lines=self.lines,
            nccl_lines=self.nccl_lines + self.bare_lines,
            table_lines=self.table_lines,
            not_understood=self.not_understood,
            damaged=self.damaged,
            partial=partial,
            cut=cut,
            bytes_read=bytes_read,
            bytes_skipped=bytes_skipped,
        )
