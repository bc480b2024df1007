"""A stand-in for AMD's amdsmi module (the `amd` extra), for nodes without AMD GPUs: the same function names,
arguments, exceptions and returned dicts as amdsmi 7.0.2 from PyPI (its amdsmi_interface.py; 6.0's process
handles on request), with devices described by plain dicts whose defaults are MI300X and MI210 values. A
reading can answer not supported (AMDSMI_STATUS_NOT_SUPPORTED) or fail with any status, a call can hang (a GPU
lost under the driver), a function can be absent (an older amdsmi release), and amdsmi_init can fail (driver
not loaded)."""

from __future__ import annotations

import threading
from enum import IntEnum

# amdsmi_wrapper's status codes (amdsmi.h)
AMDSMI_STATUS_SUCCESS, AMDSMI_STATUS_INVAL, AMDSMI_STATUS_NOT_SUPPORTED = 0, 1, 2
AMDSMI_STATUS_NOT_YET_IMPLEMENTED, AMDSMI_STATUS_NO_PERM, AMDSMI_STATUS_IO = 3, 10, 12
AMDSMI_STATUS_DRIVER_NOT_LOADED, AMDSMI_STATUS_NO_DATA = 34, 40
_ERR_INFO = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    3: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED - Feature not yet implemented",
    8: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    9: "AMDSMI_STATUS_RETRY - Retry operation",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    12: "AMDSMI_STATUS_IO - I/O Error",
    34: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    40: "AMDSMI_STATUS_NO_DATA - No data was found for given input",
}
NA = "N/A"
UNSUPPORTED = "unsupported"  # a device value: the call that reads it answers AMDSMI_STATUS_NOT_SUPPORTED


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _ERR_INFO.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self):
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed=True):
        return self.err_info if detailed else self.err_info.split(" - ")[0]

    def get_error_code(self):
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(9)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(8)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue, expectedType, msg=None):
        super().__init__(msg)
        self.err_code = None
        self.err_msg = msg or (
            f"Invalid parameter:\nActual type: {type(receivedValue)}\nExpected type: {expectedType}"
        )

    def __str__(self):
        return self.err_msg


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(IntEnum):  # HOTSPOT and JUNCTION are one sensor (both 1)
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    CRITICAL = 5
    EMERGENCY = 7


class ProcessorHandle:
    """amdsmi_wrapper.amdsmi_processor_handle: opaque to callers."""

    def __init__(self, index: int):
        self.index = index


MI300X_BUS_IDS = [
    "0000:05:00.0",
    "0000:26:00.0",
    "0000:46:00.0",
    "0000:65:00.0",
    "0000:85:00.0",
    "0000:a6:00.0",
    "0000:c6:00.0",
    "0000:e5:00.0",
]
MODELS = {
    # OAM, 8 per node; the driver makes 8 render nodes per MI300 GPU (renderD128, renderD136, ...); no edge
    # sensor; XGMI to the 7 other GPUs (the eighth port modelled disabled)
    "mi300x": {
        "market_name": "AMD Instinct MI300X",
        "product_name": "AMD Instinct MI300X OAM",
        "render_stride": 8,
        "power_cap_uw": 750_000_000,
        "socket_power": 142,
        "current_socket_power": 142,
        "average_socket_power": NA,
        "edge": UNSUPPORTED,
        "hotspot": 41,
        "vram_total": 196592,
        "pcie_speed": 32000,
        "max_pcie_speed": 32000,
        "pcie_interface_version": 5,
        "xgmi": ["U"] * 7 + ["X"],
        "vbios": "113-M3000100-102",
    },
    # PCIe card: one render node per GPU, edge and junction sensors, no XGMI bridge fitted
    "mi210": {
        "market_name": "AMD Instinct MI210",
        "product_name": "Instinct MI210",
        "render_stride": 1,
        "power_cap_uw": 300_000_000,
        "socket_power": 41,
        "current_socket_power": NA,
        "average_socket_power": 41,
        "edge": 35,
        "hotspot": 38,
        "vram_total": 65520,
        "pcie_speed": 16000,
        "max_pcie_speed": 16000,
        "pcie_interface_version": 4,
        "xgmi": UNSUPPORTED,
        "vbios": "113-D67301V-073",
    },
}


