"""Parsers for the host settings the drift checks read (health/drift.py), over the raw text the capture kept
(hw/drift.py): /proc/modules, /proc/<pid>/limits, transparent_hugepage/enabled, scaling_governor,
kernel.numa_balancing, any sysctl, the kernel command line. Each returns None (or says so) for anything it
does not recognise, so garbage is never a setting; none raises (fuzzed: tests/test_drift_fuzz.py).
"""

from __future__ import annotations

from ..text import is_digits

GDR_MODULES = ("nvidia_peermem", "nv_peer_mem")  # NVIDIA's (R470+) and Mellanox's older GPUDirect RDMA module
MODULE_STATES = ("Live", "Loading", "Unloading")
THP_MODES = ("always", "madvise", "never")
GOVERNOR_MAX = 32
UNLIMITED = "unlimited"
MEMLOCK_LINE = "Max locked memory"
NUMBER_MAX = 20  # digits of a 64-bit value


def _name_ok(name: str, extra: str = "") -> bool:
    return 0 < len(name) <= 64 and name.isascii() and all(c.isalnum() or c in "_" + extra for c in name)


def parse_modules(text) -> tuple[dict[str, str], int] | None:
    """/proc/modules (`nvidia_peermem 16384 0 - Live 0xffffffffc0a3d000 (OE)`) -> ({name: state}, lines
    that are not a module line). None when there is no text at all."""
    if not isinstance(text, str):
        return None
    modules: dict[str, str] = {}
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        if (
            len(fields) < 5
            or not _name_ok(fields[0])
            or not is_digits(fields[1])
            or fields[4] not in MODULE_STATES
        ):
            bad += 1
            continue
        modules[fields[0]] = fields[4]
    return modules, bad


def loaded_gdr_module(text) -> tuple[str | None, str | None]:
    """(the GPUDirect RDMA module loaded, None), (None, None) when /proc/modules says neither is, or (None,
    why it cannot be told): an unreadable file, or unparseable lines one of which might be it."""
    parsed = parse_modules(text)
    if parsed is None:
        return None, "/proc/modules unreadable"
    modules, bad = parsed
    for name in GDR_MODULES:
        if modules.get(name) in ("Live", "Loading"):
            return name, None
    if bad or not modules:
        return None, f"/proc/modules has {bad} unreadable line(s)" if bad else "/proc/modules lists nothing"
    return None, None


def parse_memlock(text) -> tuple[str | int, str | int] | None:
    """/proc/<pid>/limits -> the locked-memory limit (soft, hard): `unlimited` or bytes. None unless exactly
    one well-formed `Max locked memory  <soft>  <hard>  bytes` line is there."""
    if not isinstance(text, str):
        return None
    found = None
    for line in text.splitlines():
        if not line.startswith(MEMLOCK_LINE):
            continue
        if found is not None:
            return None
        fields = line[len(MEMLOCK_LINE) :].split()
        if len(fields) != 3 or fields[2] != "bytes":
            return None
        values: list[str | int] = []
        for f in fields[:2]:
            if f == UNLIMITED:
                values.append(f)
            elif is_digits(f) and len(f) <= NUMBER_MAX:
                values.append(int(f))
            else:
                return None
        found = (values[0], values[1])
    return found


def parse_thp(text) -> str | None:
    """`always [madvise] never` -> 'madvise': exactly one bracketed mode, every word a known mode."""
    if not isinstance(text, str):
        return None
    current = None
    words = text.split()
    if len(words) != len(THP_MODES):
        return None
    for word in words:
        if word.startswith("[") and word.endswith("]") and len(word) > 2:
            if current is not None:
                return None
            word = current = word[1:-1]
        if word not in THP_MODES:
            return None
    return current


def parse_governor(text) -> str | None:
    """A cpufreq governor name (`performance`, `powersave`, `schedutil`, ...)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    return text if len(text) <= GOVERNOR_MAX and _name_ok(text) and text.islower() else None


def parse_small_int(text, most: int) -> int | None:
    """A sysctl that is one decimal 0..most (kernel.numa_balancing: 0 off, 1 on, 2/3 memory tiering)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    return int(text) if 0 < len(text) <= 3 and is_digits(text) and int(text) <= most else None


def sysctl_matches(text, expected: str) -> bool | None:
    """Whether a sysctl's value (as /proc/sys shows it) is what the profile expects: the same words
    (`4096 87380 6291456` and `4096\\t87380\\t6291456` match), or for `>=N` one number at least N. None
    when the value cannot be read as the expectation needs."""
    if not isinstance(text, str) or len(text) > 4096 or not text.isascii():
        return None
    words = text.split()
    if expected.startswith(">="):
        if len(words) != 1 or not is_digits(words[0]) or len(words[0]) > NUMBER_MAX:
            return None
        return int(words[0]) >= int(expected[2:].strip())
    if any(not w.isprintable() for w in words):
        return None
    return words == expected.split()


def cmdline_passthrough(text) -> bool | None:
    """Whether the kernel command line asks for IOMMU passthrough (`iommu=pt`, `iommu.passthrough=1`,
    `amd_iommu=pt`); None when it cannot be read."""
    if not isinstance(text, str) or len(text) > 65536 or not text.isascii():
        return None
    words = text.split()
    return any(w in ("iommu=pt", "iommu.passthrough=1", "iommu.passthrough=y", "amd_iommu=pt") for w in words)


def size_text(n: int) -> str:
    """64 KiB, 8 MiB, 512 bytes: a limit as an admin reads it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
