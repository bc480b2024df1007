"""NVML through pynvml, one session per process, behind a deadline.

`read_gpus()` reads everything the health checks judge, for a snapshot. `open_gpu_source()` gives the GPU
sampler a cheap, repeatable utilization read, live (NVML) or from a snapshot file (tests, replays).

pynvml (the nvml extra) is imported only when NVML is really used; the prolog path never touches this
module. Values are NVML's own (mW become W, bytes stay bytes); a field the device does not
support is None; a field whose read failed is None and named in the device's `errors`.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple

from ..errors import StuneError
from .deadline import OK, run_probe

MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS is 18 on Hopper-era drivers; absent links answer NotSupported


class GpuUtilization(
    namedtuple(
        "GpuUtilization",
        "index uuid pci_bus_id sm_util mem_util mem_used_bytes mem_total_bytes power_w procs "
        "pcie_tx_kbs pcie_rx_kbs nvlink_tx_kib nvlink_rx_kib sm_mhz sm_max_mhz",
        defaults=(None, None, None, None, None, None, None),
    )
):
    """One sample of one GPU for the sampler. Percentages are 0-100; None where the GPU did not answer or
    does not support the reading (never 0). procs: compute processes running on the GPU (None: not known).
    pcie_*_kbs: NVML's PCIe throughput (KB/s, a byte counter over 20 ms); nvlink_*_kib: NVLink data bytes
    over all links (KiB, a cumulative counter); sm_mhz / sm_max_mhz: the SM clock now and its maximum."""

    __slots__ = ()


PERF_FIELDS = ("pcie_tx_kbs", "pcie_rx_kbs", "nvlink_tx_kib", "nvlink_rx_kib", "sm_mhz", "sm_max_mhz")
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB, cumulative), scopeId UINT_MAX: summed over the links (nvml.h)
NVLINK_DATA_FIELDS = [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)]
_FIELD_VALUE = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}  # integer types


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _field_value(v) -> int | None:
    """An nvmlFieldValue_t's integer value, None unless it was read."""
    value = getattr(getattr(v, "value", None), _FIELD_VALUE.get(getattr(v, "valueType", 3), ""), None)
    return _count(value) if getattr(v, "nvmlReturn", 1) == 0 else None


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def cuda_version_text(value) -> str | None:
    """NVML's CUDA driver version 12020 -> '12.2'."""
    if isinstance(value, int) and value > 0:
        return f"{value // 1000}.{value % 1000 // 10}"
    return None


