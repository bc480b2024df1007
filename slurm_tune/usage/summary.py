"""The per-job usage summary: merged from node summaries, stored in AdminComment as one line of text.

    stune1 held=7200.0 used=6480.2 cov=7195.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu=n1/0:90.1:40.2:30517:250.3,...

- held: GPU-seconds the job held on the nodes that reported (GPUs x prolog-to-epilog time)
- used: GPU-seconds of SM activity (sum of utilization x sampled time)
- cov:  GPU-seconds actually sampled (coverage = cov / held)
- busy, busy_w: GPU-seconds at >= the busy threshold (~100 %) and the mean power meanwhile (W)
- per_gpu: node/gpu:SM%:memory-util%:memory-used-MiB:power-W, means over the sampled time; '-' is unknown
- drops, noproc: utilization falls (>= 60 % to <= 20 %) summed over GPUs, and GPU-seconds with no process
- tl: the job's utilization over its run in 48 steps, '0'..'9' (x 100/9 %), '-' where nothing was sampled

Plain key=value text rather than JSON: sacctmgr turns '"' into '`', and `sacct -o AdminComment` stays
readable. The job-level numbers come first in a fixed order so the accountant parses a million of them fast.
"""

from __future__ import annotations

from collections import namedtuple

from .pipeline import ADMIN_COMMENT_PREFIX, admin_fields

PREFIX = ADMIN_COMMENT_PREFIX  # pipeline.py names the formats
MAX_PER_GPU = 1024  # keeps one AdminComment well under MySQL's TEXT limit (64 KiB)

# One GPU's accumulator fields, in file order (see accum.py). Sums are over sampled seconds (dt).
# noproc_dt: sampled seconds with no compute process on the GPU (counted as idle whatever the reading said);
# drops: falls from >= 60 % to <= 20 % utilization (the sawtooth of a loop waiting for data); hi: the
# hysteresis state behind `drops`.
ACC_FIELDS = (
    "gpu_id",
    "last_ts",
    "samples",
    "sm_dt",
    "sm_sum",
    "mem_dt",
    "mem_sum",
    "mib_dt",
    "mib_sum",
    "mib_max",
    "pw_dt",
    "pw_sum",
    "busy_dt",
    "busy_pw_dt",
    "busy_pw_sum",
    "nvml_index",
    "noproc_dt",
    "drops",
    "hi",
)
TIMELINE_LEN = 48  # characters of the job's utilization timeline in the summary ('0'-'9', '-' unmeasured)


class GpuMeans(namedtuple("GpuMeans", "node gpu sm mem mib watts")):
    """Means over one GPU's sampled time; None where never measured."""

    __slots__ = ()


