"""Per-job GPU accumulators on node-local disk: one small mmap'd file per job, `<local_dir>/acc/<jobid>`.

The sampler adds each sample into the mapped file directly (one struct.pack_into per GPU, no syscall), so a
sampler restart loses nothing, and the epilog reads the latest sample without asking the sampler anything.

Layout (little endian): a 32-byte header `STUNEAC2`, GPU count (u32), reserved, created (f64), series bucket
width (f64); one record of 19 doubles per GPU, fields as in summary.ACC_FIELDS; then the job's utilization
series on this node: SERIES_LEN buckets of (SM-utilization x seconds summed over the GPUs, seconds). Values
are sums over sampled seconds, so records add up across restarts and across nodes. (`STUNEAC1` files, 16
fields and no series, are still read.)

The series is bounded: when a job outlives SERIES_LEN buckets, neighbouring buckets are merged in pairs and
the width doubles, so a job of any length keeps SERIES_LEN buckets. Memory per job and node: 32 + 152 x GPUs
+ 16 x SERIES_LEN bytes (3,168 bytes for 8 GPUs, one 4 KiB page mapped); per node, one such file per running
GPU job (at most one per GPU: 32 KiB for 8 GPUs), plus an in-memory mirror of the same size.
"""

from __future__ import annotations

import mmap
import os
import struct

from .pipeline import ACCUMULATOR_MAGIC, ACCUMULATOR_MAGIC_V1
from .summary import ACC_FIELDS

MAGIC, MAGIC_V1 = ACCUMULATOR_MAGIC, ACCUMULATOR_MAGIC_V1  # pipeline.py names the formats
HEADER = struct.Struct("<8sIIdd")  # magic, gpu count, reserved, created, series bucket width
RECORD = struct.Struct("<19d")
RECORD_V1 = struct.Struct("<16d")
assert RECORD.size == 8 * len(ACC_FIELDS)
F = {name: i for i, name in enumerate(ACC_FIELDS)}
SERIES_LEN = 120
SERIES_WIDTH_S = 10.0  # the first bucket width; doubles as the job outlives the series
BUCKET = struct.Struct("<2d")
SERIES = struct.Struct(f"<{2 * SERIES_LEN}d")
DROP_HIGH, DROP_LOW = 60.0, 20.0  # a "drop": utilization falls from >= 60 % to <= 20 %


class AccumulatorError(Exception):
    """An accumulator file that is not one (truncated, wrong magic)."""


def _record_offset(slot: int, record=RECORD) -> int:
    return HEADER.size + slot * record.size


def _series_offset(count: int) -> int:
    return _record_offset(count)