class NvmlSession:
    """One NVML session. `nvml` is the pynvml module (tests pass a stand-in with the same API)."""

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml  # optional: the nvml extra (nvidia-ml-py)

            nvml = pynvml
        self.nvml = nvml
        self._handles: dict[int, object] = {}
        self._identity: dict[int, tuple] = {}  # index -> (uuid, pci bus id): fixed for a session
        self._max_sm: dict[int, int | None] = {}  # index -> max SM clock (MHz): fixed too
        self._unsupported: set[tuple[int, str]] = set()  # (index, reading) the GPU answered NotSupported to
        nvml.nvmlInit()

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down a lost NVML is not worth reporting
            pass

    def handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def count(self) -> int:
        return self.nvml.nvmlDeviceGetCount()

    def _field(self, errors: dict, name: str, fn, *args):
        """Read one field. NotSupported is None (the device has no such thing), other errors are recorded."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if isinstance(exc, getattr(self.nvml, "NVMLError_NotSupported", ())):
                return None
            errors[name] = str(exc)
            return None

    def _once(self, index: int, name: str, fn, *args):
        """A reading a GPU either supports or not: after NotSupported it is not asked again (None)."""
        if (index, name) in self._unsupported or fn is None:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if isinstance(exc, getattr(self.nvml, "NVMLError_NotSupported", ())):
                self._unsupported.add((index, name))
            return None

    def perf(self, index: int, with_max: bool = True) -> dict:
        """PCIe throughput (KB/s), NVLink data (KiB counters, all links) and the SM clock (MHz) of one GPU:
        None where not supported, never 0. 4 NVML calls (a max-clock call too with `with_max`)."""
        n, h, once = self.nvml, self.handle(index), self._once
        pcie, sm = getattr(n, "nvmlDeviceGetPcieThroughput", None), getattr(n, "NVML_CLOCK_SM", 1)
        top = once(
            index, "max_clock", getattr(n, "nvmlDeviceGetMaxClockInfo", None) if with_max else None, h, sm
        )
        values = once(index, "nvlink", getattr(n, "nvmlDeviceGetFieldValues", None), h, NVLINK_DATA_FIELDS)
        try:
            links = [_field_value(v) for v in values][:2] if values is not None else []
        except TypeError:
            links = []
        if links and all(getattr(v, "nvmlReturn", 0) == 3 for v in values):  # NVML_ERROR_NOT_SUPPORTED
            self._unsupported.add((index, "nvlink"))
        links = links if len(links) == 2 and None not in links else [None, None]
        return {
            "pcie_tx_kbs": _count(once(index, "pcie", pcie, h, getattr(n, "NVML_PCIE_UTIL_TX_BYTES", 0))),
            "pcie_rx_kbs": _count(once(index, "pcie", pcie, h, getattr(n, "NVML_PCIE_UTIL_RX_BYTES", 1))),
            "nvlink_tx_kib": links[0],
            "nvlink_rx_kib": links[1],
            "sm_mhz": _count(once(index, "clock", getattr(n, "nvmlDeviceGetClockInfo", None), h, sm)) or None,
            "sm_max_mhz": _count(top) or None,
        }

    def system(self) -> dict:
        n = self.nvml
        errors: dict[str, str] = {}
        cuda = self._field(errors, "cuda_driver_version", n.nvmlSystemGetCudaDriverVersion)
        return {
            "driver_version": _text(self._field(errors, "driver_version", n.nvmlSystemGetDriverVersion)),
            "cuda_driver_version": cuda_version_text(cuda),
            "nvml_version": _text(self._field(errors, "nvml_version", n.nvmlSystemGetNVMLVersion)),
            "errors": errors,
        }

    def device(self, index: int) -> dict:
        """Everything the health checks judge about one GPU."""
        n = self.nvml
        errors: dict[str, str] = {}
        h = self.handle(index)
        f = self._field
        pci = f(errors, "pci", n.nvmlDeviceGetPciInfo, h)
        ecc = f(errors, "ecc_mode", n.nvmlDeviceGetEccMode, h)
        remap = f(errors, "remapped_rows", n.nvmlDeviceGetRemappedRows, h)
        util = f(errors, "utilization", n.nvmlDeviceGetUtilizationRates, h)
        mem = f(errors, "memory", n.nvmlDeviceGetMemoryInfo, h)
        power_mw = f(errors, "power", n.nvmlDeviceGetPowerUsage, h)
        limit_mw = f(errors, "power_limit", n.nvmlDeviceGetEnforcedPowerLimit, h)
        retired_pending = f(errors, "retired_pages_pending", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        dbe_pages = f(
            errors,
            "retired_pages_dbe",
            n.nvmlDeviceGetRetiredPages,
            h,
            getattr(n, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
        )
        reasons_fn = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        max_gen_fn = (
            getattr(n, "nvmlDeviceGetGpuMaxPcieLinkGeneration", None) or n.nvmlDeviceGetMaxPcieLinkGeneration
        )
        nvlinks = []
        for link in range(MAX_NVLINKS):
            try:
                state = n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError:
                continue  # link absent on this device (NotSupported / InvalidArgument)
            nvlinks.append({"link": link, "active": bool(state)})
        return {
            "index": index,
            "name": _text(f(errors, "name", n.nvmlDeviceGetName, h)),
            "uuid": _text(f(errors, "uuid", n.nvmlDeviceGetUUID, h)),
            "serial": _text(f(errors, "serial", n.nvmlDeviceGetSerial, h)),
            "pci_bus_id": _text(getattr(pci, "busId", None)) if pci is not None else None,
            "vbios_version": _text(f(errors, "vbios_version", n.nvmlDeviceGetVbiosVersion, h)),
            "persistence_mode": f(errors, "persistence_mode", n.nvmlDeviceGetPersistenceMode, h),
            "performance_state": f(errors, "performance_state", n.nvmlDeviceGetPerformanceState, h),
            "temperature_c": f(
                errors, "temperature", n.nvmlDeviceGetTemperature, h, getattr(n, "NVML_TEMPERATURE_GPU", 0)
            ),
            "power_w": power_mw / 1000.0 if isinstance(power_mw, (int, float)) else None,
            "power_limit_w": limit_mw / 1000.0 if isinstance(limit_mw, (int, float)) else None,
            "app_clocks_mhz": self.app_clocks(errors, h),
            "ecc_mode_current": ecc[0] if isinstance(ecc, (list, tuple)) and ecc else None,
            "ecc_uncorrected_volatile": f(
                errors,
                "ecc_uncorrected_volatile",
                n.nvmlDeviceGetTotalEccErrors,
                h,
                getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(n, "NVML_VOLATILE_ECC", 0),
            ),
            "ecc_corrected_volatile": f(
                errors,
                "ecc_corrected_volatile",
                n.nvmlDeviceGetTotalEccErrors,
                h,
                getattr(n, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
                getattr(n, "NVML_VOLATILE_ECC", 0),
            ),
            "retired_pages_pending": bool(retired_pending) if retired_pending is not None else None,
            "retired_pages_dbe": len(dbe_pages) if isinstance(dbe_pages, (list, tuple)) else None,
            "remapped_rows": None
            if not isinstance(remap, (list, tuple)) or len(remap) < 4
            else {
                "correctable": remap[0],
                "uncorrectable": remap[1],
                "pending": bool(remap[2]),
                "failure": bool(remap[3]),
            },
            "pcie": {
                "gen": f(errors, "pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "max_gen": f(errors, "pcie_max_gen", max_gen_fn, h),
                "width": f(errors, "pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, h),
                "max_width": f(errors, "pcie_max_width", n.nvmlDeviceGetMaxPcieLinkWidth, h),
            },
            "clock_event_reasons": f(errors, "clock_event_reasons", reasons_fn, h),
            "nvlinks": nvlinks,
            "utilization": None if util is None else {"gpu": util.gpu, "memory": util.memory},
            "memory": None if mem is None else {"used": mem.used, "total": mem.total},
            "errors": errors,
        }

    def app_clocks(self, errors: dict, h) -> dict:
        """The SM and memory application clocks (MHz) the GPU runs work at (`nvidia-smi -ac`), None where it
        does not support them: the drift checks (health/drift.py) judge them against the profile."""
        n = self.nvml
        read = getattr(n, "nvmlDeviceGetApplicationsClock", None)
        if read is None:
            return {"sm": None, "mem": None}
        return {
            "sm": self._field(errors, "app_clock_sm", read, h, getattr(n, "NVML_CLOCK_SM", 1)),
            "mem": self._field(errors, "app_clock_mem", read, h, getattr(n, "NVML_CLOCK_MEM", 2)),
        }

    def utilization(self, index: int, with_perf: bool = False) -> GpuUtilization:
        """The sampler's read: 4 NVML calls (utilization, memory, power, processes), 4 more `with_perf`."""
        n = self.nvml
        errors: dict[str, str] = {}
        h = self.handle(index)
        util = self._field(errors, "utilization", n.nvmlDeviceGetUtilizationRates, h)
        mem = self._field(errors, "memory", n.nvmlDeviceGetMemoryInfo, h)
        power_mw = self._field(errors, "power", n.nvmlDeviceGetPowerUsage, h)
        procs = (
            self._field(errors, "processes", n.nvmlDeviceGetComputeRunningProcesses, h)
            if hasattr(n, "nvmlDeviceGetComputeRunningProcesses")
            else None
        )
        perf = self.perf(index, with_max=index not in self._max_sm) if with_perf else {}
        if with_perf:
            perf["sm_max_mhz"] = self._max_sm.setdefault(index, perf["sm_max_mhz"])
        if index not in self._identity:
            pci = self._field(errors, "pci", n.nvmlDeviceGetPciInfo, h)
            self._identity[index] = (
                _text(self._field(errors, "uuid", n.nvmlDeviceGetUUID, h)),
                _text(getattr(pci, "busId", None)) if pci is not None else None,
            )
        uuid, bus = self._identity[index]
        return GpuUtilization(
            index,
            uuid,
            bus,
            getattr(util, "gpu", None),
            getattr(util, "memory", None),
            getattr(mem, "used", None),
            getattr(mem, "total", None),
            power_mw / 1000.0 if isinstance(power_mw, (int, float)) else None,
            len(procs) if isinstance(procs, (list, tuple)) else None,
            **perf,
        )


