"""What one collective-communication log says: the CommLog that parse() returns, and its parts.

Plain frozen dataclasses, every field a fact read from the log (counts, names, versions), nothing judged:
judging them against the partition is verdict.py's. Tuples keep first-seen order and are bounded (names
cut to NAME_MAX characters, lists to LIST_MAX items), so no log can make a CommLog large.
"""

from __future__ import annotations

from dataclasses import dataclass

NCCL, RCCL, HCCL, UNKNOWN_LIBRARY = "nccl", "rccl", "hccl", "unknown"
LIBRARIES = (NCCL, RCCL, HCCL, UNKNOWN_LIBRARY)
SEND, RECEIVE, UNDIRECTED = "send", "receive", ""

NAME_MAX = 64  # characters kept of a name read from the log (interface, plugin, provider, host)
LIST_MAX = 16  # distinct values kept per list (hosts, interfaces, plugins, ...)
EXAMPLE_MAX = 160  # characters kept of an example message

# The kinds of NCCL WARN line (problems.py classifies them). BENIGN ones are counted but are no error.
WARN_KINDS = ("completion", "create_qp", "ibverbs", "ofi", "connection", "cuda", "system", "msccl", "other")
BENIGN_WARNS = frozenset({"msccl"})

# Formats a line can belong to (CommLog.formats, docs/comm.md names a capture for each).
FMT_NCCL = "nccl-info"  # `host:pid:tid [dev] NCCL INFO|WARN ...`
FMT_BARE = "nccl-bare"  # NCCL's messages without the prefix (a poster stripped it; `NCCL version` lines)
FMT_TABLE = "nccl-tests"  # nccl-tests / rccl-tests tables and their `#` header
FMT_HCCL_TEST = "hccl_test"  # hccl_test's `|` table
FMT_TORCH = "torch-watchdog"  # PyTorch ProcessGroupNCCL watchdog lines
FMT_HCCL = "hccl"  # Ascend HCCL / CANN error lines
FMT_TRACEBACK = "traceback"  # a Python traceback
FMT_MPI = "mpirun"  # Open MPI's abort footer


@dataclass(frozen=True)
class Nic:
    """A NIC NCCL listed: `NET/IB : Using [0]mlx5_0:1/IB` (group -1) or the merged-port form
    `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}` (group 0: the ports NCCL merged into its NIC 0)."""

    device: str
    port: int
    link: str  # IB, RoCE, IB/SHARP, RoCE/SHARP
    group: int = -1


@dataclass(frozen=True)
class ChannelCount:
    """How many channel lines connected through one transport, in one direction, with or without GDR.

    transport: `NET/IB`, `NET/IBext_v8`, `NET/Socket`, `NET/AWS Libfabric`, `P2P/IPC`, `P2P/CUMEM`,
    `P2P/direct pointer`, `SHM`, ... (the device index and flags dropped). direction: send or receive for
    NET lines (which always name it), '' for P2P and SHM. gdr: the line ends in `/GDRDMA` (NET only)."""

    transport: str
    direction: str
    gdr: bool
    count: int

    @property
    def net(self) -> bool:
        return self.transport.startswith("NET/")


@dataclass(frozen=True)
class WarnCount:
    kind: str  # one of WARN_KINDS
    count: int
    example: str  # the first such message (after `NCCL WARN `), cut to EXAMPLE_MAX


@dataclass(frozen=True)
class CodeCount:
    """A code and how often it was seen: an ibv_wc_status (`with error 5` / `status=12`), an HCCL error code
    (`EI0006`) or an HCCL return code (`error code is 6`, `hcclRet -> 9`)."""

    code: str
    count: int


