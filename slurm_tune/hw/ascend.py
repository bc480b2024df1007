"""Huawei Ascend NPUs through npu-smi and hccn_tool (issue 26): Ascend has no Python library, so its tools are
run, each behind the capture's deadline with a bounded read (hw/ascendtools.py), and their text parsed
(hw/ascendparse.py, hw/hccnparse.py).

`capture()` gives the `accel` section (hw/accel.py's format, vendor ascend):
- the version files under `root` (relocatable, like sysfs): the driver's usr/local/Ascend/driver/version.info
  and the firmware's usr/local/Ascend/firmware/version.info (`Version=24.1.rc2`), and the CANN toolkit's
  <toolkit>/<arch>-linux/ascend_toolkit_install.info (`version=8.1.RC1.alpha001`), the toolkit being
  $ASCEND_TOOLKIT_HOME or $ASCEND_HOME_PATH where set, else usr/local/Ascend/ascend-toolkit/latest or
  opt/Ascend/ascend-toolkit/latest;
- `npu-smi info`: one device per NPU chip, the version line (the tool's version, and the driver's where
  version.info has none) and the process table;
- for each device id found (the device's minor), `hccn_tool -i N -link -g`, `-net_health -g` and `-ip -g`:
  its on-card RoCE port under `ports[str(N)]`.

Deadlines: each part of the capture gets `timeout_s`: the version files (one probe), `npu-smi info`, then the
hccn_tool reads together (PARALLEL devices side by side, each device's three in turn), so a healthy capture
never runs into a deadline however many chips the node has, and a capture ends within about twice timeout_s.
A command that does not answer has its process group killed; the section then says `timeout` True,
`stalled_at` (the command, e.g. `hccn_tool -i 3 -link -g`) and `reader` (the stuck tool's state letter, D when
the driver holds it), and no command is started after it; what was read is kept and what was not is None with
a reason. The section is `answered` when npu-smi listed the devices; a missing npu-smi, one that hangs, fails
or prints no device row leaves it unanswered with `error` saying which, and so does a table with a chip row
that could not be read (the chips that could are kept, with their ports: a device count that falls short
there is garbage, unknown, never a missing chip). A missing hccn_tool, or one that hangs or prints garbage, is
said in each port's `errors`.
Never raises.

`utilization()` is the sampler's reading: one `npu-smi info` per call, no hccn_tool, no files.
"""

from __future__ import annotations

import os
import time

from .accel import utilization_from_section
from .amdvalues import blank_system
from .ascendparse import parse_npu_smi_info
from .ascendtools import ToolRun, find_tool, run_tool, shown, tool_env
from .deadline import OK, run_probe
from .hccnparse import parse_ip, parse_link, parse_net_health, parse_version_file
from .nvml import GpuUtilization
from .sysfs import Sysfs

NPU_SMI, HCCN_TOOL = "npu-smi", "hccn_tool"
DRIVER_VERSION_FILE = "usr/local/Ascend/driver/version.info"
FIRMWARE_VERSION_FILE = "usr/local/Ascend/firmware/version.info"
TOOLKIT_HOMES = ("usr/local/Ascend/ascend-toolkit/latest", "opt/Ascend/ascend-toolkit/latest")
TOOLKIT_HOME_VARS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
TOOLKIT_INFO = "ascend_toolkit_install.info"
PORT_READS = (("link", "-link"), ("net_health", "-net_health"), ("ip", "-ip"))
PARALLEL = 4  # devices whose hccn_tool reads run side by side: 16 A3 chips' 48 reads take the time of 12


def blank_port() -> dict:
    return {"link": None, "net_health": None, "ip": None, "netmask": None, "errors": {}}


def _last_line(output: str) -> str:
    line = next((s.strip() for s in reversed(output.splitlines()) if s.strip()), "")
    return line[:160] if line.isprintable() else repr(line[:160])


