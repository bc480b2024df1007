"""What a job got beside what the node can do (issue 24 §1): network, storage, CPU and GPU-link numbers, from
the sampler's per-job perf records (perfrec.py) through the node summary to the job's AdminComment line.

The node summary's `perf` key (node_perf; JSON, sums over seconds so that nodes add):

    {"v": 1,
     "sampled_s": s, "idle_s": s,   seconds the node counters were read for the job; of them, seconds its GPUs
                                    were below 50 % SM (the GPU's idle phases)
     "shared_s": s,                 seconds another job ran on the node: ports and devices were shared, so the
                                    network and storage numbers are node-wide, not this job's alone
     "net": {"rule": "every ACTIVE IB/RoCE port", "ports": [{"name": "mlx5_0/1", "kind": "ib", "tx": B,
             "rx": B, "cap": B (line rate x measured s, one direction), "s": s, "idle_tx": B, "idle_rx": B,
             "idle_cap": B, "idle_s": s}]},
     "storage": {"devices": [{"name": "nvme0n1", "kind": "block"|"nfs", "roles": ["cache"|"source"|"disk"],
                 "read": B, "s": s, "idle_read": B, "idle_s": s, "busy": s (io_ticks), "busy_s": s}],
                 "unmeasured": [{"path": "/datasets", "role": "source", "why": "lustre-not-read"}]},
     "cpu": {"s": CPU-s, "over_s": s, "cpus": n | null, "why": null | "no-cgroup"},
     "gpu": {"pcie_tx": B, "pcie_rx": B, "pcie_s": GPU-s, "nvlink_tx": B, "nvlink_rx": B, "nvlink_s": GPU-s,
             "sm_mhz_s": MHz x GPU-s, "sm_max_mhz_s": MHz x GPU-s, "clock_s": GPU-s},
     "series": {"t0": t, "width": s, "net": [B], "cap": [B], "net_s": [s], "sto": [B], "sto_s": [s]},
     "notes": ["profile HCA mlx5_3/1 has no counters on this node", ...]}

A `*_s` of 0 with its sums at 0 means unmeasured, never "zero traffic". `merge()` makes one JobPerf of a job's
node summaries; `JobPerf.tokens()` is its part of the AdminComment line (space-separated key=value tokens, no
spaces in values; `-` is unmeasured) and `parse_tokens()` reads it back:

    pf_nodes=2 pf_s=7190.0 pf_idle=2400.5 pf_shared=0.0 net=ib net_bps=1.18e+09 net_frac=0.047
    net_idle_bps=2.1e+10 net_idle_frac=0.85 net_port=0.91 sto_bps=2.9e+09 sto_idle_bps=3.1e+09 sto_busy=0.97
    sto_dev=n1/nvme0n1:cache:2.9e+09,n2/nvme0n1:cache:2.8e+09 sto_un=source:lustre-not-read cpu_s=51234.0
    cpu_over=7190.0 cpus=64 cpu_why=- pcie_bps=1.2e+09 nvl_bps=8.1e+10 clk=0.93 net_tl=0123... sto_tl=99..
    sto_peak=3.1e+09

Rates are per node (bytes over node-seconds; for PCIe and NVLink per GPU, over GPU-seconds, tx + rx); a
fraction of line rate is the busier direction over the ports with a known rate; `net_port` is the busiest
port's. `*_tl` are 48 steps over the job, '0'-'9': the network's fraction of line rate (x 100/9 %), storage
relative to `sto_peak` (its '9', bytes/s per node); '-' where nothing was measured.
"""

from __future__ import annotations

import os
from collections import namedtuple

from . import perfrec

TIMELINE_LEN = 48
MAX_DEVICES_LISTED = 16
REASONS = {
    "no-cgroup": "no Slurm cgroup for the job (proctrack/cgroup or task/cgroup not in use)",
    "in-memory": "in memory (tmpfs): no device to measure",
    "not-mounted": "no mount holds the path",
    "mounts-unreadable": "the node's mount table could not be read",
    "no-device": "no path of the job's storage is known and the node shows no physical disk",
}


def reason_text(code: str) -> str:
    """Plain words for an unmeasured reason code (`lustre-not-read` -> `lustre: its client counters are not
    read`)."""
    if code in REASONS:
        return REASONS[code]
    if code.endswith("-not-read"):
        return f"{code[: -len('-not-read')]}: its client counters are not read"
    return code


