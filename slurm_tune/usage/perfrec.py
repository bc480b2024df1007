"""The per-job, per-node perf record on node-local disk: `<local_dir>/perf/<jobid>`, one small mmap'd file
beside the job's GPU accumulators (accum.py, unchanged), updated by the sampler every tick; the epilog reads
it (perf.node_perf) into the node summary's `perf` key.

Layout (little endian): HEADER (`STUNEPF1`, port slots, device slots, created, series bucket width, the CPUs
of the job's cpuset, reserved); one SLOT per port then per device (name, kind, role bits); then the values,
all doubles: SCALARS, PORT_FIELDS per port, DEV_FIELDS per device, SERIES_LEN buckets of SERIES_FIELDS;
then NOTES_BYTES of JSON (the selection rule, storage that is unmeasured and why, why CPU is unmeasured).
Values are sums over seconds, so a sampler restart continues them (the gap is not counted) and nodes add.

Bounded: SERIES_LEN buckets whatever the job's length (neighbours merge in pairs, the width doubles, as in
accum.py); at most MAX_PORTS ports and MAX_DEVICES devices. Memory per job and node (the file, mapped):
48 + 56 x (P + D) + 8 x (16 + 8 P + 6 D + 5 x 120) + 1024 bytes (`record_bytes`): 7,168 bytes for 8 HCA ports
and 2 devices (two 4 KiB pages), 17,008 at most (64 ports, 32 devices); plus the sampler's in-memory mirror
of the values, 692 floats for 8 ports and 2 devices (about 22 KiB as a Python list of floats). Per node: one
record per running GPU job (at most one per GPU).
"""

from __future__ import annotations

import json
import mmap
import os
import struct

from ..hw import counters
from .pipeline import PERF_DIR, PERF_MAGIC  # pipeline.py names the formats

HEADER = struct.Struct("<8sIIdddd")  # magic, ports, devices, created, series width, cpus, reserved
SLOT = struct.Struct("<40s8sI4x")  # name, kind, role bits
SCALARS = (
    "sampled_s",  # seconds the node counters were read for this job
    "idle_s",  # of which the job's GPUs were below IDLE_SM % SM (the GPU's idle phases)
    "shared_s",  # seconds another job ran on the node: ports and devices were shared, the numbers node-wide
    "cpu_s",  # CPU seconds of the job's cgroup
    "cpu_over_s",  # seconds over which cpu_s was measured
    "pcie_tx",  # bytes, summed over the job's GPUs
    "pcie_rx",
    "pcie_s",  # GPU-seconds PCIe was measured
    "nvl_tx",  # NVLink data bytes, all links, summed over the job's GPUs
    "nvl_rx",
    "nvl_s",
    "clk",  # SM clock MHz x GPU-seconds
    "clk_max",  # max SM clock MHz x GPU-seconds
    "clk_s",
    "gpu_s",  # GPU-seconds with an SM reading
    "reserved",
)
PORT_FIELDS = ("tx", "rx", "cap", "s", "idle_tx", "idle_rx", "idle_cap", "idle_s")  # bytes; cap: rate x s
DEV_FIELDS = ("read", "s", "idle_read", "idle_s", "busy", "busy_s")  # bytes, seconds; busy: io_ticks s
SERIES_FIELDS = ("net", "cap", "net_s", "sto", "sto_s")  # busier direction over rated ports, its capacity
SERIES_LEN = 120
SERIES_WIDTH_S = 10.0
NOTES_BYTES = 1024
MAX_PORTS, MAX_DEVICES = 64, 32
ROLES = ("cache", "source", "disk")  # role bits 1, 2, 4
IDLE_SM = 50.0


class PerfError(Exception):
    """A perf file that is not one (truncated, wrong magic)."""


def _layout(ports: int, devices: int) -> tuple[int, int, int]:
    """(offset of the values, number of values, offset of the notes)."""
    values_at = HEADER.size + SLOT.size * (ports + devices)
    count = len(SCALARS) + len(PORT_FIELDS) * ports + len(DEV_FIELDS) * devices
    count += len(SERIES_FIELDS) * SERIES_LEN
    return values_at, count, values_at + 8 * count


def record_bytes(ports: int, devices: int) -> int:
    """The file's size (and the mapping's) for a job with these ports and devices."""
    return _layout(ports, devices)[2] + NOTES_BYTES


