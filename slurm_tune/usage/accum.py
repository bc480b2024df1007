"""Per-job GPU accumulators on node-local disk: one small mmap'd file per job, `<local_dir>/acc/<jobid>`.

The sampler adds each sample into the mapped file directly (one struct.pack_into per GPU, no syscall), so a
sampler restart loses nothing, and the epilog reads the latest sample without asking the sampler anything.

Layout (little endian): a 32-byte header `STUNEAC1`, GPU count (u32), reserved, created (f64), then one
record of 16 doubles per GPU, fields as in summary.ACC_FIELDS. Values are sums over sampled seconds, so
records add up across restarts and across nodes.
"""
from __future__ import annotations

import mmap
import os
import struct

from .summary import ACC_FIELDS

MAGIC = b"STUNEAC1"
HEADER = struct.Struct("<8sIId8x")      # magic, gpu count, reserved, created
RECORD = struct.Struct("<16d")
assert RECORD.size == 8 * len(ACC_FIELDS)
F = {name: i for i, name in enumerate(ACC_FIELDS)}


class AccumulatorError(Exception):
    """An accumulator file that is not one (truncated, wrong magic)."""


def _record_offset(slot: int) -> int:
    return HEADER.size + slot * RECORD.size


class JobAccumulator:
    """A job's accumulators on this node, mapped. `gpu_ids` are Slurm's GPU ids (SLURM_JOB_GPUS)."""

    def __init__(self, path: str, gpu_ids: list[int], created: float):
        self.path = path
        size = _record_offset(len(gpu_ids))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            existing = os.fstat(fd).st_size
            fresh = existing < HEADER.size
            if not fresh:
                head = os.pread(fd, HEADER.size, 0)
                magic, count, _, stamp = HEADER.unpack(head)
                if magic != MAGIC or count != len(gpu_ids) or existing < size:
                    fresh = True  # not ours, or a different allocation under a reused job id
            if fresh:
                os.ftruncate(fd, 0)
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if fresh:
            HEADER.pack_into(self.map, 0, MAGIC, len(gpu_ids), 0, created)
            for slot, gpu in enumerate(gpu_ids):
                values = [0.0] * len(ACC_FIELDS)
                values[F["gpu_id"]] = float(gpu)
                values[F["nvml_index"]] = -1.0
                RECORD.pack_into(self.map, _record_offset(slot), *values)
        # an in-memory mirror: the sampler updates it and writes each record back with one pack_into
        self.records = [list(RECORD.unpack_from(self.map, _record_offset(slot))) for slot in range(len(gpu_ids))]
        self.gpu_ids = [int(r[F["gpu_id"]]) for r in self.records]
        self.created = HEADER.unpack_from(self.map, 0)[3]

    def add(self, slot: int, now: float, dt: float, sm, mem, mib, watts, busy_util: float, nvml_index: int) -> None:
        """Add one sample of the GPU in `slot`, standing for `dt` seconds. None readings add nothing."""
        r = self.records[slot]
        r[1] = now
        r[2] += 1.0
        r[15] = float(nvml_index)
        if dt > 0:
            if sm is not None:
                r[3] += dt
                r[4] += sm * 0.01 * dt
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

    def last_ts(self, slot: int) -> float:
        return self.records[slot][1]

    def close(self) -> None:
        try:
            self.map.close()
        except (ValueError, OSError):
            pass


def read(path: str) -> tuple[float, list[dict]]:
    """(created, [per-GPU field dict]) from an accumulator file, read twice until two reads agree, so a
    record being written by the sampler at that moment is not half-read."""
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
        return 0.0, []
    if len(data) < HEADER.size:
        raise AccumulatorError(f"{path}: truncated accumulator file")
    magic, count, _, created = HEADER.unpack_from(data, 0)
    if magic != MAGIC or len(data) < _record_offset(count):
        raise AccumulatorError(f"{path}: not a stune accumulator file")
    gpus = []
    for slot in range(count):
        values = RECORD.unpack_from(data, _record_offset(slot))
        gpus.append(dict(zip(ACC_FIELDS, values)))
    return created, gpus
