"""The per-node GPU sampler: every interval, read each GPU once and add the reading to the accumulators of the
job that Slurm allocated that GPU to.

Attribution comes from the prolog's records (`<local_dir>/jobs/<jobid>` holding SLURM_JOB_GPUS). The
sampler notices new and finished jobs from one stat() of that directory per tick, and reads no GPU at all
while the node runs no GPU job. Slurm puts no ids in the Prolog's (or the TaskProlog's) environment for a GRES
other than gpu (gres/npu: plugin-less, counts and device files only), so the prolog records such a job as
`?`; on a node whose devices are such a GRES (the profile's gpu.gres, npu on Ascend) the sampler asks Slurm
once per new job (`scontrol show job -d`: `GRES=npu:2(IDX:0-1)` on the node's line, slurm_resolver) and
keeps the answer in the job's accumulators, where a restarted sampler and the node epilog find it. Each sample stands for the time since the previous one, capped at
`max_gap` intervals: if the sampler was down, the gap is not counted as sampled (coverage drops, and a
job with too little coverage is charged as Slurm charges it, eta = 1).

The device source follows the node's profile `accelerator` (open_source): nvidia reads NVML (or replays a
snapshot's `gpus` section), amd reads amdsmi (hw/amd.py's AmdSource), ascend runs `npu-smi info` once per tick
(hw/ascend.py's utilization); a replayed snapshot of an AMD or Ascend node is read from its `accel` section
(hw/accel.py). Each backend is imported only on the nodes that need it.

Slurm's GPU ids are positions in gres.conf, which sites list by device minor number (/dev/nvidia0..7);
NVML numbers GPUs by PCI order. The map is read once from /proc/driver/nvidia/gpus/<bus>/information
("Device Minor"); where that is missing (snapshot sources, odd drivers) the NVML index is used. AMD and
Ascend readings are numbered by their device file already (`index` is the minor: N of /dev/davinciN, the
render node's number less 128), which is gres.conf's order for gres/npu over /dev/davinci* and gres/gpu over
/dev/dri/renderD*: no map is needed.

Honest idleness: a GPU with no compute process on it (NVML's running-process list, read with the
utilization; amdsmi's and npu-smi's process tables on AMD and Ascend) is idle whatever a stale utilization
reading says; a GPU whose utilization its tool cannot report (MIG, NVML_ERROR_NOT_SUPPORTED, npu-smi's `-`,
a tool that timed out) reads None and is unmeasured, never 0 %: it adds no sampled time, so the job's
coverage drops and the accountant charges it as Slurm does (eta = 1). Where the tool cannot list processes
(None), the utilization reading is trusted.

Beside the GPUs (issue 24 §1), with a `perf` (perfrec.NodePerf): each tick the node's network ports, storage
devices and the jobs' cgroups are read once, whatever the number of jobs, into each running job's perf
record (`<local_dir>/perf/<jobid>`), with the job's GPUs' PCIe, NVLink and SM clock readings.

This module imports no numpy and nothing heavy: it runs for the node's lifetime next to the jobs.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

from ..errors import StuneError
from ..hw.accel import SECTION as ACCEL_SECTION
from ..hw.accel import utilization_from_section
from ..hw.nvml import SnapshotGpuSource, open_gpu_source, utilization_from_snapshot
from . import accum, pipeline, spool

MAX_GAP_INTERVALS = 2.5
RESOLVE_RETRY_S = 15.0  # a job whose devices Slurm could not name yet is asked about again after this
NVIDIA, AMD, ASCEND = "nvidia", "amd", "ascend"  # the profile's `accelerator` (accelspec.VENDORS)


def _backend(vendor: str):
    """hw/amd.py or hw/ascend.py, imported only on a node that has that vendor's devices."""
    try:
        return importlib.import_module(f"slurm_tune.hw.{vendor}")
    except ImportError as exc:
        raise StuneError(f"no {vendor} backend in this stune (slurm_tune.hw.{vendor}: {exc})") from None