def toolkit_infos(sysfs: Sysfs, environ) -> list[str]:
    """The CANN install files to try, relative to the root: each toolkit home's <arch>-linux/ (this machine's
    architecture first), then the home itself."""
    homes = [environ.get(v) for v in TOOLKIT_HOME_VARS]
    homes = [h.strip("/") for h in homes if isinstance(h, str) and h.startswith("/")] + list(TOOLKIT_HOMES)
    machine = os.uname().machine
    out: list[str] = []
    for home in dict.fromkeys(homes):
        arches = [d for d in sysfs.listdir(home) if d.endswith("-linux")]
        arches.sort(key=lambda d: not d.startswith(machine))
        out += [f"{home}/{d}/{TOOLKIT_INFO}" for d in arches] + [f"{home}/{TOOLKIT_INFO}"]
    return out


def read_versions(root: str, environ) -> dict:
    """The version matrix's file parts (hw/accel.py's `system`): driver, firmware, CANN; why where missing."""
    sysfs = Sysfs(root)
    system = blank_system()
    errors = system["errors"]
    for key, rel in (("driver_version", DRIVER_VERSION_FILE), ("firmware_version", FIRMWARE_VERSION_FILE)):
        content = sysfs.read(rel)
        system[key] = parse_version_file(content) if content is not None else None
        if system[key] is None:
            errors[key] = f"/{rel}: " + ("no Version= line" if content is not None else "not found")
    for rel in toolkit_infos(sysfs, environ):
        content = sysfs.read(rel)
        if content is not None:
            system["cann_version"] = parse_version_file(content)
            if system["cann_version"] is None:
                errors["cann_version"] = f"/{rel}: no version= line"
            break
    else:
        errors["cann_version"] = f"no {TOOLKIT_INFO} (CANN toolkit) found"
    if sysfs.problems:
        errors["files"] = "; ".join(sysfs.problems[:4])
    return system


class _Phase:
    """Commands under one deadline, `timeout_s` from the phase's start, run from one thread or several; the
    first that hangs stops those not started yet (`stalled_at`)."""

    def __init__(self, timeout_s: float, env: dict[str, str], what: str = ""):
        import threading

        self.timeout_s, self.env = timeout_s, env
        self.what = f"the {what}' {timeout_s:g}s" if what else f"{timeout_s:g}s"  # how a report names it
        self.deadline = time.monotonic() + max(0.0, timeout_s)
        self.lock = threading.Lock()
        self.stalled: ToolRun | None = None
        self.stalled_at = ""

    def __call__(self, argv: list[str]) -> ToolRun:
        with self.lock:
            if self.stalled is not None:
                return ToolRun(why=f"not read: `{self.stalled_at}` hung first")
        left = self.deadline - time.monotonic()
        if left <= 0:
            return ToolRun(why=f"not read: {self.what} had passed")
        run = run_tool(argv, left, self.env, self.what)
        if run.timeout:
            with self.lock:
                if self.stalled is None:
                    self.stalled, self.stalled_at = run, shown(argv)
        return run


def _versions(root: str, environ, timeout_s: float) -> dict:
    result = run_probe("ascend-versions", lambda partial: read_versions(root, environ), timeout_s)
    if result.status == OK and isinstance(result.value, dict):
        return result.value
    system = blank_system()
    system["errors"]["versions"] = result.message
    return system


def _read_port(run: _Phase, hccn: str, n: int, port: dict) -> None:
    """Device n's port from its three hccn_tool reads (each unread or unreadable one says why in errors)."""
    for key, option in PORT_READS:
        argv = [hccn, "-i", str(n), option, "-g"]
        done = run(argv)
        if not done.ok:
            port["errors"][key] = done.why
            continue
        if key == "ip":
            port["ip"], port["netmask"], said = parse_ip(done.output)
        else:
            port[key], said = (parse_link if key == "link" else parse_net_health)(done.output)
        if said:
            exited = f"`{shown(argv)}` exited {done.code}: {_last_line(done.output)}"
            port["errors"][key] = exited if done.code != 0 else said