def device(index: int, model: str = "mi300x", **overrides) -> dict:
    """A healthy GPU at light load; override any value (gfx_activity=97, xgmi=["U", "D"], ...). A value of
    UNSUPPORTED makes its call answer not supported; `fail` maps an amdsmi function name to a status code."""
    spec = MODELS[model]
    dev = {
        "market_name": spec["market_name"],
        "product_name": spec["product_name"],
        "product_serial": f"6922510011{index:02d}",
        "asic_serial": f"8af70525968316{index:02x}",
        "bdf": MI300X_BUS_IDS[index % 8],
        "drm_render": 128 + spec["render_stride"] * index,
        "vbios": spec["vbios"],
        "socket_power": spec["socket_power"],
        "current_socket_power": spec["current_socket_power"],
        "average_socket_power": spec["average_socket_power"],
        "power_cap_uw": spec["power_cap_uw"],
        "hotspot": spec["hotspot"],
        "edge": spec["edge"],
        "gfx_activity": 0,
        "umc_activity": 0,
        "vram_total": spec["vram_total"],
        "vram_used": 283,
        "ecc_correctable": 0,
        "ecc_uncorrectable": 0,
        "pcie_width": 16,
        "max_pcie_width": 16,
        "pcie_speed": spec["pcie_speed"],
        "max_pcie_speed": spec["max_pcie_speed"],
        "pcie_interface_version": spec["pcie_interface_version"],
        "xgmi": spec["xgmi"],
        "processes": [],  # [(pid, vram bytes)]
        "driver_version": "6.10.5",
        "fail": {},  # amdsmi function name -> status code it raises
    }
    dev.update(overrides)
    return dev