class JobSummary(
    namedtuple(
        "JobSummary",
        "held used covered busy busy_w gpus nodes_reported nodes_expected per_gpu drops noproc timeline",
        defaults=(0, 0.0, ""),
    )
):
    """A job's GPU usage. Seconds are GPU-seconds; busy_w is None when there was no busy time."""

    __slots__ = ()

    def timeline_percent(self) -> list:
        """The timeline as percentages (None where unmeasured)."""
        return [None if c == "-" else int(c) * 100.0 / 9 for c in self.timeline if c == "-" or c.isdigit()]

    @property
    def coverage(self) -> float:
        return self.covered / self.held if self.held > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Mean SM utilization over the sampled time (0..1), None when nothing was sampled."""
        return min(max(self.used / self.covered, 0.0), 1.0) if self.covered > 0 else None


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def encode(summary: JobSummary) -> str:
    per_gpu = ",".join(
        f"{g.node}/{g.gpu}:{_num(g.sm)}:{_num(g.mem)}:{_num(g.mib, 0)}:{_num(g.watts)}"
        for g in summary.per_gpu[:MAX_PER_GPU]
    )
    return (
        f"{PREFIX}held={summary.held:.1f} used={summary.used:.1f} cov={summary.covered:.1f} "
        f"busy={summary.busy:.1f} busy_w={_num(summary.busy_w)} gpus={summary.gpus} "
        f"nodes={summary.nodes_reported}/{summary.nodes_expected} per_gpu={per_gpu} drops={summary.drops} "
        f"noproc={summary.noproc:.1f} tl={summary.timeline or '-'}"
    )


def _float(text: str):
    return None if text in ("-", "") else float(text)


def _timeline(text: str) -> str:
    text = text[:TIMELINE_LEN]
    return text if text.strip("-0123456789") == "" and text != "-" else ""


def parse(text: str) -> JobSummary | None:
    """The summary in an AdminComment, or None when it holds none (or something else, or garbage)."""
    if not text or not text.startswith(PREFIX):
        return None
    try:
        fields = admin_fields(text)
        reported, _, expected = fields.get("nodes", "0/0").partition("/")
        per_gpu = []
        for item in filter(None, fields.get("per_gpu", "").split(",")):
            where, sm, mem, mib, watts = item.rsplit(":", 4)
            node, _, gpu = where.rpartition("/")
            per_gpu.append(GpuMeans(node, gpu, _float(sm), _float(mem), _float(mib), _float(watts)))
        return JobSummary(
            float(fields["held"]),
            float(fields["used"]),
            float(fields["cov"]),
            float(fields.get("busy", "0")),
            _float(fields.get("busy_w", "-")),
            int(fields.get("gpus", "0")),
            int(reported or 0),
            int(expected or 0),
            tuple(per_gpu),
            int(fields.get("drops", "0")),
            float(fields.get("noproc", "0")),
            _timeline(fields.get("tl", "")),
        )
    except (KeyError, ValueError):
        return None


def parse_head(text: str):
    """Fast path for the accountant: (held, used, covered, busy, busy_w) or None. Falls back to parse()
    when the order is not the one encode() writes."""
    if not text.startswith(PREFIX):
        return None
    parts = text.split(" ", 6)
    try:
        if (
            parts[1][:5] == "held="
            and parts[2][:5] == "used="
            and parts[3][:4] == "cov="
            and parts[4][:5] == "busy="
            and parts[5][:7] == "busy_w="
        ):
            w = parts[5][7:]
            return (
                float(parts[1][5:]),
                float(parts[2][5:]),
                float(parts[3][4:]),
                float(parts[4][5:]),
                None if w == "-" else float(w),
            )
    except (IndexError, ValueError):
        pass
    full = parse(text)
    return None if full is None else (full.held, full.used, full.covered, full.busy, full.busy_w)


def merge(node_summaries: list[dict], expected_nodes: int | None = None) -> JobSummary:
    """One job summary from its nodes' summaries (spool.NodeSummary dicts): sums add, means are recomputed
    from the sums, so a 2-node job is exactly the two nodes together."""
    held = used = covered = busy = busy_pw_dt = busy_pw_sum = noproc = drops = 0.0
    gpus = 0
    per_gpu = []
    nodes = set()
    for node_summary in sorted(node_summaries, key=lambda s: s["node"]):
        nodes.add(node_summary["node"])
        span = max(0.0, float(node_summary["end"]) - float(node_summary["start"]))
        for gpu in node_summary["gpus"]:
            acc = gpu["acc"]
            gpus += 1
            held += span
            used += acc["sm_sum"]
            covered += acc["sm_dt"]
            busy += acc["busy_dt"]
            busy_pw_dt += acc["busy_pw_dt"]
            busy_pw_sum += acc["busy_pw_sum"]
            noproc += acc.get("noproc_dt", 0.0)
            drops += acc.get("drops", 0.0)
            per_gpu.append(
                GpuMeans(
                    node_summary["node"],
                    str(gpu["id"]),
                    100.0 * acc["sm_sum"] / acc["sm_dt"] if acc["sm_dt"] > 0 else None,
                    100.0 * acc["mem_sum"] / acc["mem_dt"] if acc["mem_dt"] > 0 else None,
                    acc["mib_sum"] / acc["mib_dt"] if acc["mib_dt"] > 0 else None,
                    acc["pw_sum"] / acc["pw_dt"] if acc["pw_dt"] > 0 else None,
                )
            )
    return JobSummary(
        held,
        used,
        covered,
        busy,
        busy_pw_sum / busy_pw_dt if busy_pw_dt > 0 else None,
        gpus,
        len(nodes),
        expected_nodes if expected_nodes is not None else len(nodes),
        tuple(per_gpu),
        int(drops),
        noproc,
        merge_timeline(node_summaries),
    )


def merge_timeline(node_summaries: list[dict], length: int = TIMELINE_LEN) -> str:
    """The nodes' series (accum.py) on one time axis, from the earliest start to the latest end, in `length`
    steps: each node bucket is spread over the steps its time span covers (a 20 s job with 10 s buckets
    still fills all 48 steps)."""
    series = [s["series"] for s in node_summaries if isinstance(s.get("series"), dict)]
    if not series:
        return ""
    start = min(float(s["start"]) for s in node_summaries)
    end = max(float(s["end"]) for s in node_summaries)
    span = max(end - start, 1e-9)
    sums, dts = [0.0] * length, [0.0] * length
    for one in series:
        t0, width = float(one.get("t0", start)), float(one.get("width", 0))
        for b, (sm, dt) in enumerate(zip(one.get("sm", ()), one.get("dt", ()))):
            if dt <= 0 or width <= 0:
                continue
            lo = (t0 + b * width - start) / span * length  # the bucket's span in steps
            hi = (min(t0 + (b + 1) * width, end) - start) / span * length
            lo, hi = max(lo, 0.0), min(max(hi, lo), float(length))
            if hi - lo < 1e-9:
                step = min(max(int(lo), 0), length - 1)
                sums[step] += sm
                dts[step] += dt
                continue
            for step in range(int(lo), min(int(hi) + 1, length)):
                share = (min(hi, step + 1) - max(lo, step)) / (hi - lo)
                if share > 0:
                    sums[step] += sm * share
                    dts[step] += dt * share
    return "".join("-" if dt <= 0 else str(min(9, max(0, round(9 * sm / dt)))) for sm, dt in zip(sums, dts))
