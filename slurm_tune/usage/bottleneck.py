"""Which of compute, storage, communication (or the host) bound a job: the verdict `stune-job` gives.

The playbook's order (docs/whyslow.md): look at the GPUs first; if they idle, at storage (data loading over
about 20 % of a step is fixed before NCCL); only then at the network. Each rule reads measurements the job's
record holds (usage/summary.py: the GPU sums and timeline; usage/perf.py: network, storage, host and GPU
I/O; usage/steps.py: the training script's own step times; comm/: the transport NCCL used) and says its
numbers. A measurement that is missing is "unmeasured" with why; no rule guesses from one that is.

Pure: `Evidence` in, `Diagnosis` out. `usage/whyslow.py` builds the evidence from a job's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COMPUTE, STORAGE, COMMUNICATION, HOST, UNCLEAR, UNMEASURED = (
    "compute",
    "storage",
    "communication",
    "host",
    "unclear",
    "unmeasured",
)
BOUNDS = (COMPUTE, STORAGE, COMMUNICATION, HOST, UNCLEAR, UNMEASURED)

GPU_BUSY = 85.0  # % SM: at or above, the GPUs are the bottleneck (what is left is framework-level)
DATA_WAIT_MAX = 0.20  # the playbook's "about 20 % of a step" waiting for data
STORAGE_NEAR_BASELINE = (
    0.70  # reading at this share of the node's fio baseline (or more) is the device's limit
)
NET_BUSY = 0.50  # network at this share of line rate in the GPU's idle phases: communication-bound
CPU_BUSY = 0.90  # the job's CPUs this busy while its GPUs wait: the input pipeline is starved of CPU
CLOCK_THROTTLED = 0.85  # mean SM clock below this share of its maximum: power or thermal throttling
SAWTOOTH_DROPS = 3  # utilization falls (>= 60 % to <= 20 %) summed over GPUs that make a sawtooth


@dataclass(frozen=True)
class Measure:
    """One measured quantity, or why it is missing (`value` None and `why` set)."""

    value: float | None
    why: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None


UNKNOWN = Measure(None, "not in the job's record")


@dataclass(frozen=True)
class Storage:
    device: str  # `nvme0n1`, `nfs 10.0.0.1:/datasets`
    role: str  # `cache tier`, `dataset source`, `local disk`
    node: str  # where this reading is from (the busiest node)
    read_bps: float  # bytes/s while the GPUs waited (their idle phases) where known, else over the job
    baseline_bps: float | None = None  # the node's fio read baseline for this device, where one is stored
    shared: bool = False  # another job used the node meanwhile: the reading is node-wide


@dataclass(frozen=True)
class Network:
    kind: str  # `IB`, `RoCE`, `TCP`
    line_share_idle: float  # share of line rate in the GPU's idle phases
    line_share: float  # over the job
    rate_bps: float  # bytes/s in the GPU's idle phases
    node: str  # the busiest node, '' when the rate is the job's per node
    shared: bool = False


@dataclass(frozen=True)
class Evidence:
    gpu_util: Measure = UNKNOWN  # mean SM % over the sampled time
    drops: int = 0  # sawtooth falls, summed over GPUs
    gpus: int = 0
    clock_share: Measure = UNKNOWN  # mean SM clock / max
    data_wait: Measure = UNKNOWN  # the steps file's data-wait share p50 (0..1)
    storage: Storage | None = None
    storage_why: str = "not in the job's record"  # why storage is unmeasured, when `storage` is None
    network: Network | None = None
    network_why: str = "not in the job's record"
    cpu_share: Measure = UNKNOWN  # the job's CPU time / (CPUs x time)
    transport: list[str] = field(default_factory=list)  # the transport verdict's lines (comm/)
    transport_bad: bool = False  # the transport verdict found a fallback, missing GDR or errors


@dataclass(frozen=True)
class Diagnosis:
    bound: str  # one of BOUNDS
    headline: str  # the finding with its numbers, in the playbook's words
    advice: str  # what to do
    lines: list[str]  # the other measurements, each with its number or "unmeasured (why)"

    def as_dict(self) -> dict:
        return {"bound": self.bound, "headline": self.headline, "advice": self.advice, "lines": self.lines}


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def rate_words(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _storage_line(s: Storage | None, why: str) -> str:
    if s is None:
        return f"storage: unmeasured ({why})"
    base = f", {_pct(s.read_bps / s.baseline_bps)} of {s.node}'s fio baseline" if s.baseline_bps else ""
    shared = " (node-wide: another job shared the node)" if s.shared else ""
    return f"storage: {s.role} {s.device} read at {rate_words(s.read_bps)} on {s.node}{base}{shared}"


def _network_line(n: Network | None, why: str) -> str:
    if n is None:
        return f"network: unmeasured ({why})"
    shared = " (node-wide: another job shared the node)" if n.shared else ""
    where = f" on {n.node}" if n.node else " per node"
    return (
        f"network: {n.kind} at {_pct(n.line_share_idle)} of line rate in the GPU's idle phases "
        f"({rate_words(n.rate_bps)}{where}), {_pct(n.line_share)} over the job{shared}"
    )


def _storage_bound(e: Evidence) -> str | None:
    """Why storage bound the job, or None: the script's own data wait, or the device at its limit while the
    GPUs waited."""
    s = e.storage
    if e.data_wait.known and (e.data_wait.value or 0) > DATA_WAIT_MAX:
        where = f"; {_storage_line(s, e.storage_why)[9:]}" if s else ""
        return f"data loading took {_pct(e.data_wait.value or 0)} of a step (median){where}"
    if s is not None and s.baseline_bps and s.read_bps >= STORAGE_NEAR_BASELINE * s.baseline_bps:
        return (
            f"the {s.role} {s.device} read at {rate_words(s.read_bps)}, {_pct(s.read_bps / s.baseline_bps)} of "
            f"{s.node}'s fio baseline"
        )
    return None


def diagnose(e: Evidence) -> Diagnosis:
    lines = [_storage_line(e.storage, e.storage_why), _network_line(e.network, e.network_why)]
    lines.append(
        f"host: the job's CPUs {_pct(e.cpu_share.value or 0)} busy"
        if e.cpu_share.known
        else f"host: unmeasured ({e.cpu_share.why})"
    )
    if e.clock_share.known:
        lines.append(f"SM clock: {_pct(e.clock_share.value or 0)} of its maximum")
    if e.data_wait.known:
        lines.append(f"data wait: {_pct(e.data_wait.value or 0)} of a step (median, from your steps file)")
    lines += e.transport
    if not e.gpu_util.known:
        return Diagnosis(
            UNMEASURED,
            f"GPU utilization unmeasured ({e.gpu_util.why}): no verdict",
            "check that stune-gpu-sampler runs on the job's nodes (stune-admin doctor)",
            lines,
        )
    util = e.gpu_util.value or 0.0
    shape = " in a sawtooth" if e.drops >= SAWTOOTH_DROPS else ""
    gpu = f"GPU busy {util:.0f} %"
    if util >= GPU_BUSY:
        throttled = e.clock_share.known and (e.clock_share.value or 0) < CLOCK_THROTTLED
        advice = "framework-level tuning (mixed precision, batch size, kernels) is where speed is"
        if throttled:
            advice = (
                f"the SM clock ran at {_pct(e.clock_share.value or 0)} of its maximum: check power and "
                f"cooling (nvidia-smi -q -d PERFORMANCE) before tuning the framework"
            )
        return Diagnosis(COMPUTE, f"{gpu}: compute-bound", advice, lines)
    storage = _storage_bound(e)
    if storage:
        return Diagnosis(
            STORAGE,
            f"GPU {util:.0f} %{shape} while {storage}: storage-bound",
            "stage the dataset (stune-sbatch --stage) or pack small files into shards before touching NCCL",
            lines,
        )
    n = e.network
    if n is not None and n.line_share_idle >= NET_BUSY:
        return Diagnosis(
            COMMUNICATION,
            f"GPU {util:.0f} %{shape}; {n.kind} at {_pct(n.line_share_idle)} of line rate in the GPU's idle "
            f"phases: communication-bound",
            "check --switches (one leaf switch), the topology and gradient accumulation (fewer, larger "
            "all-reduces)" + ("; and the transport verdict below" if e.transport_bad else ""),
            lines,
        )
    if e.cpu_share.known and (e.cpu_share.value or 0) >= CPU_BUSY:
        return Diagnosis(
            HOST,
            f"GPU {util:.0f} %{shape} while the job's CPUs were {_pct(e.cpu_share.value or 0)} busy: "
            "host-bound",
            "give the data loader more CPUs (--cpus-per-task) or move preprocessing off the training loop",
            lines,
        )
    missing = [name for name, m in (("storage", e.storage), ("network", e.network)) if m is None]
    return Diagnosis(
        UNCLEAR,
        f"GPU {util:.0f} %{shape}: not compute-bound, and the measurements do not show why"
        + (f" ({' and '.join(missing)} unmeasured)" if missing else ""),
        "time the data loader and the step in your script (docs/steps.md), or profile one step "
        "(torch.profiler) to see where the GPU waits",
        lines,
    )
