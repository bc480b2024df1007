"""stune-bind: the task's GPU -> its PCI address -> NUMA node and local CPUs, within Slurm's cpuset."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import hwtrees
import pytest

from slurm_tune.hw.sysfs import Sysfs
from slurm_tune.nodeenv.binding import format_cpus, gpu_pci, plan_binding, task_gpu

BIN = os.path.dirname(sys.executable)
GPUS = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0"]


def two_numa_node(root: Path, cpus=("0", "1"), numa=(0, 0, 1, 1)) -> Sysfs:
    """4 GPUs, the first two on NUMA node 0 (CPU 0), the last two on node 1 (CPU 1): a 2-NUMA layout whose
    CPU lists intersect this 2-CPU machine's, so binding can be seen."""
    hwtrees.numa(root, {0: cpus[0], 1: cpus[1]})
    for address, node in zip(GPUS, numa):
        hwtrees.pci_device(
            root,
            address,
            vendor="0x10de",
            device="0x2330",
            cls="0x030200",
            numa_node=node,
            local_cpulist=cpus[node] if node >= 0 else "",
        )
    return Sysfs(str(root))


def test_the_local_task_picks_its_gpu_from_cuda_visible_devices():
    assert task_gpu({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_LOCALID": "2"}) == (
        "2",
        "local task 2 -> GPU 2",
    )
    assert task_gpu({"CUDA_VISIBLE_DEVICES": "3", "SLURM_LOCALID": "5"})[0] == "3"  # --gpus-per-task=1
    assert task_gpu({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_LOCALID": "3"})[0] == "1"  # more ranks than GPUs
    # ConstrainDevices renumbers CUDA_VISIBLE_DEVICES from 0; SLURM_STEP_GPUS keeps the node's numbers
    assert task_gpu({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "2,3", "SLURM_LOCALID": "1"})[0] == "3"
    assert task_gpu({"SLURM_JOB_GPUS": "1,2", "SLURM_LOCALID": "0"})[0] == "1"
    assert task_gpu({})[0] is None
    assert (
        task_gpu({"CUDA_VISIBLE_DEVICES": "GPU-8f2c1a3e-aaaa", "SLURM_LOCALID": "0"})[0]
        == "GPU-8f2c1a3e-aaaa"
    )


def test_gpu_numbers_map_to_pci_in_bus_order_or_by_device_minor(tmp_path):
    sysfs = two_numa_node(tmp_path)
    assert gpu_pci(sysfs, "2") == ("0000:47:00.0", "")
    assert gpu_pci(sysfs, "9")[0] is None
    # the driver's view wins when present: minor numbers need not follow bus order
    for address, minor in zip(GPUS, (3, 2, 1, 0)):
        hwtrees.put(
            tmp_path,
            f"proc/driver/nvidia/gpus/{address}/information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 171\nDevice Minor: \t {minor}\nBus Location: \t {address}",
        )
    assert gpu_pci(sysfs, "0") == ("0000:4e:00.0", "")
    assert "no NVIDIA device with minor number 7" in gpu_pci(sysfs, "7")[1]


def test_binding_plan_intersects_with_slurms_cpuset(tmp_path):
    sysfs = two_numa_node(tmp_path, cpus=("0-3", "4-7"))
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_LOCALID": "3"}
    plan = plan_binding(env, sysfs, frozenset({2, 3, 4, 5}))
    assert (plan.pci, plan.numa_node, plan.cpus) == ("0000:4e:00.0", 1, frozenset({4, 5}))
    disjoint = plan_binding(env, sysfs, frozenset({0, 1}))
    assert disjoint.cpus is None and "keeping Slurm's" in disjoint.note


def test_unknown_topology_runs_unbound_with_one_note(tmp_path):
    sysfs = two_numa_node(tmp_path, numa=(-1, -1, -1, -1))
    plan = plan_binding({"CUDA_VISIBLE_DEVICES": "0"}, sysfs, frozenset({0, 1}))
    assert plan.cpus is None and "has no NUMA node (numa_node -1" in plan.note


def test_format_cpus():
    assert format_cpus({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8" and format_cpus(set()) == "none"


def run_bind(args, env):
    return subprocess.run([os.path.join(BIN, "stune-bind"), *args], capture_output=True, text=True, env=env)


def allowed_list(text: str) -> str:
    return next(
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Cpus_allowed_list")
    )


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1"
)
@pytest.mark.parametrize("local, cpu", [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")])
def test_stune_bind_execs_the_command_on_its_gpus_numa_cpus(tmp_path, local, cpu):
    sysfs = two_numa_node(tmp_path)
    env = dict(os.environ, STUNE_SYSFS_ROOT=sysfs.root, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID=local)
    out = run_bind(["-v", "grep", "Cpus_allowed_list", "/proc/self/status"], env)
    assert out.returncode == 0, out.stderr
    assert allowed_list(out.stdout) == cpu
    assert f"on NUMA node {int(cpu)}: CPUs {cpu}" in out.stderr


def test_stune_bind_runs_unbound_with_a_note_in_a_vm(tmp_path):
    sysfs = two_numa_node(tmp_path, numa=(-1, -1, -1, -1))
    env = dict(os.environ, STUNE_SYSFS_ROOT=sysfs.root, CUDA_VISIBLE_DEVICES="0", SLURM_LOCALID="0")
    out = run_bind(["grep", "Cpus_allowed_list", "/proc/self/status"], env)
    assert out.returncode == 0 and allowed_list(out.stdout) == format_cpus(os.sched_getaffinity(0))
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "stune-bind: note: GPU 0 (0000:07:00.0) has no NUMA"
    )


def test_memory_is_bound_with_set_mempolicy_when_the_kernel_has_the_node(tmp_path):
    """The command inherits MPOL_BIND to node 0 (this machine's only NUMA node) across exec."""
    sysfs = two_numa_node(tmp_path)
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); mode = ctypes.c_int(); "
        "mask = (ctypes.c_ulong * 16)(); "
        "r = libc.syscall(239, ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64 + 1), None, ctypes.c_ulong(0)); "
        "print(r, mode.value, mask[0])"
    )
    env = dict(
        os.environ,
        STUNE_SYSFS_ROOT=sysfs.root,
        CUDA_VISIBLE_DEVICES="0",
        SLURM_LOCALID="0",
        PATH="/usr/bin:/bin",
    )  # no numactl: the set_mempolicy path
    if os.uname().machine != "x86_64" or set_membind_probe():
        pytest.skip("set_mempolicy is not usable here")
    out = run_bind(["-v", sys.executable, "-c", probe], env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "2", "1"]  # MPOL_BIND, node mask {0}
    assert "memory bound to node 0 (set_mempolicy)" in out.stderr


def set_membind_probe() -> str:
    """'' when this process may call set_mempolicy (tried in a child, so the test process is untouched)."""
    code = "from slurm_tune.nodeenv.binding import set_membind; print(set_membind(0))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()


def test_memory_on_a_node_the_kernel_lacks_is_left_alone_with_a_note(tmp_path):
    sysfs = two_numa_node(tmp_path)
    if 1 in Sysfs("/").numa_nodes():
        pytest.skip("this machine really has NUMA node 1")
    env = dict(os.environ, STUNE_SYSFS_ROOT=sysfs.root, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="2")
    out = run_bind(["true"], env)
    assert out.returncode == 0
    assert out.stderr == "stune-bind: note: memory not bound: the kernel has no NUMA node 1\n"


def test_bind_errors_are_clear():
    out = run_bind([], dict(os.environ))
    assert out.returncode == 2 and "usage" in out.stderr
    out = run_bind(["no-such-command-xyz"], dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 127 and "no-such-command-xyz: command not found" in out.stderr
    assert "Traceback" not in out.stderr


def test_set_membind_reports_failure_instead_of_raising():
    code = "from slurm_tune.nodeenv.binding import set_membind; print(repr(set_membind(63)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "set_mempolicy(MPOL_BIND, node 63)" in out.stdout
    assert ctypes  # the binding module uses ctypes only when it binds


def test_stune_binds_options_are_the_shared_spellings():
    """Hand-parsed (it runs once per rank; argparse measured +10 ms), but --node/--sysfs-root are spelled
    as cli/options.py says; the first word that is not an option starts the command, `--` ends the options."""
    from slurm_tune.cli import bind, options

    assert bind.parse(["--node", "n3", "--sysfs-root=/s", "-v", "python", "-v", "--show"]) == (
        {"node": "n3", "sysfs_root": "/s", "verbose": True},
        ["python", "-v", "--show"],
    )
    assert bind.parse(["--show", "--", "-odd", "x"]) == ({"show": True}, ["-odd", "x"])
    for name in ("node", "sysfs_root"):
        for flag in options.flags(name):
            assert bind.parse([flag, "v", "cmd"])[0] == {name: "v"}
    for bad in (["--nod", "x", "cmd"], ["--node"], ["-p", "x", "cmd"]):
        with pytest.raises(bind.UsageError):
            bind.parse(bad)


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1"
)
def test_stune_bind_reads_the_sysfs_root_and_node_it_is_given(tmp_path):
    """--sysfs-root (with %n from --node) wins over $STUNE_SYSFS_ROOT, as in every stune command."""
    two_numa_node(tmp_path / "n3")
    env = dict(
        os.environ,
        STUNE_SYSFS_ROOT=str(tmp_path / "nowhere"),
        CUDA_VISIBLE_DEVICES="0,1,2,3",
        SLURM_LOCALID="2",
        SLURMD_NODENAME="n1",
    )
    out = run_bind(["--node", "n3", "--sysfs-root", str(tmp_path / "%n"), "--show"], env)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert "stune-bind: GPU 2 (0000:47:00.0) on NUMA node 1: CPUs 1 (Slurm gave " in out.stderr
    bad = run_bind(["--bogus", "true"], env)
    assert bad.returncode == 2 and bad.stderr.startswith("stune-bind: unknown option '--bogus'\nusage:")