@dataclass(frozen=True)
class CommLog:
    """The facts of one log (or of several combined: combine.py).

    library: nccl, rccl (RCCL prints `NCCL INFO` too: told apart by its banner and paths), hccl or unknown;
    version: `2.27.5` (digits only; '' when none seen), build: what followed `+` (`cuda12.9`, or the literal
    garbage `cudaCUDA_MAJOR.CUDA_MINOR` of some builds).
    networks: the `Using network X` values; net_plugins / collnet_plugins: plugins NCCL loaded;
    plugins_failed: loaded net plugins that then failed, with plugin_failure the line that shows it
    (`plugin/net.cc:118 -> 2`) and after_failure what NCCL went on with: (transport, evidence) pairs, the
    transport IB or Socket, the evidence `channels` (its channel lines), `network` (`Using network IB`,
    `NET/IB : Using ...`) or `init` (NCCL_IB_* read after the failure); no_plugin: NCCL said no plugin
    was found (not a failure: none installed).
    ib_no_device: `NET/IB : No device found.`; ibverbs_missing: `Failed to open libibverbs.so`.
    nics: the NICs of `NET/IB : Using ...`; socket_ifs: the interfaces of `NET/Socket : Using ...`;
    bootstrap_ifs: `Bootstrap : Using ...` and the NET/IB line's OOB interface; ofi_providers: `NET/OFI
    Selected Provider is ...`.
    gdr_enabled / gdr_disabled: `GPU Direct RDMA Enabled|Disabled for ...` lines (hints: only a channel's
    /GDRDMA proves GDR); gdr_read_off: an Enabled line said `read 0` (GDR reads, the send side, off);
    gdr_distance: the reason of a Disabled line, e.g. `distance 4 > 2`.
    channels: channel lines per transport, direction and GDR.
    env: `NCCL_X set by environment to Y` pairs (NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME, ...).
    hosts: the host names of the line prefixes.
    warns: NCCL WARN lines by kind; completions: IB completion error statuses; vendor_errors: their vendor
    error codes; peers: the peers they name.
    watchdog_timeouts: PyTorch `Watchdog caught collective operation timeout` lines, watchdog_ops their
    OpTypes, watchdog_timeout_ms the largest Timeout(ms).
    hccl_codes: HCCL error codes (EI0006, EI9999 ...); hccl_returns: HCCL return codes; hccl_errors:
    `[ERROR] HCCL(...)` plog lines; hccl_link_timeouts: LINK_ERROR_INFO rows whose status is `time out`.
    test_failures: `Test NCCL failure` / `NCCL failure file.cu:N '...'` lines (nccl-tests), test_failure
    the first.
    formats: the kinds of line seen (model.FMT_*). lines: lines read; nccl_lines: NCCL's own lines;
    table_lines: benchmark table lines; not_understood: lines of no format known; damaged: lines skipped
    for NUL bytes, bytes that are not UTF-8 or their length; partial: the data ended inside a line (that
    line is not read); cut: the data was the head and tail of a longer file (cap.py's marker, or parse's
    own cap); bytes_read / bytes_skipped: what parse read and what its own cap left out; error: an internal
    error of the parser ('' normally): the log is then unknown, never a failure.
    """

    library: str = UNKNOWN_LIBRARY
    version: str = ""
    build: str = ""
    networks: tuple[str, ...] = ()
    net_plugins: tuple[str, ...] = ()
    collnet_plugins: tuple[str, ...] = ()
    plugins_failed: tuple[str, ...] = ()
    plugin_failure: str = ""
    after_failure: tuple[tuple[str, str], ...] = ()
    no_plugin: bool = False
    ib_no_device: bool = False
    ibverbs_missing: bool = False
    nics: tuple[Nic, ...] = ()
    socket_ifs: tuple[str, ...] = ()
    bootstrap_ifs: tuple[str, ...] = ()
    ofi_providers: tuple[str, ...] = ()
    gdr_enabled: int = 0
    gdr_disabled: int = 0
    gdr_read_off: bool = False
    gdr_distance: str = ""
    channels: tuple[ChannelCount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    hosts: tuple[str, ...] = ()
    warns: tuple[WarnCount, ...] = ()
    completions: tuple[CodeCount, ...] = ()
    vendor_errors: tuple[int, ...] = ()
    peers: tuple[str, ...] = ()
    watchdog_timeouts: int = 0
    watchdog_ops: tuple[str, ...] = ()
    watchdog_timeout_ms: int = 0
    hccl_codes: tuple[CodeCount, ...] = ()
    hccl_returns: tuple[CodeCount, ...] = ()
    hccl_errors: int = 0
    hccl_link_timeouts: int = 0
    test_failures: int = 0
    test_failure: str = ""
    formats: tuple[str, ...] = ()
    lines: int = 0
    nccl_lines: int = 0
    table_lines: int = 0
    not_understood: int = 0
    damaged: int = 0
    partial: bool = False
    cut: bool = False
    bytes_read: int = 0
    bytes_skipped: int = 0
    error: str = ""

    def env_value(self, name: str) -> str | None:
        for key, value in self.env:
            if key == name:
                return value
        return None
