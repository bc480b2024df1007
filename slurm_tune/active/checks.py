"""The catalogue of active checks: what each runs, how its output is read, what to install when it is missing.

A check is for the partitions of some accelerator vendors (`vendors`, the profile's `accelerator`: NVIDIA's
nccl-tests, nvbandwidth and DCGM; AMD's rccl-tests; Huawei Ascend's HCCL Test) or for any (the network and
disk checks). A check configured for a partition of another vendor is not run: `skipped` says why.

A check is `node` (one job per node) or `pair` (one two-node job per pair). A pair check is `server_client`
(the tool's server on the first node, its client on the second, e.g. ib_write_bw, iperf3) or `spanning`
(one command whose own launcher spans both nodes, e.g. `srun ... all_reduce_perf`). Commands are templates:
{gpus} GPUs per node, {hca} and {port} an HCA port of the profile, {server} the server node's address,
{tcp_port} a port for the test's control connection, {path} the disk check's directory, {file} its file. `{gpus}` is the partition's gpu.count (NPUs on Ascend).
The profile (`active.checks.<name>.command`, `active.tools.<tool>`) replaces any of them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import namedtuple

from ..accelspec import AMD, ASCEND, NVIDIA, VENDORS
from ..frozen import Frozen
from . import parse, parse_accel, parse_io

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

NODE, PAIR = "node", "pair"


class Check(
    namedtuple("Check", "name kind tool command server client parser metric unit install env gpus vendors")
):
    """gpus: the job must be given the node's devices (--gres=<gpu.gres>:N): with cgroup device confinement a
    job without them sees none. vendors: the accelerators whose partitions run it."""

    __slots__ = ()


GPU_CHECKS = (
    "nccl_allreduce",
    "nvbandwidth",
    "dcgm_diag",
    "nccl_pair",
    "numeric",
    "hccl_allreduce",
    "rccl_allreduce",
)
VENDOR_CHECKS = {
    "nccl_allreduce": (NVIDIA,),
    "nvbandwidth": (NVIDIA,),
    "dcgm_diag": (NVIDIA,),
    "nccl_pair": (NVIDIA,),
    "numeric": (NVIDIA, AMD),  # PyTorch's and CuPy's ROCm builds answer through the same cuda API
    "hccl_allreduce": (ASCEND,),
    "rccl_allreduce": (AMD,),
}
# Where a partition of a vendor finds its own all-reduce check (what `skipped` suggests instead).
ALLREDUCE = {NVIDIA: "nccl_allreduce", AMD: "rccl_allreduce", ASCEND: "hccl_allreduce"}


def _check(name, kind, tool, command, parser, metric, unit, install, server="", client="", env=None):
    return Check(
        name,
        kind,
        tool,
        command,
        server,
        client,
        parser,
        metric,
        unit,
        install,
        env or {},
        name in GPU_CHECKS,
        VENDOR_CHECKS.get(name, VENDORS),
    )


CATALOGUE = {
    c.name: c
    for c in (
        _check(
            "nccl_allreduce",
            NODE,
            "all_reduce_perf",
            "all_reduce_perf -b 1G -e 8G -f 2 -g {gpus}",
            parse.nccl_tests,
            "bus bandwidth",
            "GB/s",
            "nccl-tests (build https://github.com/NVIDIA/nccl-tests; set active.tools.all_reduce_perf)",
        ),
        _check(
            "nvbandwidth",
            NODE,
            "nvbandwidth",
            "nvbandwidth -t host_to_device_memcpy_ce",
            parse.nvbandwidth,
            "host-to-device bandwidth",
            "GB/s",
            "nvbandwidth (build https://github.com/NVIDIA/nvbandwidth; set active.tools.nvbandwidth)",
        ),
        _check(
            "dcgm_diag",
            NODE,
            "dcgmi",
            "dcgmi diag -r 1",
            parse.dcgmi_diag,
            "diagnostics",
            "",
            "DCGM (the datacenter-gpu-manager package, with nv-hostengine running)",
        ),
        _check(
            "disk_read",
            NODE,
            "fio",
            "fio --name=stune-read --filename={file} --rw=read --bs=1M --size={size} "
            "--direct=1 --ioengine=psync --output-format=json",
            parse_io.fio_json,
            "cache-disk read",
            "GB/s",
            "fio (apt-get install fio); without it dd with direct I/O is used",
        ),
        _check(
            "ib_write_bw",
            PAIR,
            "ib_write_bw",
            "",
            parse_io.perftest_bw,
            "RDMA write bandwidth",
            "Gb/s",
            "perftest (apt-get install perftest)",
            server="ib_write_bw -d {hca} -i {port} -D 5 --report_gbits -p {tcp_port}",
            client="ib_write_bw -d {hca} -i {port} -D 5 --report_gbits -p {tcp_port} {server}",
        ),
        _check(
            "nccl_pair",
            PAIR,
            "all_reduce_perf",
            "srun --overlap --ntasks-per-node={gpus} all_reduce_perf -b 1G -e 8G -f 2 -g 1",
            parse.nccl_tests,
            "2-node bus bandwidth (ring)",
            "GB/s",
            "nccl-tests built with MPI (https://github.com/NVIDIA/nccl-tests)",
            env={"NCCL_ALGO": "Ring"},
        ),
        _check(
            "numeric",
            NODE,
            "python",
            "python -m slurm_tune.active.numeric --size 4096",
            parse.numeric,
            "numeric consistency",
            "",
            "PyTorch or CuPy for the Python running stune (set active.tools.python to one that has them)",
        ),
        _check(
            "hccl_allreduce",
            NODE,
            "all_reduce_test",
            "mpirun -n {gpus} all_reduce_test -b 8K -e 1G -f 2 -d fp32 -o sum -p {gpus}",
            parse_accel.hccl_test,
            "HCCL all-reduce algorithm bandwidth",
            "GB/s",
            "HCCL Test (the CANN toolkit's tools/hccl_test, built with MPI: make MPI_HOME=... "
            "ASCEND_DIR=...; set active.tools.all_reduce_test to its bin/all_reduce_test) and mpirun",
            # the sweep's jobs run as root: Open MPI refuses root without these (MPICH ignores them)
            env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
        ),
        _check(
            "rccl_allreduce",
            NODE,
            "all_reduce_perf",
            "all_reduce_perf -b 1G -e 8G -f 2 -g {gpus}",
            parse.nccl_tests,
            "RCCL all-reduce bus bandwidth",
            "GB/s",
            "rccl-tests (build https://github.com/ROCm/rccl-tests; set active.tools.all_reduce_perf)",
            env={"NCCL_DEBUG": "VERSION"},  # RCCL's version line: the fingerprint's nccl
        ),
        _check(
            "iperf3",
            PAIR,
            "iperf3",
            "",
            parse_io.iperf3_json,
            "TCP bandwidth",
            "Gb/s",
            "iperf3 (apt-get install iperf3)",
            server="iperf3 -s -1 -p {tcp_port} -J",
            client="iperf3 -c {server} -p {tcp_port} -J -t 5",
        ),
    )
}
DD_FALLBACK = "dd if={file} of=/dev/null bs=1M iflag=direct"
DD_PREPARE = "dd if=/dev/zero of={file} bs=1M count={count} oflag=direct conv=fsync"


def configured(profile: Profile) -> list[tuple[Check, Frozen]]:
    """The checks the partition's profile asks for and its accelerator runs, in catalogue order, with their
    settings."""
    chosen = profile.active.checks
    return [
        (CATALOGUE[name], chosen[name])
        for name in CATALOGUE
        if name in chosen and profile.accelerator in CATALOGUE[name].vendors
    ]


def skipped(profile: Profile) -> list[tuple[Check, str]]:
    """The checks the profile asks for that are another vendor's, each with why it is not run."""
    chosen = profile.active.checks
    return [
        (c, wrong_vendor(c, profile.accelerator))
        for name, c in CATALOGUE.items()
        if name in chosen and profile.accelerator not in c.vendors
    ]


def wrong_vendor(check: Check, vendor: str) -> str:
    own = ALLREDUCE.get(vendor, "")
    instead = f" ({own} is its all-reduce check)" if own and own != check.name else ""
    return (
        f"{check.name} is for {'/'.join(check.vendors)} partitions; this partition's accelerator is "
        f"{vendor}: not run{instead}"
    )


def tool_path(tools: dict, name: str) -> str | None:
    """Where the tool `name` is on this machine, or None: the profile's `active.tools.<name>` if that is an
    executable file (a missing or non-executable path is not found, never a silent fall back to $PATH),
    else $PATH; `python` (the numeric check) is this interpreter, which can import slurm_tune. One rule for
    the agent, which runs the tool, and for `stune-sweep checks`, which says whether it is here."""
    path = (tools or {}).get(name)
    if path:
        found = path if os.sep in path else shutil.which(path)
        return found if found and os.path.isfile(found) and os.access(found, os.X_OK) else None
    if name == "python":
        return sys.executable
    return shutil.which(name)
