"""AMD Instinct GPUs through amdsmi, AMD's own Python library, one session per process, behind a deadline.

`capture()` reads everything the health checks judge into the `accel` section (hw/accel.py's format, vendor
amd). `AmdSource` is the sampler's live reading (GFX activity, UMC activity, VRAM, socket power, process count).

amdsmi (the `amd` extra) is imported only here, when an AMD node is really read; the prolog path never touches
this module. It needs libamd_smi.so from the node's ROCm (amd-smi-lib), of the same release as the amdsmi
package. Values are amdsmi's own converted to the section's units (power cap uW -> W, PCIe MT/s -> generation,
process memory bytes -> MiB; socket power is W, VRAM MB, temperatures °C already). A reading the device does
not support (AMDSMI_STATUS_NOT_SUPPORTED or NOT_YET_IMPLEMENTED, an "N/A", a function this amdsmi release does
not have) is None; a reading that failed otherwise is None and named in the device's `errors`.

A device's `render` is N of its /dev/dri/renderDN (amdsmi_get_gpu_enumeration_info's drm_render: amdsmi 7.0 has
it, 6.0 does not) and `minor` Slurm's number for it (amdvalues.fill_minors: N - 128 where render nodes are
contiguous, the step taken out on MI300, which has 8 per GPU; the bus-id-ordered position without a render).
"""

from __future__ import annotations

import contextlib
import io
import time

from ..errors import StuneError
from .accel import utilization_from_section
from .amdvalues import (
    MIB,
    UNSET,
    blank_device,
    blank_system,
    bus_id,
    celsius,
    count,
    fill_minors,
    first,
    gen,
    gen_of_speed,
    lanes,
    mib,
    percent,
    text,
    version,
    watts,
)
from .deadline import OK, TIMEOUT, run_probe
from .nvml import GpuUtilization
from .sysfs import Sysfs

MISSING = "amdsmi not installed (pip install 'slurm-tune[amd]')"
NOT_SUPPORTED = (2, 3)  # AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_NOT_YET_IMPLEMENTED (amdsmi.h)
RENDER_BASE = 128  # /dev/dri/renderD128 is the first render node
ROCM_VERSION_FILE = "opt/rocm/.info/version"  # `6.3.3-74`: the release, then the build


def load_amdsmi():
    """The amdsmi module, or StuneError with one line saying why not. amdsmi prints to stdout when it cannot
    load libamd_smi.so (then fails with KeyError): that text is kept out of stune's output."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            import amdsmi  # optional: the amd extra
    except ModuleNotFoundError as exc:
        if (exc.name or "amdsmi").split(".")[0] == "amdsmi":
            raise StuneError(MISSING) from None
        raise StuneError(f"amdsmi cannot be imported: {exc}") from None
    except Exception as exc:  # KeyError('libamd_smi.so'), OSError: the library is not there
        printed = [line.strip() for line in said.getvalue().splitlines() if line.strip()]
        why = printed[0][:200] if printed else f"{type(exc).__name__}: {exc}"
        raise StuneError(f"amdsmi cannot load libamd_smi.so (install amd-smi-lib from ROCm): {why}") from None
    return amdsmi


def _why(exc: BaseException) -> str:
    """amdsmi's own short reason (AMDSMI_STATUS_NO_PERM - Permission Denied), on one line."""
    info = getattr(exc, "get_error_info", None)
    try:
        said = info() if callable(info) else f"{type(exc).__name__}: {exc}"
    except Exception:
        said = type(exc).__name__
    return " ".join(str(said).split())[:300]


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _rocm_release(value) -> str | None:
    """6.3.3 of `6.3.3-74` (/opt/rocm/.info/version adds the build): the release the profile pins."""
    return version(value.split("-")[0]) if isinstance(value, str) else None