def _r(x: float) -> float:
    return round(float(x), 3)


def node_perf(local_dir: str, job_id: str) -> dict | None:
    """This node's `perf` for the node summary; None when the sampler kept no perf record for the job."""
    try:
        rec = perfrec.read(os.path.join(local_dir, perfrec.PERF_DIR, job_id))
    except perfrec.PerfError:
        return None
    if rec is None:
        return None
    sc, notes = rec["scalars"], rec["notes"]
    ports = [{"name": n, "kind": k, **{f: _r(x) for f, x in v.items()}} for n, k, _, v in rec["ports"]]
    devices = [
        {"name": n, "kind": k, "roles": roles, **{f: _r(x) for f, x in v.items()}}
        for n, k, roles, v in rec["devices"]
    ]
    unmeasured = [
        {"path": u[0], "role": u[1], "why": u[2]}
        for u in notes.get("unmeasured") or []
        if isinstance(u, list) and len(u) == 3
    ]
    series = rec["series"]
    used = max((i + 1 for i, (a, b) in enumerate(zip(series["net_s"], series["sto_s"])) if a or b), default=0)
    return {
        "v": 1,
        "sampled_s": _r(sc["sampled_s"]),
        "idle_s": _r(sc["idle_s"]),
        "shared_s": _r(sc["shared_s"]),
        "net": {"rule": notes.get("rule") or "", "ports": ports},
        "storage": {"devices": devices, "unmeasured": unmeasured},
        "cpu": {
            "s": _r(sc["cpu_s"]),
            "over_s": _r(sc["cpu_over_s"]),
            "cpus": rec["cpus"],
            "why": notes.get("cpu"),
        },
        "gpu": {
            "pcie_tx": _r(sc["pcie_tx"]),
            "pcie_rx": _r(sc["pcie_rx"]),
            "pcie_s": _r(sc["pcie_s"]),
            "nvlink_tx": _r(sc["nvl_tx"]),
            "nvlink_rx": _r(sc["nvl_rx"]),
            "nvlink_s": _r(sc["nvl_s"]),
            "sm_mhz_s": _r(sc["clk"]),
            "sm_max_mhz_s": _r(sc["clk_max"]),
            "clock_s": _r(sc["clk_s"]),
        },
        "series": {
            "t0": rec["created"],
            "width": rec["width"],
            **{k: [_r(x) for x in v[:used]] for k, v in series.items()},
        },
        "notes": [n for n in notes.get("notes") or [] if isinstance(n, str)],
    }


# ---- the job: merge and the AdminComment tokens -------------------------------------------------------------------
class StoDev(namedtuple("StoDev", "node name roles bps")):
    """One storage device of the job: node, device name, roles ('cache+source'), read bytes/s (None)."""

    __slots__ = ()


class JobPerf(
    namedtuple(
        "JobPerf",
        "nodes sampled_s idle_s shared_s net_kind net_bps net_frac net_idle_bps net_idle_frac net_port_frac "
        "sto_bps sto_idle_bps sto_busy sto_devices sto_unmeasured cpu_s cpu_over_s cpus cpu_why "
        "pcie_bps nvlink_bps clock net_tl sto_tl sto_peak",
    )
):
    """A job's perf, merged over its nodes (module docstring: units and meaning). None is unmeasured;
    sto_unmeasured and cpu_why carry reason codes (reason_text gives the words)."""

    __slots__ = ()

    @property
    def node_wide(self) -> bool:
        """Another job shared a node: the network and storage numbers are the node's, not this job's."""
        return self.shared_s > 0

    @property
    def cpu_util(self) -> float | None:
        """CPU seconds used over the CPU seconds the job's CPUs could give while measured (0..1)."""
        if not self.cpus or not self.cpu_over_s or self.cpu_s is None:
            return None
        return self.cpu_s / (self.cpus / max(self.nodes, 1) * self.cpu_over_s)

    def tokens(self) -> str:
        return encode(self)


EMPTY = JobPerf(0, 0.0, 0.0, 0.0, "", None, None, None, None, None, None, None, None, (), (), None, None, None, "",
                None, None, None, "", "", None)  # fmt: skip