class AscendSource:
    """The sampler's live Ascend source: one `npu-smi info` per tick (hw/ascend.py, behind its deadline): AICore
    %, HBM use, power and the process count per NPU chip, numbered by /dev/davinciN."""

    def __init__(self, timeout_s: float = 5.0, tools=None, environ=None, node: str | None = None):
        self.read = _backend(ASCEND).utilization
        self.timeout_s, self.tools, self.environ, self.node = timeout_s, tools, environ, node

    def utilization(self) -> list:
        return list(self.read(self.timeout_s, tools=self.tools, environ=self.environ, node=self.node))

    def close(self) -> None:
        pass


def _accel_readings(snapshot) -> list:
    return utilization_from_section(snapshot.get(ACCEL_SECTION) if isinstance(snapshot, dict) else None)


def _any_readings(snapshot) -> list:
    """No profile says the vendor: the `gpus` section where the snapshot has one, else its `accel` section."""
    if isinstance(snapshot, dict) and "gpus" not in snapshot and ACCEL_SECTION in snapshot:
        return _accel_readings(snapshot)
    return utilization_from_snapshot(snapshot)


def open_source(
    vendor: str | None,
    snapshot: str | None = None,
    *,
    timeout_s: float = 5.0,
    perf: bool = False,
    tools=None,
    environ=None,
    node: str | None = None,
):
    """The device source of a node whose profile says `accelerator: vendor` (None: no profile is known, which
    reads as nvidia live and as either section in a replay). A `snapshot` file is replayed whatever the vendor:
    its `gpus` section on NVIDIA, its `accel` section on AMD and Ascend. Raises StuneError when the live
    backend cannot be opened (NVML, amdsmi) or is not installed."""
    if snapshot:
        reader = {NVIDIA: utilization_from_snapshot, None: _any_readings}.get(vendor, _accel_readings)
        return SnapshotGpuSource(snapshot, reader=reader)
    if vendor == AMD:
        return _backend(AMD).AmdSource(timeout_s)
    if vendor == ASCEND:
        return AscendSource(timeout_s, tools=tools, environ=environ, node=node)
    return open_gpu_source(timeout_s=timeout_s, perf=perf)


def slurm_resolver(gres: str, node: str, slurm=None, timeout_s: float = 5.0):
    """resolve(job_id) -> the ids of GRES `gres` the job holds on `node` ([]: none), from one `scontrol show
    job -d` through the adapter; raises StuneError when Slurm cannot tell now (the sampler asks again later).
    A job Slurm no longer knows holds nothing: its epilog is removing the record."""

    def resolve(job_id: str) -> list[int]:
        nonlocal slurm
        if slurm is None:
            from ..slurm import Slurm

            slurm = Slurm.from_env(timeout=timeout_s)
        rc, out, err = slurm.run_full(["scontrol", "show", "job", "-d", job_id])
        if rc != 0:
            if "invalid job id" in err.lower():
                return []
            raise StuneError(f"scontrol show job -d {job_id}: {(err or out).strip()[:200] or f'exit {rc}'}")
        ids = spool.gres_ids_from_detail(out, node, gres)
        if ids is None:
            raise StuneError(f"scontrol show job -d {job_id} gives no allocation on {node} (yet)")
        return ids

    return resolve


class _Job:
    __slots__ = ("job_id", "acc")

    def __init__(self, job_id: str, acc: accum.JobAccumulator):
        self.job_id, self.acc = job_id, acc


def device_minor(pci_bus_id: str | None, proc_root: str = "/proc/driver/nvidia/gpus") -> int | None:
    """The /dev/nvidiaN minor number of a GPU from the driver's /proc entry, or None."""
    if not pci_bus_id:
        return None
    candidates = {pci_bus_id, pci_bus_id.lower()}
    bus = pci_bus_id.lower()
    if bus.count(":") == 2 and len(bus.split(":")[0]) == 8:  # NVML's 00000000:07:00.0 -> 0000:07:00.0
        candidates.add(bus[4:])
    for name in candidates:
        try:
            with open(os.path.join(proc_root, name, "information"), encoding="ascii", errors="replace") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key.strip() == "Device Minor" and value.strip().isdigit():
                        return int(value.strip())
        except OSError:
            continue
    return None