class FakeAmdSmi:
    """Use as the amdsmi module: hw.amd.capture(amdsmi_module=FakeAmdSmi([...]))."""

    def __init__(
        self,
        devices: list[dict],
        *,
        lib_version: dict | None = None,
        rocm_version: tuple = (True, "6.4.0"),
        fail_init: int | None = None,
        hang: tuple[int, str] | None = None,
        missing: tuple[str, ...] = (),
        process_handles: bool = False,
    ):
        self.devices, self.rocm_version, self.fail_init = devices, rocm_version, fail_init
        self.lib_version = lib_version or {"major": 25, "minor": 3, "release": 0, "build": "ede62f2"}
        self.hang, self.missing, self.process_handles = hang, set(missing), process_handles
        self.initialised = False
        self.calls: list[str] = []
        self.release = threading.Event()  # set it to let a hung call return (then it raises TIMEOUT)
        for name in (
            "AmdSmiException",
            "AmdSmiLibraryException",
            "AmdSmiRetryException",
            "AmdSmiTimeoutException",
            "AmdSmiParameterException",
            "AmdSmiInitFlags",
            "AmdSmiTemperatureType",
            "AmdSmiTemperatureMetric",
        ):
            setattr(self, name, globals()[name])

    def __getattribute__(self, name):
        get = object.__getattribute__
        old = name == "amdsmi_get_gpu_process_info" and not get(self, "process_handles")  # gone in 6.1
        if old or (name.startswith("amdsmi_") and name in get(self, "missing")):
            raise AttributeError(f"module 'amdsmi' has no attribute '{name}'")
        return get(self, name)

    # -- library
    def amdsmi_init(self, flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.fail_init is not None:
            raise AmdSmiLibraryException(self.fail_init)
        self.initialised = True

    def amdsmi_shut_down(self):
        self.initialised = False

    def amdsmi_get_processor_handles(self):
        self._check_init()
        return [ProcessorHandle(i) for i in range(len(self.devices))]

    def amdsmi_get_lib_version(self):
        return dict(self.lib_version)

    def amdsmi_get_rocm_version(self):
        return self.rocm_version

    def _check_init(self):
        if not self.initialised:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT

    def _dev(self, h, api: str) -> dict:
        """The device behind a handle, after what the test asked of this call (hang, fail)."""
        if not isinstance(h, ProcessorHandle):
            raise AmdSmiParameterException(h, ProcessorHandle)
        self._check_init()
        self.calls.append(api)
        if self.hang == (h.index, api):
            self.release.wait()
            raise AmdSmiTimeoutException()
        dev = self.devices[h.index]
        code = dev["fail"].get(api)
        if code is not None:
            raise AmdSmiLibraryException(code)
        return dev

    @staticmethod
    def _value(dev: dict, key: str):
        if dev[key] == UNSUPPORTED:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return dev[key]

    # -- identity
    def amdsmi_get_gpu_device_bdf(self, h):
        return self._dev(h, "amdsmi_get_gpu_device_bdf")["bdf"]

    def amdsmi_get_gpu_enumeration_info(self, h):
        d = self._dev(h, "amdsmi_get_gpu_enumeration_info")
        render = self._value(d, "drm_render")
        return {
            "drm_render": render,
            "drm_card": render - 127,
            "hsa_id": h.index + 2,
            "hip_id": h.index,
            "hip_uuid": "",
        }

    def amdsmi_get_gpu_asic_info(self, h):
        d = self._dev(h, "amdsmi_get_gpu_asic_info")
        return {
            "market_name": d["market_name"] or NA,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{int(d['asic_serial'], 16):016X}" if d["asic_serial"] else NA,
            "oam_id": h.index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        }

    def amdsmi_get_gpu_board_info(self, h):
        d = self._dev(h, "amdsmi_get_gpu_board_info")
        return {
            "model_number": "102-G30211-00",
            "product_serial": d["product_serial"] or NA,
            "fru_id": NA,
            "product_name": d["product_name"] or NA,
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_gpu_vbios_info(self, h):
        d = self._dev(h, "amdsmi_get_gpu_vbios_info")
        return {
            "name": "AMD MI300X",
            "build_date": "2024/03/14 11:32",
            "part_number": d["vbios"],
            "version": d["vbios"],
        }

    def amdsmi_get_gpu_driver_info(self, h):
        d = self._dev(h, "amdsmi_get_gpu_driver_info")
        return {
            "driver_name": "amdgpu",
            "driver_version": d["driver_version"],
            "driver_date": "2015/01/01 00:00",
        }

    # -- readings
    def amdsmi_get_power_info(self, h):
        d = self._dev(h, "amdsmi_get_power_info")
        keys = ("socket_power", "current_socket_power", "average_socket_power")
        out = {k: self._value(d, k) for k in keys}
        cap = d["power_cap_uw"]
        out.update(
            gfx_voltage=NA,
            soc_voltage=NA,
            mem_voltage=NA,
            power_limit=NA if cap == UNSUPPORTED else cap // 10**6,
        )
        return out

    def amdsmi_get_power_cap_info(self, h):
        cap = self._value(self._dev(h, "amdsmi_get_power_cap_info"), "power_cap_uw")
        return {
            "power_cap": cap,
            "default_power_cap": cap,
            "dpm_cap": 0,
            "min_power_cap": 0,
            "max_power_cap": cap,
        }

    def amdsmi_get_temp_metric(self, h, sensor_type, metric):
        d = self._dev(h, "amdsmi_get_temp_metric")
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        if metric != AmdSmiTemperatureMetric.CURRENT or sensor_type not in (0, 1):
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return self._value(d, "hotspot" if sensor_type == AmdSmiTemperatureType.HOTSPOT else "edge")

    def amdsmi_get_gpu_activity(self, h):
        d = self._dev(h, "amdsmi_get_gpu_activity")
        return {
            "gfx_activity": self._value(d, "gfx_activity"),
            "umc_activity": self._value(d, "umc_activity"),
            "mm_activity": NA,
        }

    def amdsmi_get_gpu_vram_usage(self, h):
        d = self._dev(h, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": self._value(d, "vram_total"), "vram_used": self._value(d, "vram_used")}

    def amdsmi_get_gpu_total_ecc_count(self, h):
        d = self._dev(h, "amdsmi_get_gpu_total_ecc_count")
        return {
            "correctable_count": self._value(d, "ecc_correctable"),
            "uncorrectable_count": self._value(d, "ecc_uncorrectable"),
            "deferred_count": 0,
        }

    def amdsmi_get_pcie_info(self, h):
        d = self._dev(h, "amdsmi_get_pcie_info")
        return {
            "pcie_static": {
                "max_pcie_width": self._value(d, "max_pcie_width"),
                "max_pcie_speed": self._value(d, "max_pcie_speed"),
                "pcie_interface_version": self._value(d, "pcie_interface_version"),
                "slot_type": "OAM",
            },
            "pcie_metric": {
                "pcie_width": self._value(d, "pcie_width"),
                "pcie_speed": self._value(d, "pcie_speed"),
                "pcie_bandwidth": NA,
                "pcie_replay_count": 0,
                "pcie_l0_to_recovery_count": 0,
                "pcie_replay_roll_over_count": 0,
                "pcie_nak_sent_count": 0,
                "pcie_nak_received_count": 0,
                "pcie_lc_perf_other_end_recovery_count": NA,
            },
        }

    def amdsmi_get_gpu_xgmi_link_status(self, h):
        status = self._value(self._dev(h, "amdsmi_get_gpu_xgmi_link_status"), "xgmi")
        return {"status": list(status), "total_links": len(status)}

    def amdsmi_get_gpu_process_list(self, h):
        d = self._dev(h, "amdsmi_get_gpu_process_list")
        procs = self._value(d, "processes")
        if self.process_handles:  # amdsmi 6.0: handles, read one by one with amdsmi_get_gpu_process_info
            return [pid for pid, _ in procs]
        return [_process(pid, vram) for pid, vram in procs]

    def amdsmi_get_gpu_process_info(self, h, process):  # amdsmi 6.0 only (process_handles=True)
        d = self._dev(h, "amdsmi_get_gpu_process_info")
        vram = dict(d["processes"]).get(process)
        if vram is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_DATA)
        return _process(process, vram)


def _process(pid: int, vram: int) -> dict:
    return {
        "name": "python3",
        "pid": pid,
        "mem": vram,
        "engine_usage": {"gfx": 0, "enc": 0},
        "memory_usage": {"gtt_mem": 2097152, "cpu_mem": 0, "vram_mem": vram},
        "cu_occupancy": NA,
    }
