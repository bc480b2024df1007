"""stune-bind's GPU UUID -> PCI bus id lookup: its own NVML session, under a deadline. NVML (hw/nvml.py) is
imported only when a lookup runs (docs/speed.md: stune-bind's other paths make no NVML call)."""

from __future__ import annotations


def pci_bus_id_of_uuid(uuid: str, timeout_s: float = 5.0, nvml=None) -> tuple[str | None, str]:
    """(NVML's PCI bus id of the GPU or MIG device `uuid`, problem). Under a deadline, like every NVML read:
    a GPU that fell off the bus must not hang the caller (stune-bind, in front of a training task)."""
    from .deadline import OK, run_probe
    from .nvml import NvmlSession, _nvml_problem, _text

    def probe(partial, nvml_module):
        session = NvmlSession(nvml_module)
        try:
            n = session.nvml
            handle = n.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
            return _text(n.nvmlDeviceGetPciInfo(handle).busId)
        finally:
            session.close()

    result = run_probe("nvml-uuid", probe, timeout_s, nvml)
    if result.status == OK and isinstance(result.value, str):
        return result.value, ""
    return None, _nvml_problem(result.message or "no PCI bus id")