class AmdSession:
    """One amdsmi session: amdsmi_init, the GPU handles, amdsmi_shut_down. `amdsmi` is the module (tests pass
    tests/fakeamdsmi.py's stand-in). Raises what amdsmi_init or amdsmi_get_processor_handles raise."""

    def __init__(self, amdsmi):
        self.m = amdsmi
        amdsmi.amdsmi_init()
        try:
            self.handles = list(amdsmi.amdsmi_get_processor_handles())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.m.amdsmi_shut_down()
        except Exception:  # shutting down a lost library is not worth reporting
            pass

    def _read(self, errors: dict, name: str, api: str, *args):
        """One amdsmi call. Not supported (or absent from this amdsmi release) is None; other errors are
        recorded under `name`."""
        fn = getattr(self.m, api, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if getattr(exc, "err_code", None) not in NOT_SUPPORTED:
                errors[name] = _why(exc)
            return None

    def identity(self, index: int, errors: dict) -> dict:
        """The fixed part of a device: bus id, render node (minor), serial, name."""
        h = self.handles[index]
        d = blank_device(index)
        d["errors"] = errors
        asic = _dict(self._read(errors, "asic", "amdsmi_get_gpu_asic_info", h))
        board = _dict(self._read(errors, "board", "amdsmi_get_gpu_board_info", h))
        enum = _dict(self._read(errors, "render", "amdsmi_get_gpu_enumeration_info", h))
        render = count(enum.get("drm_render"))
        d["render"] = render if render is not None and render >= RENDER_BASE else None  # minor: fill_minors
        d["bus_id"] = bus_id(self._read(errors, "bus_id", "amdsmi_get_gpu_device_bdf", h))
        d["name"] = first(text(asic.get("market_name")), text(board.get("product_name")))
        d["serial"] = first(text(board.get("product_serial")), text(asic.get("asic_serial")))
        return d

    def readings(self, index: int, d: dict) -> dict:
        """The sampler's part: GFX and UMC activity, VRAM, socket power, processes (4 calls)."""
        h, errors = self.handles[index], d["errors"]
        activity = _dict(self._read(errors, "activity", "amdsmi_get_gpu_activity", h))
        vram = _dict(self._read(errors, "vram", "amdsmi_get_gpu_vram_usage", h))
        power = _dict(self._read(errors, "power", "amdsmi_get_power_info", h))
        d["util_pct"] = percent(activity.get("gfx_activity"))
        d["mem_util_pct"] = percent(activity.get("umc_activity"))
        d["mem_used_mb"], d["mem_total_mb"] = mib(vram.get("vram_used")), mib(vram.get("vram_total"))
        # socket_power (amdsmi 7), current_socket_power (MI300), average_socket_power (MI200 and older): W
        socket = [power.get(k) for k in ("socket_power", "current_socket_power", "average_socket_power")]
        d["power_w"] = first(*(watts(v) for v in socket if not (isinstance(v, int) and v >= 0xFFFF)))
        d["processes"] = self._processes(errors, h)
        return d

    def device(self, index: int) -> dict:
        """Everything the health checks judge about one GPU."""
        errors: dict[str, str] = {}
        d = self.readings(index, self.identity(index, errors))
        h = self.handles[index]
        cap = _dict(self._read(errors, "power_limit", "amdsmi_get_power_cap_info", h)).get("power_cap")
        uw = cap if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap not in UNSET else None
        d["power_limit_w"] = (watts(uw / 1e6) if uw is not None else None) or None  # a cap of 0: none set
        d["temperature_c"] = self._temperature(errors, h)
        ecc = _dict(self._read(errors, "ecc", "amdsmi_get_gpu_total_ecc_count", h))
        d["ecc"] = {
            "uncorrected": count(ecc.get("uncorrectable_count")),
            "corrected": count(ecc.get("correctable_count")),
        }
        pcie = _dict(self._read(errors, "pcie", "amdsmi_get_pcie_info", h))
        static, metric = _dict(pcie.get("pcie_static")), _dict(pcie.get("pcie_metric"))
        d["pcie"] = {
            "width": lanes(metric.get("pcie_width")),
            "max_width": lanes(static.get("max_pcie_width")),
            "gen": gen_of_speed(metric.get("pcie_speed")),
            "max_gen": first(
                gen(static.get("pcie_interface_version")), gen_of_speed(static.get("max_pcie_speed"))
            ),
        }
        d["links"] = self._links(errors, h)
        vbios = text(_dict(self._read(errors, "vbios", "amdsmi_get_gpu_vbios_info", h)).get("version"))
        d["firmware"] = {"vbios": vbios} if vbios else {}
        return d

    def _temperature(self, errors: dict, h) -> float | None:
        """The hotspot (junction) temperature, else the edge one (°C): MI300 has no edge sensor, consumer
        boards may have no hotspot."""
        kinds, metric = (
            getattr(self.m, "AmdSmiTemperatureType", None),
            getattr(self.m, "AmdSmiTemperatureMetric", None),
        )
        if kinds is None or metric is None:
            return None
        for name, kind in (("temperature_hotspot", kinds.HOTSPOT), ("temperature_edge", kinds.EDGE)):
            value = celsius(self._read(errors, name, "amdsmi_get_temp_metric", h, kind, metric.CURRENT))
            if value is not None:
                return value
        return None

    def _links(self, errors: dict, h) -> list[dict]:
        """XGMI links from amdsmi_get_gpu_xgmi_link_status: U up, D down; X (disabled: no peer there) and N/A
        are no link. A GPU without XGMI answers not supported: no links."""
        status = _dict(self._read(errors, "links", "amdsmi_get_gpu_xgmi_link_status", h)).get("status")
        states = status if isinstance(status, list) else []
        return [
            {"link": i, "kind": "xgmi", "up": s == "U"} for i, s in enumerate(states[:64]) if s in ("U", "D")
        ]

    def _processes(self, errors: dict, h) -> list[dict] | None:
        """The compute processes on the GPU: amdsmi >= 6.1 lists dicts; 6.0 lists handles, each read with
        amdsmi_get_gpu_process_info. None when the list cannot be read whole (unmeasured, never idle)."""
        found = self._read(errors, "processes", "amdsmi_get_gpu_process_list", h)
        if not isinstance(found, list):
            return None
        out = []
        for proc in found:
            if not isinstance(proc, dict):
                proc = self._read(errors, "processes", "amdsmi_get_gpu_process_info", h, proc)
            pid = count(proc.get("pid")) if isinstance(proc, dict) else None
            if pid is None:
                errors.setdefault("processes", "a process amdsmi listed could not be read")
                return None
            used = first(count(_dict(proc.get("memory_usage")).get("vram_mem")), count(proc.get("mem")))
            out.append({"pid": pid, "mem_mb": used / MIB if used is not None else None})
        return out

    def system(self, root: str = "/") -> dict:
        """The version matrix's AMD parts: amdgpu driver (of the first GPU), ROCm, the amdsmi library."""
        out = blank_system()
        errors = out["errors"]
        if self.handles:
            info = _dict(self._read(errors, "driver_version", "amdsmi_get_gpu_driver_info", self.handles[0]))
            out["driver_version"] = version(info.get("driver_version"))
        lib = _dict(self._read(errors, "tool_version", "amdsmi_get_lib_version"))
        parts = [str(lib[k]) for k in ("year", "major", "minor", "release") if isinstance(lib.get(k), int)]
        out["tool_version"] = version(".".join(parts))
        rocm = self._read(errors, "rocm_version", "amdsmi_get_rocm_version")
        found = rocm[1] if isinstance(rocm, (tuple, list)) and len(rocm) == 2 and rocm[0] is True else None
        out["rocm_version"] = _rocm_release(found) or _rocm_release(Sysfs(root).read(ROCM_VERSION_FILE))
        return out


def _open(amdsmi) -> AmdSession | str:
    """A session, or why there is none (one line)."""
    try:
        return AmdSession(amdsmi)
    except Exception as exc:
        return f"amdsmi could not be opened: {_why(exc)}"


def capture(timeout_s: float = 5.0, amdsmi_module=None, root: str = "/") -> dict:
    """The `accel` section of this node's AMD GPUs. Never raises and never waits past timeout_s: if amdsmi
    hangs, the devices read before the stall are kept, `answered` is False and `stalled_at` names the GPU.
    `root`: where /opt/rocm/.info/version is read when amdsmi cannot tell the ROCm release."""
    start = time.monotonic()
    out: dict = {"answered": False, "vendor": "amd", "source": "amdsmi", "elapsed_s": 0.0}
    out.update(system=blank_system(), devices=[])
    try:
        module = amdsmi_module if amdsmi_module is not None else load_amdsmi()
    except StuneError as exc:
        out.update(error=str(exc), elapsed_s=round(time.monotonic() - start, 4))
        return out
    work: dict = {"devices": [], "stalled_at": None}  # the probe's own: published whole, read by copy

    def probe(partial):
        partial.value = work
        session = _open(module)
        if isinstance(session, str):
            return session
        try:
            for index in range(len(session.handles)):
                work["stalled_at"] = index
                work["devices"].append(session.device(index))
            work["stalled_at"] = "system"
            system = session.system(root)
        finally:
            session.close()
        return system

    result = run_probe("amdsmi", probe, timeout_s)
    out["devices"] = list(work["devices"])
    fill_minors(out["devices"])
    if result.status == OK and isinstance(result.value, dict):
        out.update(answered=True, system=result.value)
    elif result.status == OK:
        out["error"] = result.value
    else:
        out.update(error=result.message, stalled_at=work["stalled_at"], **result.timed_out())
    out["elapsed_s"] = round(time.monotonic() - start, 4)
    return out


class AmdSource:
    """The sampler's device source on an AMD node: one amdsmi session for the sampler's lifetime. Raises
    StuneError when amdsmi is missing or cannot be opened. A sample that does not answer within timeout_s
    reads as unmeasured; while that call is still stuck in the library, later samples do not call it again."""

    def __init__(self, timeout_s: float = 5.0, amdsmi_module=None):
        self.timeout_s = timeout_s
        module = amdsmi_module if amdsmi_module is not None else load_amdsmi()

        def opening(partial):
            session = _open(module)
            if isinstance(session, str):
                return session
            fixed = [session.identity(i, {}) for i in range(len(session.handles))]
            fill_minors(fixed)
            return session, fixed

        result = run_probe("amdsmi-init", opening, timeout_s)
        if result.status != OK or isinstance(result.value, str):
            raise StuneError(result.value if result.status == OK else f"amdsmi: {result.message}")
        self.session, self.fixed = result.value
        self._busy = False  # a sample still inside amdsmi (it hung past its deadline)

    def _sample(self, partial) -> list[dict]:
        try:
            return [self.session.readings(d["index"], _blank_like(d)) for d in self.fixed]
        finally:
            self._busy = False

    def utilization(self) -> list[GpuUtilization]:
        if not self._busy:
            self._busy = True
            result = run_probe("amdsmi-sample", self._sample, self.timeout_s)
            if result.status == OK:
                return utilization_from_section({"devices": result.value})
            if result.status != TIMEOUT:
                self._busy = False
        return utilization_from_section({"devices": [_blank_like(d) for d in self.fixed]})

    def close(self) -> None:
        if not self._busy:
            run_probe("amdsmi-close", lambda partial: self.session.close(), self.timeout_s)


def _blank_like(fixed: dict) -> dict:
    """A fresh device with only the fixed identity of `fixed` (index, minor, bus id, serial)."""
    d = blank_device(fixed["index"])
    d.update({k: fixed[k] for k in ("minor", "render", "bus_id", "serial", "name")})
    return d