def _read_ports(run: _Phase, hccn: str | None, why: str, ids: list[int]) -> dict:
    """Each device id's port from hccn_tool, PARALLEL devices at a time (or why not, in its errors)."""
    import threading

    ports = {str(n): blank_port() for n in ids}
    if hccn is None:
        for port in ports.values():
            port["errors"][HCCN_TOOL] = why
        return ports
    todo = list(reversed(ids))

    def worker() -> None:
        while True:
            with run.lock:
                if not todo:
                    return
                n = todo.pop()
            _read_port(run, hccn, n, ports[str(n)])

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(min(PARALLEL, len(ids)))]
    for w in workers:
        w.start()
    for w in workers:  # each run returns by the phase's deadline (run_tool abandons a stuck tool)
        w.join(max(0.0, run.deadline - time.monotonic()) + 5.0)
    return ports


def capture(
    root: str = "/", timeout_s: float = 5.0, tools=None, environ=None, node: str | None = None
) -> dict:
    """The `accel` section of this node's Ascend NPUs (see the module docstring). `tools`: the profile's
    accel.tools (name -> absolute path); `environ`: where $STUNE_ACCEL_TOOLS, $PATH and the toolkit home are
    read, and what the tools run with (default os.environ); `node`: the name `%n` stands for."""
    start = time.monotonic()
    environ = os.environ if environ is None else environ
    out: dict = {"answered": False, "vendor": "ascend", "source": NPU_SMI, "elapsed_s": 0.0}
    out.update(system=_versions(root, environ, timeout_s), devices=[], ports={})
    env = tool_env(environ)
    npu_smi, why = find_tool(NPU_SMI, tools, environ, node)
    run = _Phase(timeout_s, env)
    done = run([npu_smi, "info"]) if npu_smi is not None else ToolRun(why=why)
    if done.ok:
        parsed = parse_npu_smi_info(done.output)
        out["devices"] = parsed["devices"]
        system = out["system"]
        system["tool_version"] = parsed["tool_version"]
        if system["driver_version"] is None and parsed["driver_version"] is not None:
            system["driver_version"] = parsed["driver_version"]
            system["errors"].pop("driver_version", None)
        if parsed["errors"]:  # a garbled table: what it lists may fall short; unknown, never a missing chip
            left_out = len(parsed["errors"])
            out["error"] = f"`npu-smi info`: {left_out} chip row(s) left out: {parsed['errors'][0]}"
        elif parsed["devices"]:
            out["answered"] = True
        else:
            said = _last_line(done.output) or "nothing"
            out["error"] = f"`npu-smi info` exited {done.code} and listed no NPU: {said}"
    else:
        out["error"] = done.why
    if out["devices"]:
        ids = sorted({d["minor"] for d in out["devices"] if d["minor"] is not None})
        hccn, why = find_tool(HCCN_TOOL, tools, environ, node)
        run = _Phase(timeout_s, env, "hccn_tool reads")
        out["ports"] = _read_ports(run, hccn, why, ids)
    if run.stalled is not None:
        out.update(stalled_at=run.stalled_at, timeout=True, reader=run.stalled.reader)
    out["elapsed_s"] = round(time.monotonic() - start, 4)
    return out


def utilization(timeout_s: float, tools=None, environ=None, node: str | None = None) -> list[GpuUtilization]:
    """The sampler's reading of each NPU chip, numbered by /dev/davinciN: AICore %, HBM (or memory) use, power
    and the process count, from one `npu-smi info`. No reading (no npu-smi, a hang, garbage) is no devices:
    unmeasured, never idle. Never raises."""
    npu_smi, _ = find_tool(NPU_SMI, tools, environ, node)
    if npu_smi is None:
        return []
    done = run_tool([npu_smi, "info"], timeout_s, tool_env(environ))
    if not done.ok:
        return []
    return utilization_from_section({"devices": parse_npu_smi_info(done.output)["devices"]})
