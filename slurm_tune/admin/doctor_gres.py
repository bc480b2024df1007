"""`stune-admin doctor`'s gres.conf check for AMD and Ascend partitions (issue 26): the partition's GRES (gpu.gres,
else gpu on AMD and npu on Ascend: accelspec.gres_name) is in slurm.conf's GresTypes, and gres.conf, beside
slurm.conf, gives each node as many device files of the vendor's kind as its capture found, at the devices'
own numbers: /dev/davinciN for Ascend NPUs, /dev/dri/renderD<128+N> for AMD GPUs (/dev/nvidiaN is NVIDIA's).
Slurm numbers a job's devices by those files, and cgroup confinement opens only them: a file of the wrong kind
or number gives jobs someone else's device or none.

gres.conf is read as slurm.conf is (slurmfile's Key=Value records, `#` comments): `NodeName=` host lists
(lines without one apply to every node), `Name=`, `File=` with ranges and lists (`/dev/davinci[0-7]`,
expanded by hostlist.py), `MultipleFiles=`, `AutoDetect=` (a `Count=` alone names no files). The names Slurm takes in either case are
matched without case. A part of Doctor (doctor.py), which supplies `add`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import NamedTuple

from ..accelspec import AMD, ASCEND, NVIDIA, gres_name
from ..hostlist import compress_hostlist, expand_hostlist
from ..slurmfile import _record
from .findings import ERROR, OK

# A device file's kind and number from its name: (vendor, pattern, offset of the number, what it looks like)
KINDS = (
    (ASCEND, re.compile(r"davinci([0-9]{1,5})\Z"), 0, "/dev/davinciN"),
    (AMD, re.compile(r"renderD([0-9]{1,5})\Z"), 128, "/dev/dri/renderD<128+N>"),
    (NVIDIA, re.compile(r"nvidia([0-9]{1,5})\Z"), 0, "/dev/nvidiaN"),
)
SHAPE = {vendor: shape for vendor, _, _, shape in KINDS}
NOUN = {ASCEND: "Ascend NPU", AMD: "AMD GPU", NVIDIA: "NVIDIA GPU"}
DEFAULT_DIR = {ASCEND: "/dev", AMD: "/dev/dri", NVIDIA: "/dev"}
AUTODETECT = {AMD: "rsmi", NVIDIA: "nvml"}  # Slurm finds these itself; it has no Ascend autodetection


class GresLine(NamedTuple):
    nodes: tuple[str, ...] | None  # None: every node
    name: str
    files: tuple[str, ...]
    autodetect: str
    where: str


def read_gres_conf(path: str) -> tuple[list[GresLine], str]:
    """gres.conf's lines, and '' or why it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4 << 20)
    except OSError as exc:
        return [], f"{path}: {exc.strerror}"
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        rec = {k.lower(): v for k, v in _record(line).items()}
        files = [*expand_hostlist(rec.get("file", "")), *expand_hostlist(rec.get("multiplefiles", ""))]
        out.append(
            GresLine(
                tuple(expand_hostlist(rec["nodename"])) if rec.get("nodename") else None,
                rec.get("name", "").lower(),
                tuple(files),
                rec.get("autodetect", "").lower(),
                f"{path}:{number}",
            )
        )
    return out, ""


def file_kind(path: str) -> tuple[str, int] | None:
    """(vendor, device number) of a device file by its name: davinci3 -> (ascend, 3), renderD129 -> (amd, 1)."""
    base = os.path.basename(path)
    for vendor, pattern, offset, _ in KINDS:
        m = pattern.match(base)
        if m and int(m.group(1)) >= offset:
            return vendor, int(m.group(1)) - offset
    return None


def device_files(vendor: str, numbers, directory: str | None = None) -> str:
    """The files of devices `numbers` in gres.conf's form: /dev/davinci[0-7], /dev/dri/renderD[128-135]."""
    stem = {ASCEND: "davinci", AMD: "renderD", NVIDIA: "nvidia"}[vendor]
    offset = 128 if vendor == AMD else 0
    base = os.path.join(directory or DEFAULT_DIR[vendor], stem)
    return compress_hostlist([f"{base}{n + offset}" for n in sorted(numbers)])


def gres_count(gres: str, name: str) -> int:
    """The count of GRES `name` in a node's Gres: npu:8, gpu:mi300x:8(S:0-1), gpu:4,npu:4."""
    total = 0
    for part in gres.split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == name and len(fields) > 1 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def minors(devices: list[dict]) -> list[int] | None:
    """The device numbers (hw/accel.py's `minor`) of the devices found; None when one has none."""
    out = [d.get("minor") for d in devices]
    ok = all(isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in out)
    return sorted(m for m in out if isinstance(m, int)) if ok else None


