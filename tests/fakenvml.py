"""A stand-in for the pynvml module, for nodes without GPUs: the same function names and errors, with
devices described by plain dicts whose defaults are real A100/H100 values. It can also hang on a chosen GPU
(as NVML does when a GPU has fallen off the bus) or fail to load (no driver)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, cumulative; scopeId 0xFFFFFFFF: all links
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT = 0, 3, 2


class NVMLError(Exception):
    def __init__(self, value: int, text: str):
        super().__init__(text)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self):
        super().__init__(3, "Not Supported")


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self):
        super().__init__(15, "GPU is lost")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(12, "NVML Shared Library Not Found")


MODELS = {
    "a100": {
        "name": "NVIDIA A100-SXM4-80GB",
        "vbios": "92.00.45.00.03",
        "power_limit_mw": 400000,
        "pcie_max_gen": 4,
        "nvlinks": 12,
        "memory_total": 85899345920,
        "sm_max_clock": 1410,
        "app_clocks": (1410, 1593),  # SM, memory application clocks (MHz) as `nvidia-smi -ac 1593,1410` sets
    },
    "h100": {
        "name": "NVIDIA H100 80GB HBM3",
        "vbios": "96.00.74.00.0D",
        "power_limit_mw": 700000,
        "pcie_max_gen": 5,
        "nvlinks": 18,
        "memory_total": 85520809984,
        "sm_max_clock": 1980,
        "app_clocks": (1980, 2619),
    },
    "a10g": {
        "name": "NVIDIA A10G",
        "vbios": "94.02.75.00.01",
        "power_limit_mw": 300000,
        "pcie_max_gen": 4,
        "nvlinks": 0,
        "memory_total": 24146608128,
        "sm_max_clock": 1710,
        "app_clocks": (1710, 6251),
    },
}
DGX_BUS_IDS = [
    "00000000:07:00.0",
    "00000000:0F:00.0",
    "00000000:47:00.0",
    "00000000:4E:00.0",
    "00000000:87:00.0",
    "00000000:90:00.0",
    "00000000:B7:00.0",
    "00000000:BD:00.0",
]


def device(index: int, model: str = "a100", **overrides) -> dict:
    """A healthy GPU at light load; override any field (e.g. remapped_pending=True, nvlink_down=[3])."""
    spec = MODELS[model]
    dev = {
        "name": spec["name"],
        "uuid": f"GPU-5c3b1a0e-{index:04x}-4c1d-9a3e-7f21b6d0{index:04x}",
        "serial": f"13240230{index:05d}",
        "bus_id": DGX_BUS_IDS[index % 8],
        "vbios": spec["vbios"],
        "persistence": 1,
        "pstate": 0,
        "temperature": 34,
        "power_mw": 61230,
        "power_limit_mw": spec["power_limit_mw"],
        "ecc_mode": 1,
        "ecc_uncorrected": 0,
        "ecc_corrected": 0,
        "retired_pending": 0,
        "retired_dbe": [],
        "remapped": (0, 0, 0, 0),
        "pcie_gen": spec["pcie_max_gen"],
        "pcie_max_gen": spec["pcie_max_gen"],
        "pcie_width": 16,
        "pcie_max_width": 16,
        "clock_reasons": 0x1,
        "nvlinks": spec["nvlinks"],
        "nvlink_down": [],
        "util_gpu": 0,
        "util_memory": 0,
        "memory_used": 524288000,
        "memory_total": spec["memory_total"],
        "processes": [4242],
        "mig": False,
        # the perf readings: None is NotSupported. PCIe KB/s (NVML samples a byte counter over 20 ms), NVLink
        # data KiB over all links (cumulative; a GPU without NVLink answers NotSupported), SM clock MHz
        "pcie_tx_kbs": 1843,
        "pcie_rx_kbs": 5120,
        "nvlink_tx_kib": 0 if spec["nvlinks"] else None,
        "nvlink_rx_kib": 0 if spec["nvlinks"] else None,
        "sm_clock": spec["sm_max_clock"],
        "sm_max_clock": spec["sm_max_clock"],
        "app_clocks": spec["app_clocks"],  # None: NotSupported
    }
    dev.update(overrides)
    return dev


class FakeNvml:
    def __init__(
        self,
        devices: list[dict],
        *,
        driver: str = "535.104.05",
        cuda: int = 12020,
        hang_on_index: int | None = None,
        fail_init: bool = False,
        lost_index: int | None = None,
    ):
        self.devices, self.driver, self.cuda = devices, driver, cuda
        self.hang_on_index, self.fail_init, self.lost_index = hang_on_index, fail_init, lost_index
        self.initialised = False
        self.calls = 0
        self._never = threading.Event()
        for name in (
            "NVMLError",
            "NVMLError_NotSupported",
            "NVMLError_GpuIsLost",
            "NVMLError_LibraryNotFound",
        ):
            setattr(self, name, globals()[name])
        for name in (
            "NVML_TEMPERATURE_GPU",
            "NVML_MEMORY_ERROR_TYPE_CORRECTED",
            "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
            "NVML_VOLATILE_ECC",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
            "NVML_PCIE_UTIL_TX_BYTES",
            "NVML_PCIE_UTIL_RX_BYTES",
            "NVML_CLOCK_SM",
            "NVML_CLOCK_MEM",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
        ):
            setattr(self, name, globals()[name])

    # -- system
    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError_LibraryNotFound()
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlSystemGetNVMLVersion(self):
        return f"12.{self.driver}"

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index == self.hang_on_index:
            self._never.wait()  # a GPU that fell off the bus: NVML blocks
        if not 0 <= index < len(self.devices):
            raise NVMLError(2, "Invalid Argument")
        return index

    def _dev(self, h):
        self.calls += 1
        if h == self.lost_index:
            raise NVMLError_GpuIsLost()
        return self.devices[h]

    # -- device
    def nvmlDeviceGetName(self, h):
        return self._dev(h)["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h)["uuid"]

    def nvmlDeviceGetSerial(self, h):
        return self._dev(h)["serial"]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._dev(h)["bus_id"])

    def nvmlDeviceGetVbiosVersion(self, h):
        return self._dev(h)["vbios"]

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._dev(h)["persistence"]

    def nvmlDeviceGetPerformanceState(self, h):
        return self._dev(h)["pstate"]

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._dev(h)["temperature"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev(h)["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._dev(h)["power_limit_mw"]

    def nvmlDeviceGetEccMode(self, h):
        mode = self._dev(h)["ecc_mode"]
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        d = self._dev(h)
        return (
            d["ecc_uncorrected"] if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else d["ecc_corrected"]
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._dev(h)["retired_pending"]

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return list(self._dev(h)["retired_dbe"])

    def nvmlDeviceGetRemappedRows(self, h):
        return tuple(self._dev(h)["remapped"])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._dev(h)["pcie_gen"]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h):
        return self._dev(h)["pcie_max_gen"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev(h)["pcie_max_gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._dev(h)["pcie_width"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev(h)["pcie_max_width"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev(h)["clock_reasons"]

    def nvmlDeviceGetNvLinkState(self, h, link):
        d = self._dev(h)
        if link >= d["nvlinks"]:
            raise NVMLError_NotSupported()
        return 0 if link in d["nvlink_down"] else 1

    def nvmlDeviceGetUtilizationRates(self, h):
        d = self._dev(h)
        if d["mig"]:  # MIG mode: the parent GPU reports no utilization
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=d["util_gpu"], memory=d["util_memory"])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        d = self._dev(h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in d["processes"]]

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self._dev(h)
        return SimpleNamespace(
            used=d["memory_used"], total=d["memory_total"], free=d["memory_total"] - d["memory_used"]
        )

    def _supported(self, h, key: str):
        value = self._dev(h)[key]
        if value is None:
            raise NVMLError_NotSupported()
        return value

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self._supported(h, "pcie_tx_kbs" if counter == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbs")

    def nvmlDeviceGetClockInfo(self, h, clock):
        if clock != NVML_CLOCK_SM:
            raise NVMLError(2, "Invalid Argument")
        return self._supported(h, "sm_clock")

    def nvmlDeviceGetApplicationsClock(self, h, clock):
        clocks = self._supported(h, "app_clocks")
        if clock not in (NVML_CLOCK_SM, NVML_CLOCK_MEM):
            raise NVMLError(2, "Invalid Argument")
        return clocks[0] if clock == NVML_CLOCK_SM else clocks[1]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        if clock != NVML_CLOCK_SM:
            raise NVMLError(2, "Invalid Argument")
        return self._supported(h, "sm_max_clock")

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        """pynvml's form: a list of ids or (id, scopeId) pairs -> one value per field with its own nvmlReturn
        (the call itself succeeds); only the NVLink data fields summed over all links are known here."""
        d = self._dev(h)
        out = []
        for entry in field_ids:
            field, scope = entry if isinstance(entry, tuple) else (entry, 0)
            key = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_kib"}.get(field)
            key = key or {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_kib"}.get(field)
            value = d.get(key) if key and scope == 0xFFFFFFFF else None
            ret = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
            out.append(
                SimpleNamespace(
                    fieldId=field,
                    scopeId=scope,
                    nvmlReturn=ret,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(ullVal=value or 0),
                )
            )
        return out
