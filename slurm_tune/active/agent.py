"""What runs inside a sweep job, on the job's first node: the check's tool, `runs` times, each under its own
deadline, parsed; one `STUNE-ACTIVE {json}` line per run on stdout, which the sweep reads back from the job's
output file. A missing tool is reported as `unavailable` with what to install, never as a failure.

The spec comes from the sweep on the command line (JSON), so the node needs no profile.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import subprocess
import time

from .. import safeio
from ..accelspec import AMD, ASCEND
from ..hw.sysfs import resolve_root
from ..output import compact_json
from . import parse_io
from .checks import CATALOGUE, DD_FALLBACK, DD_PREPARE, tool_path

MARK = "STUNE-ACTIVE "
OUTPUT_LIMIT = 8 << 20
CONNECT_MARKERS = ("Connection refused", "Couldn't connect", "unable to connect", "Unable to init")


def fingerprint(environ=None, vendor: str = "nvidia") -> dict:
    """The node's version fingerprint, read under the relocatable root (STUNE_SYSFS_ROOT, %n = node). On an
    AMD or Ascend partition's node (`vendor`) it also names the vendor and that vendor's versions (store.py's
    VENDOR_PARTS); an NVIDIA fingerprint keeps its five parts."""
    root = resolve_root(None, os.environ if environ is None else environ)
    read = _reader(root)
    kernel = read("proc/sys/kernel/osrelease") or (os.uname().release if root in ("", "/") else "")
    driver = ""
    words = read("proc/driver/nvidia/version").split()
    if "Module" in words and words.index("Module") + 1 < len(
        words
    ):  # "... Kernel Module  535.161.08  Release..."
        driver = words[words.index("Module") + 1]
    fws = sorted(
        {
            read(os.path.relpath(p, root))
            for p in glob.glob(os.path.join(root, "sys/class/infiniband/*/fw_ver"))
        }
        - {""}
    )
    fp = {
        "driver": driver[:40],
        "cuda": "",
        "nccl": "",
        "hca_fw": ",".join(fws)[:120],
        "kernel": kernel[:80],
    }
    if vendor == ASCEND:
        installs = sorted(glob.glob(os.path.join(root, ASCEND_TOOLKIT_INFO)))
        fp.update(
            vendor=ASCEND,
            npu_driver=_info_version(read(ASCEND_DRIVER_INFO)),
            npu_firmware=_info_version(read(ASCEND_FIRMWARE_INFO)),
            cann=_info_version(read(os.path.relpath(installs[0], root))) if installs else "",
        )
    elif vendor == AMD:
        fp.update(vendor=AMD, rocm=read(ROCM_VERSION)[:40], amdgpu_driver=read(AMDGPU_VERSION)[:40])
    return fp


# Where the vendors' versions are, under the node's root (the Ascend files: `Version=24.1.rc2`, CANN's
# install file `version=8.0.RC2`; ROCm's `6.2.0-66`; the amdgpu module's version where it is a DKMS build).
ASCEND_DRIVER_INFO = "usr/local/Ascend/driver/version.info"
ASCEND_FIRMWARE_INFO = "usr/local/Ascend/firmware/version.info"
ASCEND_TOOLKIT_INFO = "usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info"
ROCM_VERSION = "opt/rocm/.info/version"
AMDGPU_VERSION = "sys/module/amdgpu/version"


def _reader(root: str):
    def read(rel: str) -> str:
        try:
            fd = safeio.open_file(os.path.join(root, rel), single_link=False)
        except (OSError, safeio.UnsafePathError):
            return ""
        try:
            data = safeio.read_bounded(fd, 4096) or b""
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace").strip()

    return read


def _info_version(text: str) -> str:
    """The `Version=` (or `version=`) value of an Ascend version.info or ascend_toolkit_install.info."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version":
            return value.strip()[:40]
    return ""


def run_bounded(argv: list[str], timeout: float, env: dict) -> tuple[bytes, int | None]:
    """(stdout+stderr, exit code or None on timeout). The whole process group is killed at the deadline."""
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return f"cannot start {argv[0]}: {exc.strerror}".encode(), 127
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
        return out[:OUTPUT_LIMIT], proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        return out[:OUTPUT_LIMIT], None


def _argv(template: str, tool_path: str, tool: str, values: dict) -> list[str]:
    argv = [a.format(**values) for a in shlex.split(template)]
    return [tool_path if a == tool else a for a in argv]