class JobAccumulator:
    """A job's accumulators on this node, mapped. `gpu_ids` are Slurm's GPU ids (SLURM_JOB_GPUS)."""

    def __init__(self, path: str, gpu_ids: list[int], created: float):
        self.path = path
        size = _series_offset(len(gpu_ids)) + SERIES.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            existing = os.fstat(fd).st_size
            fresh = existing < HEADER.size
            if not fresh:
                head = os.pread(fd, HEADER.size, 0)
                magic, count, _, _stamp, _ = HEADER.unpack(head)
                if magic != MAGIC or count != len(gpu_ids) or existing < size:
                    fresh = True  # not ours, or a different allocation under a reused job id
            if fresh:
                os.ftruncate(fd, 0)
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if fresh:
            HEADER.pack_into(self.map, 0, MAGIC, len(gpu_ids), 0, created, SERIES_WIDTH_S)
            for slot, gpu in enumerate(gpu_ids):
                values = [0.0] * len(ACC_FIELDS)
                values[F["gpu_id"]] = float(gpu)
                values[F["nvml_index"]] = -1.0
                RECORD.pack_into(self.map, _record_offset(slot), *values)
        # an in-memory mirror: the sampler updates it and writes each record back with one pack_into
        self.records = [
            list(RECORD.unpack_from(self.map, _record_offset(slot))) for slot in range(len(gpu_ids))
        ]
        self.gpu_ids = [int(r[F["gpu_id"]]) for r in self.records]
        self.created, self.width = HEADER.unpack_from(self.map, 0)[3:5]
        if not self.width > 0:
            self.width = SERIES_WIDTH_S
        self._series_at = _series_offset(len(gpu_ids))
        self.series = list(SERIES.unpack_from(self.map, self._series_at))

    def _add_series(self, now: float, sm_dt: float, dt: float) -> None:
        """Add to the bucket holding `now`; past the end, merge neighbours in pairs and double the width."""
        bucket = int((now - self.created) / self.width)
        if bucket < 0:
            bucket = 0
        if bucket >= SERIES_LEN:
            series = self.series
            while bucket >= SERIES_LEN:
                series = [
                    series[4 * i + k] + series[4 * i + 2 + k] for i in range(SERIES_LEN // 2) for k in (0, 1)
                ]
                series += [0.0] * SERIES_LEN
                self.width *= 2
                bucket = int((now - self.created) / self.width)
            self.series = series
            SERIES.pack_into(self.map, self._series_at, *series)
            struct.pack_into("<d", self.map, 24, self.width)
        at = 2 * bucket
        self.series[at] += sm_dt
        self.series[at + 1] += dt
        BUCKET.pack_into(self.map, self._series_at + 16 * bucket, self.series[at], self.series[at + 1])

    def add(
        self,
        slot: int,
        now: float,
        dt: float,
        sm,
        mem,
        mib,
        watts,
        busy_util: float,
        nvml_index: int,
        procs=None,
    ) -> None:
        """Add one sample of the GPU in `slot`, standing for `dt` seconds. None readings add nothing. `procs`
        is the number of compute processes on the GPU (None: unknown); with none the GPU is idle, whatever a
        stale utilization reading says."""
        r = self.records[slot]
        r[1] = now
        r[2] += 1.0
        r[15] = float(nvml_index)
        if procs == 0:
            sm = 0.0
        if sm is not None:  # the sawtooth counter: falls from high to low, with hysteresis
            if sm >= DROP_HIGH:
                r[18] = 1.0
            elif sm <= DROP_LOW and r[18]:
                r[18] = 0.0
                r[17] += 1.0
        if dt > 0:
            if procs == 0:
                r[16] += dt
            if sm is not None:
                r[3] += dt
                r[4] += sm * 0.01 * dt
                self._add_series(now, sm * 0.01 * dt, dt)
                if sm >= busy_util:
                    r[12] += dt
                    if watts is not None:
                        r[13] += dt
                        r[14] += watts * dt
            if mem is not None:
                r[5] += dt
                r[6] += mem * 0.01 * dt
            if mib is not None:
                r[7] += dt
                r[8] += mib * dt
                if mib > r[9]:
                    r[9] = mib
            if watts is not None:
                r[10] += dt
                r[11] += watts * dt
        RECORD.pack_into(self.map, _record_offset(slot), *r)

    def close(self) -> None:
        try:
            self.map.close()
        except (ValueError, OSError):
            pass


def read(path: str) -> tuple[float, list[dict]]:
    """(created, [per-GPU field dict]) from an accumulator file, read twice until two reads agree, so a
    record being written by the sampler at that moment is not half-read."""
    created, gpus, _ = read_with_series(path, _read_stable(path))
    return created, gpus


def read_with_series(path: str, data: bytes | None = None) -> tuple[float, list[dict], dict | None]:
    """(created, per-GPU field dicts, series {t0, width, sm, dt} or None for a v1 file)."""
    if data is None:
        return read_with_series(path, _read_stable(path))
    if not data:
        return 0.0, [], None
    if len(data) < HEADER.size:
        raise AccumulatorError(f"{path}: truncated accumulator file")
    magic, count, _, created, width = HEADER.unpack_from(data, 0)
    record = RECORD if magic == MAGIC else RECORD_V1
    if magic not in (MAGIC, MAGIC_V1) or len(data) < _record_offset(count, record):
        raise AccumulatorError(f"{path}: not a stune accumulator file")
    gpus = []
    for slot in range(count):
        values = record.unpack_from(data, _record_offset(slot, record))
        gpu = dict.fromkeys(ACC_FIELDS, 0.0)
        gpu.update(zip(ACC_FIELDS, values))
        gpus.append(gpu)
    series = None
    if magic == MAGIC and len(data) >= _series_offset(count) + SERIES.size and width > 0:
        flat = SERIES.unpack_from(data, _series_offset(count))
        series = {"t0": created, "width": width, "sm": list(flat[0::2]), "dt": list(flat[1::2])}
    return created, gpus, series


def _read_stable(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
            for _ in range(3):
                fh.seek(0)
                again = fh.read()
                if again == data:
                    break
                data = again
    except FileNotFoundError:
        return b""
    return data
