"""The accountant's process keeps the memory it frees for reuse.

Reading a month of sacct (a million rows) allocates and frees arrays of a few hundred kB to a few dozen MB
many times over. glibc's malloc by default hands freed memory at the top of the heap back to the kernel
(trim) and maps big blocks afresh each time, so every reuse costs page faults and zeroing: 0.3-0.5 s of
system time per million rows, a quarter of the parse (bench/bench_fairshare.py). With a fixed mmap threshold
and a high trim threshold the freed memory is reused instead; the process is short-lived (one accountant
run), so holding it until exit costs nothing. Where the C library is not glibc nothing changes.
"""
from __future__ import annotations

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # blocks this big or bigger are mapped (the dump's buffer); smaller come from the heap
TRIM_THRESHOLD = 1 << 30    # free memory at the heap's top is returned to the kernel past this


def keep_freed_memory() -> bool:
    """Set this process's malloc to reuse freed memory (see above); False where that is not possible."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):  # no ctypes, or a C library without mallopt (musl)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