# what merge() adds over the nodes (bytes, seconds); i*: in the GPU's idle phases
# fmt: off
SUMS = ("s", "idle", "shared", "net", "net_s", "net_rated", "cap", "inet", "inet_s", "inet_rated", "icap", "sto",
        "sto_s", "isto", "isto_s", "cpu", "cpu_over", "pcie", "pcie_s", "nvl", "nvl_s", "clk", "clk_max")
# fmt: on


def _num(x) -> float:
    """A finite, non-negative float of untrusted JSON, else 0."""
    try:
        value = float(x)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return value if 0 <= value < float("inf") else 0.0


def _div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


class _Node:
    """One node's perf, read whole before anything of it is added (a malformed one adds nothing)."""

    def __init__(self, summary: dict, perf: dict):
        self.node = _clean(str(summary.get("node") or "?"))
        self.sums = dict.fromkeys(SUMS, 0.0)
        self.kinds: set[str] = set()
        self.port_frac: float | None = None
        self.busy: float | None = None
        self.devices: list[StoDev] = []
        add = self.sums
        add["s"], add["idle"], add["shared"] = (_num(perf[k]) for k in ("sampled_s", "idle_s", "shared_s"))
        self._net(perf["net"]["ports"])
        self._storage(perf["storage"]["devices"])
        self.unmeasured = [
            (_clean(str(u.get("role") or "-")), _clean(str(u.get("why") or "unknown")))
            for u in perf["storage"].get("unmeasured") or []
        ]
        cpu, gpu = perf["cpu"], perf["gpu"]
        add["cpu"], add["cpu_over"] = _num(cpu["s"]), _num(cpu["over_s"])
        self.cpus = int(_num(cpu.get("cpus"))) or None
        self.why = _clean(str(cpu.get("why") or ""))
        add["pcie"], add["pcie_s"] = _num(gpu["pcie_tx"]) + _num(gpu["pcie_rx"]), _num(gpu["pcie_s"])
        add["nvl"], add["nvl_s"] = _num(gpu["nvlink_tx"]) + _num(gpu["nvlink_rx"]), _num(gpu["nvlink_s"])
        add["clk"], add["clk_max"] = _num(gpu["sm_mhz_s"]), _num(gpu["sm_max_mhz_s"])

    def _net(self, ports: list) -> None:
        """The busier direction summed over the ports (and over those with a line rate, with their capacity),
        overall and in the GPU's idle phases; the busiest port's fraction of its rate."""
        add = self.sums
        for prefix in ("", "idle_"):
            tx = rx = rated_tx = rated_rx = cap_sum = seconds = 0.0
            for port in ports:
                t, r, cap, s = (_num(port[prefix + k]) for k in ("tx", "rx", "cap", "s"))
                if s <= 0:
                    continue
                tx, rx, seconds = tx + t, rx + r, max(seconds, s)
                if cap > 0:
                    rated_tx, rated_rx, cap_sum = rated_tx + t, rated_rx + r, cap_sum + cap
                if not prefix:
                    self.kinds.add(_clean(str(port.get("kind") or "?")))
                    self.port_frac = _max(self.port_frac, max(t, r) / cap) if cap > 0 else self.port_frac
            key = "i" if prefix else ""
            add[key + "net"], add[key + "net_s"] = max(tx, rx), seconds
            add[key + "net_rated"], add["icap" if prefix else "cap"] = max(rated_tx, rated_rx), cap_sum

    def _storage(self, devices: list) -> None:
        add = self.sums
        for dev in devices:
            read, s, iread, i_s = (_num(dev[k]) for k in ("read", "s", "idle_read", "idle_s"))
            if s <= 0:
                continue
            add["sto"], add["sto_s"] = add["sto"] + read, max(add["sto_s"], s)
            add["isto"], add["isto_s"] = add["isto"] + iread, max(add["isto_s"], i_s)
            if _num(dev.get("busy_s")) > 0:
                self.busy = _max(self.busy, min(1.0, _num(dev.get("busy")) / _num(dev.get("busy_s"))))
            roles = "+".join(str(r) for r in dev.get("roles") or []) or "-"
            self.devices.append(StoDev(self.node, _clean(str(dev["name"])), _clean(roles), read / s))