def _ascii(text: str, size: int) -> bytes:
    return "".join(c if " " < c < "\x7f" else "_" for c in text).encode("ascii")[:size]


class PerfRecord:
    """One job's record on this node, mapped. `ports` / `devices`: [(name, kind, roles)] of the node's
    selection when the record is new; a record that exists keeps its own slots (`port_names`...)."""

    def __init__(self, path: str, ports: list[tuple], devices: list[tuple], created: float):
        ports, devices = ports[:MAX_PORTS], devices[:MAX_DEVICES]
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            fresh = size < HEADER.size
            if not fresh:
                magic, n_ports, n_devs = HEADER.unpack(os.pread(fd, HEADER.size, 0))[:3]
                fresh = (
                    magic != PERF_MAGIC
                    or n_ports > MAX_PORTS
                    or n_devs > MAX_DEVICES
                    or size < record_bytes(n_ports, n_devs)
                )
            if fresh:
                n_ports, n_devs = len(ports), len(devices)
                os.ftruncate(fd, 0)
                os.ftruncate(fd, record_bytes(n_ports, n_devs))
            self.map = mmap.mmap(fd, record_bytes(n_ports, n_devs))
        finally:
            os.close(fd)
        self.values_at, count, self.notes_at = _layout(n_ports, n_devs)
        self.values = struct.Struct(f"<{count}d")
        if fresh:
            HEADER.pack_into(self.map, 0, PERF_MAGIC, n_ports, n_devs, created, SERIES_WIDTH_S, 0.0, 0.0)
            for i, (name, kind, roles) in enumerate([*ports, *devices]):
                bits = sum(1 << ROLES.index(r) for r in roles if r in ROLES)
                SLOT.pack_into(self.map, HEADER.size + i * SLOT.size, _ascii(name, 40), _ascii(kind, 8), bits)
        self.created, self.width, self.cpus = HEADER.unpack_from(self.map, 0)[3:6]
        if not self.width > 0:
            self.width = SERIES_WIDTH_S
        names = [
            SLOT.unpack_from(self.map, HEADER.size + i * SLOT.size)[0]
            .rstrip(b"\0")
            .decode("ascii", "replace")
            for i in range(n_ports + n_devs)
        ]
        self.port_names, self.device_names = names[:n_ports], names[n_ports:]
        self.v = list(self.values.unpack_from(self.map, self.values_at))
        self.ports_at = len(SCALARS)
        self.devices_at = self.ports_at + len(PORT_FIELDS) * n_ports
        self.series_at = self.devices_at + len(DEV_FIELDS) * n_devs
        self.notes: dict = {}

    def slots(self, names: list[str], mine: list[str]) -> list[int | None]:
        """For each of the node's current `names`, its slot in this record (None: not in the record: it
        appeared after the job started, or the record was full)."""
        where = {name: i for i, name in enumerate(mine)}
        return [where.get(name) for name in names]

    def set_notes(self, notes: dict) -> None:
        """The notes JSON, cut to NOTES_BYTES by dropping list items from the end."""
        if notes == self.notes:
            return
        self.notes = notes
        trimmed = json.loads(json.dumps(notes))
        while True:
            data = json.dumps(trimmed, separators=(",", ":")).encode()
            lists = [k for k, v in trimmed.items() if isinstance(v, list) and v]
            if len(data) < NOTES_BYTES or not lists:
                break
            trimmed[lists[-1]].pop()
        self.map[self.notes_at : self.notes_at + NOTES_BYTES] = data[:NOTES_BYTES] + bytes(
            max(0, NOTES_BYTES - len(data))
        )

    def set_cpus(self, cpus: int | None) -> None:
        if cpus and cpus != self.cpus:
            self.cpus = float(cpus)
            struct.pack_into("<d", self.map, 32, self.cpus)

    def bucket(self, now: float) -> int:
        """The series bucket holding `now`, merging neighbours in pairs (doubling the width) past the end."""
        bucket = max(0, int((now - self.created) / self.width))
        if bucket < SERIES_LEN:
            return bucket
        k, at, v = len(SERIES_FIELDS), self.series_at, self.v
        while bucket >= SERIES_LEN:
            old = v[at : at + k * SERIES_LEN]
            merged = [
                old[2 * k * i + f] + old[2 * k * i + k + f] for i in range(SERIES_LEN // 2) for f in range(k)
            ]
            v[at : at + k * SERIES_LEN] = merged + [0.0] * (k * SERIES_LEN // 2)
            self.width *= 2
            bucket = int((now - self.created) / self.width)
        struct.pack_into("<d", self.map, 24, self.width)
        return bucket

    def flush(self) -> None:
        self.values.pack_into(self.map, self.values_at, *self.v)

    def close(self) -> None:
        try:
            self.map.close()
        except (ValueError, OSError):
            pass


def read(path: str) -> dict | None:
    """The record as plain data: {created, width, cpus, ports: [(name, kind, roles, {field: value})],
    devices: [...], scalars: {...}, series: {field: [values]}, notes: {...}}; None when there is no file.
    Read until two reads agree, so a tick being written is not half-read. PerfError for a foreign file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20)
            for _ in range(3):
                fh.seek(0)
                again = fh.read(1 << 20)
                if again == data:
                    break
                data = again
    except FileNotFoundError:
        return None
    if len(data) < HEADER.size:
        raise PerfError(f"{path}: truncated perf file")
    magic, n_ports, n_devs, created, width, cpus, _ = HEADER.unpack_from(data, 0)
    if magic != PERF_MAGIC or n_ports > MAX_PORTS or n_devs > MAX_DEVICES:
        raise PerfError(f"{path}: not a stune perf file")
    values_at, count, notes_at = _layout(n_ports, n_devs)
    if len(data) < notes_at + NOTES_BYTES:
        raise PerfError(f"{path}: truncated perf file")
    v = struct.unpack_from(f"<{count}d", data, values_at)
    slots = []
    for i in range(n_ports + n_devs):
        name, kind, bits = SLOT.unpack_from(data, HEADER.size + i * SLOT.size)
        roles = [r for b, r in enumerate(ROLES) if bits & 1 << b]
        slots.append((name.rstrip(b"\0").decode("ascii", "replace"), kind.rstrip(b"\0").decode(), roles))
    p0, d0 = len(SCALARS), len(SCALARS) + len(PORT_FIELDS) * n_ports
    s0, k = d0 + len(DEV_FIELDS) * n_devs, len(SERIES_FIELDS)
    try:
        notes = json.loads(data[notes_at : notes_at + NOTES_BYTES].rstrip(b"\0") or b"{}")
    except (ValueError, UnicodeDecodeError):
        notes = {}
    return {
        "created": created,
        "width": width,
        "cpus": int(cpus) or None,
        "scalars": dict(zip(SCALARS, v)),
        "ports": [
            (*slots[i], dict(zip(PORT_FIELDS, v[p0 + 8 * i : p0 + 8 * i + 8]))) for i in range(n_ports)
        ],
        "devices": [
            (*slots[n_ports + i], dict(zip(DEV_FIELDS, v[d0 + 6 * i : d0 + 6 * i + 6])))
            for i in range(n_devs)
        ],
        "series": {f: list(v[s0 + j : s0 + k * SERIES_LEN : k]) for j, f in enumerate(SERIES_FIELDS)},
        "notes": notes if isinstance(notes, dict) else {},
    }


# ---- the sampler's side: node counters once per tick, added to every running job's record -------------------------
class _Job:
    __slots__ = ("cg", "cg_next", "cpu_prev", "cpus_next", "dev_slot", "port_slot", "ready", "rec")

    def __init__(self, rec: PerfRecord):
        self.rec, self.ready = rec, False
        self.cpu_prev: int | None = None
        self.cg: counters.JobCgroup | str = "no-cgroup"
        self.cg_next = self.cpus_next = 0.0
        self.port_slot: list[int | None] = []
        self.dev_slot: list[int | None] = []


class NodePerf:
    """Reads the node's counters (counters.select: ports, storage) once per tick, whatever the number of jobs,
    and adds each interval to the record of every job that was running at both ends of it: the node-wide
    numbers, with the seconds another job ran beside it (`shared_s`). Per job: its cgroup's CPU time, its
    GPUs' PCIe / NVLink / SM clock readings. An interval longer than `max_gap` (the sampler was away) or
    after a restart is not counted."""

    def __init__(self, local_dir: str, root: str = "/", fabric=None, paths=(), max_gap=2.5, rescan_s=300.0):
        self.dir = os.path.join(local_dir, PERF_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.sysfs = counters.Sysfs(root)
        self.live = os.path.realpath(root) == "/"
        self.fabric, self.paths, self.max_gap, self.rescan_s = fabric, list(paths), max_gap, rescan_s
        self.jobs: dict[str, _Job] = {}
        self.sel: counters.Selection | None = None
        self.selected_at = float("-inf")
        self.channels: list[counters.Channel] = []
        self.keys: list[str] = []
        self.prev: dict[str, int | None] = {}
        self.prev_t: float | None = None
        self.nvl_prev: dict[int, tuple] = {}  # GPU index -> NVLink (tx, rx) KiB at the last tick
        self.notes: dict = {}
        self.errors: list[str] = []

    def select(self, now: float) -> counters.Selection:
        sel = self.sel = counters.select(self.sysfs, self.fabric, self.paths, self.live)
        self.channels = sel.channels()
        self.keys = [f"{c.path}#{c.field}" for c in self.channels]
        self.notes = {"rule": sel.rule, "unmeasured": [list(u) for u in sel.unmeasured], "notes": sel.notes}
        for job in self.jobs.values():
            self._map(job)
        self.selected_at = now
        return sel

    def _map(self, job: _Job) -> None:
        sel = self.sel or counters.Selection()
        job.port_slot = job.rec.slots([p.name for p in sel.ports], job.rec.port_names)
        job.dev_slot = job.rec.slots([d.name for d in sel.devices], job.rec.device_names)

    def _open(self, job_id: str, created: float) -> None:
        sel = self.sel or counters.Selection()
        rec = PerfRecord(
            os.path.join(self.dir, job_id),
            [(p.name, p.kind, []) for p in sel.ports],
            [(d.name, d.kind, d.roles) for d in sel.devices],
            created,
        )
        self.jobs[job_id] = job = _Job(rec)
        self._map(job)

    def forget(self, job_id: str) -> None:
        """The job ended (its epilog read the record): close it and remove the file."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            job.rec.close()
        try:
            os.unlink(os.path.join(self.dir, job_id))
        except OSError:
            pass

    def close(self) -> None:
        for job in self.jobs.values():
            job.rec.close()
        self.jobs.clear()

    def sweep(self, known) -> None:
        """Remove records of jobs the sampler no longer knows (left by a sampler that was down at their end)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            if name not in known and not name.startswith("."):
                self.forget(name)

    def tick(self, now: float, jobs: dict) -> None:
        """`jobs`: {job id: (created, [GpuUtilization of the GPUs it holds here])}."""
        if self.sel is None or now - self.selected_at >= self.rescan_s:
            self.select(now)
        for job_id, (created, _) in jobs.items():
            if job_id not in self.jobs:
                try:
                    self._open(job_id, created)
                except (OSError, ValueError) as exc:
                    self.errors.append(f"job {job_id}: cannot open its perf record: {exc}")
        dt = now - self.prev_t if self.prev_t is not None else -1.0
        valid = 0 < dt <= self.max_gap
        values = counters.read(self.sysfs, self.channels)
        deltas: list[float | None] = []
        for ch, key, value in zip(self.channels, self.keys, values):
            inc = counters.delta(self.prev.get(key), value, ch)
            deltas.append(None if inc is None else inc * ch.scale)
        self.prev, self.prev_t = dict(zip(self.keys, values)), now
        cgroups = counters.cgroup_jobs(self.sysfs)
        running = set(jobs) | set(cgroups)
        sel = self.sel or counters.Selection()
        ports = [(p, deltas[2 * i], deltas[2 * i + 1]) for i, p in enumerate(sel.ports)]
        devs: list[tuple] = []
        at = 2 * len(sel.ports)
        for d in sel.devices:
            devs.append((deltas[at], deltas[at + 1] if d.busy is not None else None))
            at += 2 if d.busy is not None else 1
        for job_id, (_, readings) in jobs.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            add = valid and job.ready
            job.ready = True
            self._cpu(job, job_id, cgroups, now, dt if add else 0.0)
            self._gpus(job, readings, dt if add else 0.0)
            if add:
                self._add(job, now, dt, _idle(readings), len(running - {job_id}) > 0, ports, devs)
            job.rec.set_notes({**self.notes, "cpu": job.cg if isinstance(job.cg, str) else None})
            job.rec.flush()

    def _cpu(self, job: _Job, job_id: str, cgroups: dict, now: float, dt: float) -> None:
        if isinstance(job.cg, str) and now >= job.cg_next:
            job.cg, job.cg_next = counters.job_cgroup(self.sysfs, job_id, cgroups), now + 10.0
        if isinstance(job.cg, str):
            return
        if now >= job.cpus_next:
            job.rec.set_cpus(job.cg.cpus(self.sysfs))
            job.cpus_next = now + 60.0
        cur = job.cg.cpu_value(self.sysfs)
        d = counters.delta(job.cpu_prev, cur, job.cg.cpu)
        job.cpu_prev = cur
        if dt > 0 and d is not None:
            v = job.rec.v
            v[3] += d * job.cg.cpu.scale
            v[4] += dt

    def _gpus(self, job: _Job, readings: list, dt: float) -> None:
        v = job.rec.v
        for r in readings:
            links = (r.nvlink_tx_kib, r.nvlink_rx_kib)
            prev = self.nvl_prev.get(r.index)
            self.nvl_prev[r.index] = links
            if dt <= 0:
                continue
            if r.pcie_tx_kbs is not None and r.pcie_rx_kbs is not None:  # KB/s over NVML's 20 ms window
                v[5] += r.pcie_tx_kbs * 1024.0 * dt
                v[6] += r.pcie_rx_kbs * 1024.0 * dt
                v[7] += dt
            if prev is not None and None not in prev and None not in links:
                tx, rx = links[0] - prev[0], links[1] - prev[1]
                if tx >= 0 and rx >= 0:  # a counter that went back was reset: unmeasured
                    v[8] += tx * 1024.0
                    v[9] += rx * 1024.0
                    v[10] += dt
            if r.sm_mhz is not None and r.sm_max_mhz:
                v[11] += r.sm_mhz * dt
                v[12] += r.sm_max_mhz * dt
                v[13] += dt
            if r.sm_util is not None or r.procs == 0:
                v[14] += dt

    def _add(self, job: _Job, now: float, dt: float, idle, shared: bool, ports: list, devs: list) -> None:
        rec, v = job.rec, job.rec.v
        v[0] += dt
        v[1] += dt if idle else 0.0
        v[2] += dt if shared else 0.0
        busy_tx = busy_rx = cap_sum = 0.0
        rated = False
        for slot, (port, tx, rx) in zip(job.port_slot, ports):
            if slot is None or tx is None or rx is None:
                continue
            cap = port.rate * dt if port.rate else 0.0
            base = rec.ports_at + len(PORT_FIELDS) * slot
            for k, value in enumerate((tx, rx, cap, dt)):
                v[base + k] += value
                if idle:
                    v[base + 4 + k] += value
            if cap:
                busy_tx, busy_rx, cap_sum, rated = busy_tx + tx, busy_rx + rx, cap_sum + cap, True
        sto, measured = 0.0, False
        for slot, (read, busy) in zip(job.dev_slot, devs):
            if slot is None or read is None:
                continue
            base = rec.devices_at + len(DEV_FIELDS) * slot
            v[base] += read
            v[base + 1] += dt
            if idle:
                v[base + 2] += read
                v[base + 3] += dt
            if busy is not None:
                v[base + 4] += min(busy, dt)
                v[base + 5] += dt
            sto, measured = sto + read, True
        at = rec.series_at + len(SERIES_FIELDS) * rec.bucket(now)
        for k, value in enumerate(
            (max(busy_tx, busy_rx), cap_sum, dt if rated else 0.0, sto, dt if measured else 0.0)
        ):
            v[at + k] += value


def _idle(readings: list) -> bool | None:
    """The job's GPUs below IDLE_SM % SM on average in this sample (a GPU with no process is at 0 %); None
    when no GPU of the job gave a reading."""
    sms = [0.0 if r.procs == 0 else r.sm_util for r in readings if r.procs == 0 or r.sm_util is not None]
    return None if not sms else sum(sms) / len(sms) < IDLE_SM
