"""The accelerator vendors' constants, in one module with no imports: the profile's schema (accelspec.py),
the hardware layer and the health checks (which a hook loads: the import rule) all read them here."""

NVIDIA, AMD, ASCEND = "nvidia", "amd", "ascend"
VENDORS = (NVIDIA, AMD, ASCEND)
# The GRES a vendor's devices are scheduled as when gpu.gres is empty: AMD sites use gres/gpu over
# /dev/dri/renderD*, Ascend sites commonly gres/npu over /dev/davinci*.
DEFAULT_GRES = {NVIDIA: "gpu", AMD: "gpu", ASCEND: "npu"}
# Hot-limit defaults when accel.max_temp_c is empty (docs/accelerators.md): the temperature each vendor's
# tool reports (AMD: the hotspot/junction sensor; Ascend: the chip), below the vendor's throttle point.
DEFAULT_MAX_TEMP_C = {AMD: 100, ASCEND: 85}

# hccn_tool's words (an Ascend NPU's on-card RoCE port): `-link -g`'s states, and `-net_health -g`'s results as
# its documentation lists them, Success the healthy one; anything else is not a result (unknown).
HCCN_LINK = ("UP", "DOWN")
NET_HEALTH_OK = "Success"
HCCN_NET_HEALTH = (
    NET_HEALTH_OK,
    "Socket fail",
    "Receive timeout",
    "Unreachable",
    "Time exceeded",
    "Fault",
    "Init",
    "Thread error",
    "Detect ip set",
    "Detect ip not set",
)