class Sampler:
    """`source` has .utilization() -> [GpuUtilization] (slurm_tune.hw.nvml.open_gpu_source)."""

    def __init__(
        self,
        source,
        local_dir: str,
        interval: float = 1.0,
        busy_util: float = 95.0,
        gpu_map: str = "auto",
        proc_root: str = "/proc/driver/nvidia/gpus",
        clock=time.time,
        perf=None,
        vendor: str | None = None,
        resolve=None,
    ):
        self.source = source
        self.jobs_dir = os.path.join(local_dir, pipeline.JOBS_DIR)
        self.acc_dir = os.path.join(local_dir, pipeline.ACC_DIR)
        for d in (self.jobs_dir, self.acc_dir):
            os.makedirs(d, exist_ok=True)
        self.interval = interval
        self.max_gap = MAX_GAP_INTERVALS * interval
        self.busy_util = busy_util
        self.gpu_map = gpu_map
        self.proc_root = proc_root
        self.clock = clock
        self.jobs: dict[str, _Job] = {}
        self._stamp: int | None = None
        self._retry = False
        self._slot_of: dict[int, int] | None = None  # Slurm GPU id -> position in the source's readings
        self._owner: dict[int, str] = {}
        self.samples = 0
        self.errors: list[str] = []
        self.perf = perf  # perfrec.NodePerf, or None: GPUs only
        self.vendor = vendor  # amd, ascend: readings are numbered by device minor already (no /proc map)
        # the node's devices are a GRES other than gpu: resolve(job_id) -> their ids (slurm_resolver)
        self.resolve = resolve
        self._passed: set[str] = set()  # records of jobs with none of this node's devices
        self._ask_at: dict[str, float] = {}  # job -> when to ask Slurm again (monotonic)

    # ---- jobs ---------------------------------------------------------------------------------------------
    def refresh_jobs(self) -> None:
        try:
            stamp = os.stat(self.jobs_dir).st_mtime_ns
        except FileNotFoundError:
            os.makedirs(self.jobs_dir, exist_ok=True)
            stamp = None
        if stamp == self._stamp and not self._retry:
            return
        self._stamp, self._retry = stamp, False
        try:
            names = {n for n in os.listdir(self.jobs_dir) if not n.startswith(".")}
        except FileNotFoundError:
            names = set()
        for gone in [j for j in self.jobs if j not in names]:
            self.jobs.pop(gone).acc.close()
            if self.perf is not None:  # the epilog has read the record (it reads before removing the job)
                self.perf.forget(gone)
        if self.perf is not None:
            self.perf.sweep(names)
        self._passed &= names
        self._ask_at = {j: t for j, t in self._ask_at.items() if j in names}
        for job_id in sorted(names - set(self.jobs) - self._passed):
            path = os.path.join(self.jobs_dir, job_id)
            try:
                with open(path, encoding="ascii", errors="replace") as fh:
                    text = fh.read()
                created = os.stat(path).st_mtime
            except OSError:
                continue
            if not text.strip():  # the prolog is writing it right now
                self._retry = True
                continue
            gpu_ids = self._device_ids(job_id, text)
            if gpu_ids is None:  # Slurm could not tell yet
                self._retry = True
            elif not gpu_ids:
                self._passed.add(job_id)
            else:
                try:
                    acc = accum.JobAccumulator(os.path.join(self.acc_dir, job_id), gpu_ids, created)
                except (OSError, ValueError) as exc:  # a full disk: try again next tick
                    self._retry = True
                    self.errors.append(f"job {job_id}: cannot open accumulators: {exc}")
                    continue
                self.jobs[job_id] = _Job(job_id, acc)
        # Slurm gives a GPU to one job at a time: the newest record owns it. A record whose epilog never ran
        # (the node crashed) so stops being sampled as soon as its GPUs go to a new job.
        owner: dict[int, str] = {}
        for job in sorted(self.jobs.values(), key=lambda j: (j.acc.created, j.job_id)):
            for gpu in job.acc.gpu_ids:
                owner[gpu] = job.job_id
        self._owner = owner

    def _device_ids(self, job_id: str, text: str) -> list[int] | None:
        """The ids of this node's devices a job's record gives ([]: none of them), or None: not known yet."""
        try:
            ids = spool.record_ids(text)
        except ValueError:
            return []
        if self.resolve is None:
            return ids or []  # `?` where the devices are gres/gpu: Slurm named no GPU, the job has none
        if ids is not None:
            return []  # $SLURM_JOB_GPUS: gres/gpu ids, not this node's GRES
        try:  # asked before this sampler (re)started: the accumulators hold the answer
            _, records = accum.read(os.path.join(self.acc_dir, job_id))
        except accum.AccumulatorError:
            records = []
        if records:
            return [int(r["gpu_id"]) for r in records]
        now = time.monotonic()
        if now < self._ask_at.get(job_id, 0.0):
            return None
        try:
            return self.resolve(job_id)
        except StuneError as exc:
            self._ask_at[job_id] = now + RESOLVE_RETRY_S
            self.errors.append(f"job {job_id}: its devices: {exc}; asking again in {RESOLVE_RETRY_S:g}s")
            return None

    # ---- sampling -----------------------------------------------------------------------------------------
    def _build_map(self, readings) -> dict[int, int]:
        by_minor = {}
        if self.gpu_map == "minor" or (self.gpu_map == "auto" and self.vendor in (None, NVIDIA)):
            for pos, r in enumerate(readings):
                minor = device_minor(r.pci_bus_id, self.proc_root)
                if minor is not None:
                    by_minor[minor] = pos
        if by_minor and len(by_minor) == len(readings):
            return by_minor
        return {r.index: pos for pos, r in enumerate(readings)}

    def sample_once(self, now: float | None = None) -> int:
        """Read the GPUs once and account the reading to the jobs holding them. Returns the number of GPU
        samples added (0 when no GPU job runs here: then no GPU is read)."""
        self.refresh_jobs()
        if not self.jobs:
            return 0
        readings = self.source.utilization()
        now = self.clock() if now is None else now
        if self._slot_of is None or len(self._slot_of) != len(readings):
            self._slot_of = self._build_map(readings)
        slot_of = self._slot_of
        added = 0
        busy, max_gap, interval, owner = self.busy_util, self.max_gap, self.interval, self._owner
        running: dict[str, tuple] = {}  # for perf: job -> (created, readings of the GPUs it holds)
        for job in self.jobs.values():
            acc = job.acc
            for slot, gpu in enumerate(acc.gpu_ids):
                if owner.get(gpu) != job.job_id:
                    continue
                mine = running.setdefault(job.job_id, (acc.created, []))[1]
                last = acc.records[slot][1]
                dt = now - last if last > 0 else min(interval, now - acc.created)
                if dt > max_gap or dt < 0:
                    dt = 0.0  # the sampler was away: that time was not observed
                pos = slot_of.get(gpu)
                if pos is None:
                    acc.add(slot, now, 0.0, None, None, None, None, busy, -1)
                    continue
                r = readings[pos]
                mine.append(r)
                mib = r.mem_used_bytes / 1048576.0 if r.mem_used_bytes is not None else None
                acc.add(slot, now, dt, r.sm_util, r.mem_util, mib, r.power_w, busy, r.index, r.procs)
                added += 1
        self.samples += added
        if self.perf is not None:
            try:
                self.perf.tick(now, running)
            except Exception as exc:  # the GPU sums above are kept whatever the node counters do
                self.errors.append(f"perf: {type(exc).__name__}: {exc}")
            self.errors.extend(self.perf.errors)
            self.perf.errors.clear()
        return added

    def run(self, iterations: int | None = None) -> None:
        """Sample every `interval` seconds on a fixed schedule (a slow tick does not shift later ones)."""
        next_at = time.monotonic()
        done = 0
        while iterations is None or done < iterations:
            try:
                self.sample_once()
            except Exception as exc:  # a daemon keeps going; the next tick tries again
                self.errors.append(f"{type(exc).__name__}: {exc}")
            for error in self.errors[:5]:
                print(f"stune-gpu-sampler: {error}", file=sys.stderr, flush=True)
            self.errors.clear()
            done += 1
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                continue
            time.sleep(delay)

    def close(self) -> None:
        for job in self.jobs.values():
            job.acc.close()
        self.jobs.clear()
        if self.perf is not None:
            self.perf.close()
        close = getattr(self.source, "close", None)
        if close:
            close()