def read_gpus(timeout_s: float = 5.0, nvml=None) -> dict:
    """The `gpus` section of a snapshot. Never raises and never waits past timeout_s: if NVML hangs, the
    devices read before the stall are kept and `answered` is False."""

    def probe(partial, nvml_module):
        out: dict = {
            "answered": False,
            "devices": [],
            "driver_version": None,
            "cuda_driver_version": None,
            "nvml_version": None,
            "error": None,
        }
        partial.value = out
        session = NvmlSession(nvml_module)
        try:
            out.update(session.system())
            count = session.count()
            out["count"] = count
            for index in range(count):
                out["stalled_at"] = index  # cleared on success: a timeout leaves the GPU that hung
                out["devices"].append(session.device(index))
            out.pop("stalled_at", None)
            out["answered"] = True
        finally:
            session.close()
        return out

    result = run_probe("nvml", probe, timeout_s, nvml)
    gpus = result.value if isinstance(result.value, dict) else {"answered": False, "devices": []}
    if result.status != OK:
        gpus.update(answered=False, error=_nvml_problem(result.message), **result.timed_out())
    gpus["elapsed_s"] = round(result.elapsed_s, 4)
    return gpus


def _nvml_problem(message: str) -> str:
    if "ModuleNotFoundError" in message or "No module named" in message:
        return "NVML unavailable: the nvml extra (nvidia-ml-py) is not installed"
    if "LibraryNotFound" in message or "Shared Library Not Found" in message:
        return "NVML unavailable: libnvidia-ml.so not found (no NVIDIA driver?)"
    return message