def merge(node_summaries: list[dict]) -> JobPerf:
    """One JobPerf from a job's node summaries; nodes without a (readable) `perf` are left out."""
    nodes, used = [], []
    for summary in sorted(node_summaries, key=lambda s: str(s.get("node"))):
        perf = summary.get("perf") if isinstance(summary, dict) else None
        if isinstance(perf, dict):
            try:
                nodes.append(_Node(summary, perf))
                used.append(summary)
            except (AttributeError, TypeError, ValueError, KeyError):
                continue
    if not nodes:
        return EMPTY
    t = {k: sum(n.sums[k] for n in nodes) for k in SUMS}
    port_frac = busy = None
    for n in nodes:
        port_frac, busy = _max(port_frac, n.port_frac), _max(busy, n.busy)
    net_tl, sto_tl, peak = timelines(used)
    return JobPerf(
        len(nodes),
        _r(t["s"]),
        _r(t["idle"]),
        _r(t["shared"]),
        "+".join(sorted(set().union(*(n.kinds for n in nodes)))),
        _div(t["net"], t["net_s"]),
        _div(t["net_rated"], t["cap"]),
        _div(t["inet"], t["inet_s"]),
        _div(t["inet_rated"], t["icap"]),
        port_frac,
        _div(t["sto"], t["sto_s"]),
        _div(t["isto"], t["isto_s"]),
        busy,
        tuple([d for n in nodes for d in n.devices][:MAX_DEVICES_LISTED]),
        tuple(sorted({u for n in nodes for u in n.unmeasured})),
        _r(t["cpu"]) if t["cpu_over"] else None,
        _r(t["cpu_over"]) if t["cpu_over"] else None,
        sum(n.cpus or 0 for n in nodes) or None,
        ",".join(sorted({n.why for n in nodes if n.why})),
        _div(t["pcie"], t["pcie_s"]),
        _div(t["nvl"], t["nvl_s"]),
        _div(t["clk"], t["clk_max"]),
        net_tl,
        sto_tl,
        peak,
    )


def _clean(text: str) -> str:
    """A token-safe value: no spaces, commas, '=' or control characters."""
    return "".join(c if " " < c < "\x7f" and c not in ",=" else "_" for c in text)[:80]


KEYS = ("net", "cap", "sto", "sto_s")  # the series the timelines read


def timelines(node_summaries: list[dict], length: int = TIMELINE_LEN) -> tuple[str, str, float | None]:
    """(network timeline, storage timeline, storage peak bytes/s): the nodes' series on one axis from the
    earliest start to the latest end, each bucket spread over the steps its span covers."""
    start = min(_num(s.get("start")) for s in node_summaries)
    end = max(_num(s.get("end")) for s in node_summaries)
    span = max(end - start, 1e-9)
    sums = {k: [0.0] * length for k in KEYS}
    for summary in node_summaries:
        series = summary["perf"].get("series")
        if not isinstance(series, dict):
            continue
        t0, width = _num(series.get("t0")), _num(series.get("width"))
        if width <= 0:
            continue
        columns: list[list] = [series[k] if isinstance(series.get(k), list) else [] for k in KEYS]
        for b, values in enumerate(zip(*columns)):
            lo = (t0 + b * width - start) / span * length
            hi = (min(t0 + (b + 1) * width, end) - start) / span * length
            lo, hi = min(max(lo, 0.0), length - 1e-9), min(max(hi, lo), float(length))
            for step in range(int(lo), min(int(hi) + 1, length)):
                share = 1.0 if hi - lo < 1e-9 else (min(hi, step + 1) - max(lo, step)) / (hi - lo)
                for key, value in zip(KEYS, values):
                    sums[key][step] += _num(value) * share
    net = "".join("-" if c <= 0 else str(min(9, round(9 * n / c))) for n, c in zip(sums["net"], sums["cap"]))
    rates = [b / s if s > 0 else None for b, s in zip(sums["sto"], sums["sto_s"])]
    peak = max((r for r in rates if r is not None), default=None)
    sto = "".join("-" if r is None else str(min(9, round(9 * r / peak))) if peak else "0" for r in rates)
    return ("" if set(net) == {"-"} else net), ("" if set(sto) == {"-"} else sto), peak