class GresChecks:
    add: Callable[..., None]

    def check_gres_conf(self, part: str, profile, members, conf, found: dict[str, list[dict]]) -> None:
        """`found`: node -> the devices of the profile's vendor its capture found."""
        vendor, gres = profile.accelerator, gres_name(profile)
        names = [n.name for n in members]
        if conf.found:
            types = [t.strip().lower() for t in conf.get("GresTypes").split(",") if t.strip()]
            if gres not in types:
                self.add(
                    ERROR,
                    "slurm.conf GresTypes",
                    f"{conf.get('GresTypes') or '(not set)'} at {conf.where('GresTypes')} lacks {gres}: the "
                    f"{gres} GRES of partition {part}'s nodes is not schedulable",
                    f"GresTypes={','.join([*types, gres])}",
                )
        path = os.path.join(os.path.dirname(conf.path), "gres.conf")
        lines, problem = read_gres_conf(path)
        subject = f"gres.conf {part}"
        example = f"NodeName={compress_hostlist(names)} Name={gres} File={device_files(vendor, range(profile.gpu.count))}"
        if problem:
            self.add(
                ERROR,
                subject,
                f"cannot read {problem}: Slurm has no {gres} device files to give jobs on {compress_hostlist(names)}",
                f"write {path}: {example}",
            )
            return
        said: dict[tuple[str, str, str], list[str]] = {}
        for node in members:
            for finding in _node_problems(node, vendor, gres, lines, found.get(node.name), path):
                said.setdefault(finding, []).append(node.name)
        for (level, text, fix), nodes in sorted(said.items()):
            hosts = compress_hostlist(nodes)
            self.add(level, subject, f"{hosts}: {text}", fix.replace("NodeName=*", f"NodeName={hosts}"))


def _node_problems(node, vendor: str, gres: str, lines: list[GresLine], devices, path: str) -> list[tuple]:
    """(level, text, fix) for one node's gres.conf lines; `NodeName=*` in a fix stands for the nodes."""
    mine = [g for g in lines if g.nodes is None or node.name in g.nodes]
    named = [g for g in mine if g.name == gres]
    autodetect = next((g.autodetect for g in reversed(mine) if g.autodetect), "")
    want = minors(devices) if devices is not None else None
    files = [f for g in named for f in g.files]
    at = next((os.path.dirname(f) for f in files if (file_kind(f) or ("",))[0] == vendor), None)
    numbers_wanted = (
        want if want is not None else range(len(devices) if devices else gres_count(node.gres, gres))
    )
    fix_files = device_files(vendor, numbers_wanted, at)
    fix = f"in {path}: NodeName=* Name={gres} File={fix_files}"
    if not named:
        if autodetect and autodetect == AUTODETECT.get(vendor):
            return [(OK, f"AutoDetect={autodetect}: Slurm finds the {NOUN[vendor]}s itself", "")]
        return [(ERROR, f"no Name={gres} line in {path}: jobs get no {NOUN[vendor]} device files", fix)]
    where = ",".join(g.where.rpartition(":")[2] for g in named)
    if not files:
        return [
            (
                ERROR,
                f"Name={gres} without File= ({path}:{where}): Slurm can neither confine nor number the "
                f"{NOUN[vendor]}s",
                fix,
            )
        ]
    out = []
    kinds = [file_kind(f) for f in files]
    wrong = [f for f, k in zip(files, kinds) if k is None or k[0] != vendor]
    if wrong:
        out.append(
            (
                ERROR,
                f"Name={gres} is {compress_hostlist(wrong)} ({path}:{where}): {NOUN[vendor]} device files are "
                f"{SHAPE[vendor]}",
                fix,
            )
        )
    declared = gres_count(node.gres, gres)
    if declared and declared != len(files):
        out.append(
            (
                ERROR,
                f"{len(files)} Name={gres} file(s) in gres.conf, Gres={gres}:{declared} in slurm.conf: Slurm "
                "drains a node whose devices fall short of its Gres= count",
                f"make gres.conf and slurm.conf's NodeName Gres= agree ({fix})",
            )
        )
    if devices is not None and not wrong:
        numbers = sorted(k[1] for k in kinds if k is not None)
        if (want is not None and numbers != want) or len(numbers) != len(devices):
            have = device_files(vendor, want, at) if want is not None else f"{len(devices)} device(s)"
            out.append(
                (
                    ERROR,
                    f"gres.conf gives {compress_hostlist(files)}, the capture found {len(devices)} "
                    f"{NOUN[vendor]}(s) at {have}",
                    fix,
                )
            )
    if not out:
        found = ", as the capture found" if devices is not None else " (no capture to compare with)"
        out.append((OK, f"Name={gres} File={compress_hostlist(files)}{found}", ""))
    return out