def run_spec(spec: dict, emit=print, environ=None) -> int:
    environ = dict(os.environ if environ is None else environ)
    check = CATALOGUE[spec["check"]]
    fp = fingerprint(environ, spec.get("accelerator") or "nvidia")
    env = dict(environ, **check.env)
    base = {
        "at": 0.0,
        "sweep": spec.get("sweep", ""),
        "partition": spec.get("partition", ""),
        "check": check.name,
        "subject": spec["subject"],
        "nodes": spec["nodes"],
        "hca": spec.get("hca"),
        "job": environ.get("SLURM_JOB_ID", ""),
        "unit": check.unit,
    }
    tool, template = check.tool, spec.get("command") or check.command
    path = tool_path(spec.get("tools") or {}, tool)
    prepare = None
    if check.name == "disk_read":
        directory = spec.get("path") or ""
        file = os.path.join(directory, f".stune-active-read.{environ.get('SLURM_JOB_ID', os.getpid())}")
        size = int(spec.get("size") or (1 << 30))
        values = {"file": file, "path": directory, "size": str(size), "count": str(max(1, size >> 20))}
        if path is None:  # fio absent: dd with direct I/O
            tool, template, path = "dd", DD_FALLBACK, shutil.which("dd")
            check = check._replace(parser=parse_io.dd)
        if not directory or not os.path.isdir(directory):
            return _emit_all(
                emit, spec, base, fp, "unknown", f"disk check directory {directory!r} does not exist"
            )
        try:  # created here, exclusively, so nothing planted under that name is read or written through
            os.close(safeio.create_exclusive(file))
        except OSError as exc:
            return _emit_all(emit, spec, base, fp, "unknown", f"cannot create {file}: {exc.strerror}")
        if tool == "dd" and path is not None:  # no dd either: said below, before anything runs
            prepare = _argv(DD_PREPARE, path, "dd", values)
    else:
        values = {
            "gpus": str(spec.get("gpus") or 1),
            "nodes": str(len(spec.get("nodes") or ()) or 1),  # the scaling curve's multi-node command
            "ranks": str((spec.get("gpus") or 1) * (len(spec.get("nodes") or ()) or 1)),
            "server": spec.get("server_addr", ""),
            "tcp_port": str(spec.get("tcp_port") or 18515),
            "size": "",
            "file": "",
            "path": "",
        }
    if path is None:
        configured_at = (spec.get("tools") or {}).get(tool)
        where = (
            f"{configured_at} (active.tools.{tool}) is not an executable file"
            if configured_at
            else f"{tool} not found"
        )
        return _emit_all(emit, spec, base, fp, "unavailable", f"{where}: install {check.install}")
    try:
        if prepare:
            run_bounded(prepare, spec["run_timeout"], env)
        for subject, hca in targets(spec):
            device, _, port = (hca or ":1").partition(":")
            for run, point in _runs(spec):
                args = dict(values, hca=device, port=port or "1")
                if point is not None:  # a point of the single-node scaling curve: this many devices
                    args.update(gpus=str(point), ranks=str(point))
                started = time.time()
                if check.server:
                    out = _server_client(spec, check, path, args, env)
                else:
                    out, code = run_bounded(_argv(template, path, tool, args), spec["run_timeout"], env)
                    if code is None:
                        out += b"\n(stune: killed at the run's deadline)\n"
                reading = check.parser(out)
                rfp = dict(
                    fp,
                    nccl=str(reading.extra.get("nccl", ""))[:20],
                    cuda=str(reading.extra.get("cuda", ""))[:20],
                )
                if not rfp["driver"] and reading.extra.get("driver"):
                    rfp["driver"] = str(reading.extra["driver"])[:40]
                if rfp.get("vendor") == AMD and not rfp["rocm"] and reading.extra.get("rocm"):
                    rfp["rocm"] = str(reading.extra["rocm"])[:40]  # RCCL's banner, where no file says
                emit(
                    MARK
                    + compact_json(
                        dict(
                            base,
                            subject=subject,
                            hca=hca,
                            at=round(started, 3),
                            run=run,
                            status=reading.status,
                            value=reading.value,
                            detail=reading.detail,
                            fingerprint=rfp,
                            tool=tool,
                            **_scaling_fields(spec, point, reading.extra),
                        )
                    )
                )
    finally:
        if check.name == "disk_read":
            try:
                os.unlink(values["file"])
            except OSError:
                pass
    return 0


def _runs(spec: dict) -> list[tuple[int, int | None]]:
    """(run, devices): `runs` runs of the spec's command, or one run per point of the scaling curve's
    `points` (device counts, each filling {gpus} in turn)."""
    points = spec.get("points")
    if points:
        return [(i, int(p)) for i, p in enumerate(points)]
    return [(run, None) for run in range(spec.get("runs", 1))]


def _scaling_fields(spec: dict, point: int | None, extra: dict) -> dict:
    """A scaling job's result also says its point and what the tool printed besides the result: the algbw
    (a 1-device run's only figure) and the ranks it saw."""
    if not spec.get("scaling"):
        return {}
    out: dict = {"point": point if point is not None else len(spec.get("nodes") or ())}
    for key in ("algbw", "ranks"):
        if isinstance(extra.get(key), (int, float)):
            out[key] = extra[key]
    return out


def targets(spec: dict) -> list[tuple[str, str | None]]:
    """(subject, hca) measured by one job: a per-HCA check measures each HCA port in turn, as `a+b/mlx5_0`."""
    hcas = spec.get("hcas") or [spec.get("hca")]
    return [(f"{spec['subject']}/{h.split(':')[0]}" if h else spec["subject"], h) for h in hcas]


def _emit_all(emit, spec, base, fp, status, detail) -> int:
    for subject, hca in targets(spec):
        for run, point in _runs(spec):
            emit(
                MARK
                + compact_json(
                    dict(
                        base,
                        subject=subject,
                        hca=hca,
                        at=round(time.time(), 3),
                        run=run,
                        status=status,
                        value=None,
                        detail=detail,
                        fingerprint=fp,
                        **_scaling_fields(spec, point, {}),
                    )
                )
            )
    return 0


def _server_client(spec, check, path, values, env) -> bytes:
    """The server on the first node, the client on the second, both as job steps; the client retries while
    the server is not listening yet."""
    a, b = spec["nodes"][:2]
    step = ["srun", "--overlap", "-N1", "-n1", "-w"]
    deadline = time.monotonic() + spec["run_timeout"]
    server = subprocess.Popen(
        [*step, a, *_argv(check.server, path, check.tool, values)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        out = b""
        while time.monotonic() < deadline:
            out, _code = run_bounded(
                [*step, b, *_argv(check.client, path, check.tool, values)], deadline - time.monotonic(), env
            )
            if not any(m.encode() in out for m in CONNECT_MARKERS):  # iperf3 -J exits 0 even when refused
                return out
            time.sleep(0.5)
        return out
    finally:
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