# ---- tokens ---------------------------------------------------------------------------------------------------------
def _g(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _f(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def encode(p: JobPerf) -> str:
    devices = ",".join(f"{d.node}/{d.name}:{d.roles}:{_g(d.bps)}" for d in p.sto_devices) or "-"
    unmeasured = ",".join(f"{role}:{why}" for role, why in p.sto_unmeasured) or "-"
    return (
        f"pf_nodes={p.nodes} pf_s={p.sampled_s:.1f} pf_idle={p.idle_s:.1f} pf_shared={p.shared_s:.1f} "
        f"net={p.net_kind or '-'} net_bps={_g(p.net_bps)} net_frac={_f(p.net_frac)} "
        f"net_idle_bps={_g(p.net_idle_bps)} net_idle_frac={_f(p.net_idle_frac)} net_port={_f(p.net_port_frac)} "
        f"sto_bps={_g(p.sto_bps)} sto_idle_bps={_g(p.sto_idle_bps)} sto_busy={_f(p.sto_busy)} "
        f"sto_dev={devices} sto_un={unmeasured} cpu_s={_f(p.cpu_s, 1)} cpu_over={_f(p.cpu_over_s, 1)} "
        f"cpus={p.cpus if p.cpus else '-'} cpu_why={p.cpu_why or '-'} pcie_bps={_g(p.pcie_bps)} "
        f"nvl_bps={_g(p.nvlink_bps)} clk={_f(p.clock)} net_tl={p.net_tl or '-'} sto_tl={p.sto_tl or '-'} "
        f"sto_peak={_g(p.sto_peak)}"
    )


def _opt(fields: dict, key: str):
    """A token's number: None for '-', missing or garbage (never an exception)."""
    text = fields.get(key)
    if not isinstance(text, str) or text in ("", "-") or len(text) > 32:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


def _word(fields: dict, key: str) -> str:
    text = fields.get(key)
    return "" if not isinstance(text, str) or text == "-" else _clean(text)


def _items(fields: dict, key: str, most: int) -> list[str]:
    """A list token's items (comma-separated), each made token-safe."""
    text = fields.get(key)
    if not isinstance(text, str) or text == "-":
        return []
    return [_clean(item) for item in text[:65536].split(",")[:most] if item]


def _tl(text) -> str:
    text = text[:TIMELINE_LEN] if isinstance(text, str) else ""
    return text if text and text != "-" and text.strip("-0123456789") == "" else ""


def parse_tokens(fields: dict[str, str]) -> JobPerf | None:
    """The JobPerf in an AdminComment line's key=value fields; None when the line has none. A garbled value
    reads as unmeasured; nothing here raises."""
    if not isinstance(fields, dict) or not isinstance(fields.get("pf_nodes"), str):
        return None
    nodes = _opt(fields, "pf_nodes")
    devices = []
    for item in _items(fields, "sto_dev", MAX_DEVICES_LISTED):
        where, _, rest = item.partition("/")
        parts = rest.rsplit(":", 2)
        if len(parts) == 3 and where:
            devices.append(StoDev(where, parts[0], parts[1], _opt({"v": parts[2]}, "v")))
    unmeasured = []
    for item in _items(fields, "sto_un", 64):
        role, sep, why = item.partition(":")
        if sep:
            unmeasured.append((role, why))
    cpus = _opt(fields, "cpus")
    return JobPerf(
        int(nodes) if nodes is not None and nodes < 1e9 else 0,
        _opt(fields, "pf_s") or 0.0,
        _opt(fields, "pf_idle") or 0.0,
        _opt(fields, "pf_shared") or 0.0,
        _word(fields, "net"),
        _opt(fields, "net_bps"),
        _opt(fields, "net_frac"),
        _opt(fields, "net_idle_bps"),
        _opt(fields, "net_idle_frac"),
        _opt(fields, "net_port"),
        _opt(fields, "sto_bps"),
        _opt(fields, "sto_idle_bps"),
        _opt(fields, "sto_busy"),
        tuple(devices),
        tuple(unmeasured),
        _opt(fields, "cpu_s"),
        _opt(fields, "cpu_over"),
        int(cpus) if cpus is not None and cpus < 1e9 else None,
        _word(fields, "cpu_why"),
        _opt(fields, "pcie_bps"),
        _opt(fields, "nvl_bps"),
        _opt(fields, "clk"),
        _tl(fields.get("net_tl")),
        _tl(fields.get("sto_tl")),
        _opt(fields, "sto_peak"),
    )