class LiveGpuSource:
    """The sampler's GPU source on a real node: one NVML session for the sampler's lifetime."""

    def __init__(self, timeout_s: float = 5.0, nvml=None, perf: bool = False):
        self.timeout_s, self.perf = timeout_s, perf  # perf: PCIe, NVLink and SM clock readings too
        result = run_probe("nvml-init", lambda partial: NvmlSession(nvml), timeout_s)
        if result.status != OK:
            raise StuneError(_nvml_problem(result.message))
        self.session = result.value
        self.indices = list(range(self.session.count()))

    def utilization(self) -> list[GpuUtilization]:
        result = run_probe(
            "nvml-sample",
            lambda partial: [self.session.utilization(i, self.perf) for i in self.indices],
            self.timeout_s,
        )
        if result.status == OK:
            return result.value
        return [GpuUtilization(i, None, None, None, None, None, None, None) for i in self.indices]

    def close(self) -> None:
        self.session.close()


class SnapshotGpuSource:
    """GPU readings from a snapshot file (the `stune-health capture` format), re-read whenever it changes.
    Tests and replays drive the sampler with these."""

    def __init__(self, path: str, reader=None):
        self.path = path
        self.reader = (
            reader or utilization_from_snapshot
        )  # the snapshot's section to read (AMD, Ascend: accel)
        self._stamp: tuple[int, int, int] | None = None
        self._readings: list[GpuUtilization] = []

    def utilization(self) -> list[GpuUtilization]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return [r._replace(sm_util=None, mem_util=None, power_w=None) for r in self._readings]
        if stamp != self._stamp:
            self._readings = self.reader(_load_json(self.path))
            self._stamp = stamp
        return list(self._readings)

    def close(self) -> None:
        pass


def _load_json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def utilization_from_snapshot(snapshot) -> list[GpuUtilization]:
    """Per-GPU utilization fields of a snapshot, with a device's optional `perf` dict (PERF_FIELDS; older
    snapshots have none); anything missing or malformed reads as None."""
    gpus = snapshot.get("gpus") if isinstance(snapshot, dict) else None
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    out = []
    for pos, dev in enumerate(devices if isinstance(devices, list) else []):
        if not isinstance(dev, dict):
            continue
        util, mem, perf = dev.get("utilization"), dev.get("memory"), dev.get("perf")
        util = util if isinstance(util, dict) else {}
        mem = mem if isinstance(mem, dict) else {}
        perf = perf if isinstance(perf, dict) else {}
        out.append(
            GpuUtilization(
                _int(dev.get("index"), pos),
                _str(dev.get("uuid")),
                _str(dev.get("pci_bus_id")),
                _num(util.get("gpu")),
                _num(util.get("memory")),
                _num(mem.get("used")),
                _num(mem.get("total")),
                _num(dev.get("power_w")),
                len(dev["processes"]) if isinstance(dev.get("processes"), list) else None,
                *(_reading(perf.get(k)) for k in PERF_FIELDS),
            )
        )
    return out


def _num(value):
    return (
        value if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None
    )


def _reading(value):  # a perf reading from a snapshot: a finite number >= 0, else None (unmeasured)
    return value if _num(value) is not None and 0 <= value < float("inf") else None


def _int(value, default):
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _str(value):
    return value if isinstance(value, str) else None


def open_gpu_source(snapshot: str | None = None, timeout_s: float = 5.0, nvml=None, perf: bool = False):
    """The sampler's GPU source: from a snapshot file when given (its perf readings where it has them), else
    live NVML (`perf`: with PCIe, NVLink and SM clock). Raises StuneError when NVML cannot be opened."""
    return SnapshotGpuSource(snapshot) if snapshot else LiveGpuSource(timeout_s, nvml, perf)
