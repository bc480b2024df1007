"""stune-sbatch, stune-task-prolog and stune-bind on the real local cluster: the acceptance list of issue 4.

Each node gets a sysfs fixture under its node directory (the devcluster's stand-in for the node's own disk):
a RoCE node whose every HCA has the issue's GID table (1 = RoCE v1, 2 = RoCE v2 on fe80::, 3 = RoCE v2 on
::ffff:10.0.0.x bound to the fabric netdev), and a 2-NUMA GPU layout (GPUs 0-1 on CPU 0, GPUs 2-3 on CPU 1)
for stune-bind. The TaskProlog is installed the way a site would: a wrapper script that sets PATH and STUNE_*
and execs stune-task-prolog.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import hwtrees
import pytest
from helpers import wait_for_state, wait_until

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)
REPO = Path(__file__).resolve().parent.parent
SYSFS = "sysfs-sbatch"
ROCE_HCAS = "=" + ",".join(f"mlx5_{i}:1" for i in range(8))


def issue_table(dev: str, ip: str):
    ll = hwtrees.link_local_gid(0x0A5C2FFFFE3B0000)
    v4 = hwtrees.ipv4_mapped_gid(ip)
    return [(ll, "IB/RoCE v1", dev), (v4, "IB/RoCE v1", dev), (ll, "RoCE v2", dev), (v4, "RoCE v2", dev)]


@pytest.fixture(scope="module")
def taskprolog(cluster):
    """Per-node sysfs fixtures, and TaskProlog= pointing at a site-style wrapper for the module's tests."""
    from stune_dev.devcluster import NODES

    for k, node in enumerate(NODES):
        root = cluster.layout.node_dir(node) / SYSFS
        overrides = {f"mlx5_{i}": {"gids": issue_table(f"eth{i + 1}", f"10.0.{k}.{5 + i}")} for i in range(8)}
        hwtrees.h100_roce(root, hca_overrides=overrides)
        # the 2-NUMA layout stune-bind reads: GPUs 0-1 on NUMA 0 (CPU 0), 2-3 on NUMA 1 (CPU 1)
        hwtrees.numa(root, {0: "0", 1: "1"})
        for g, address in enumerate(hwtrees.DGX_GPU_PCI[:4]):
            hwtrees.pci_device(
                root,
                address,
                vendor="0x10de",
                device="0x2330",
                cls="0x030200",
                numa_node=g // 2,
                local_cpulist=str(g // 2),
            )
        for extra in hwtrees.DGX_GPU_PCI[4:]:  # this node has 4 GPUs
            subprocess.run(["rm", "-rf", str(root / "sys/bus/pci/devices" / extra)], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(cluster.layout.node_dir(node))], check=True)
    wrapper = cluster.layout.root / "stune-task-prolog-wrapper.sh"
    wrapper.write_text(
        "#!/bin/sh\n# Slurm runs the TaskProlog with the job's environment: set what stune needs explicitly.\n"
        f"PATH={BIN}:/usr/bin:/bin; export PATH\n"
        f"STUNE_PARTITIONS={os.environ['STUNE_PARTITIONS']}; export STUNE_PARTITIONS\n"
        f"STUNE_SYSFS_ROOT={cluster.layout.root}/nodes/%n/{SYSFS}; export STUNE_SYSFS_ROOT\n"
        "exec stune-task-prolog\n"
    )
    wrapper.chmod(0o755)
    cluster.set_fragment("sbatch", f"TaskProlog={wrapper}")
    yield cluster
    cluster.set_fragment("sbatch", None)


@pytest.fixture
def env(tmp_path, slurm):
    e = dict(os.environ, STUNE_HISTORY=str(tmp_path / "history.jsonl"))
    for name in [n for n in e if n.startswith(("NCCL_", "SBATCH_", "STUNE_STAGE", "STUNE_MANAGED"))]:
        del e[name]
    yield e
    # Cancel this test's jobs (held ones included) before the shared teardown waits for an empty queue.
    for state in ("PENDING", "RUNNING", "SUSPENDED"):
        slurm.run(["scancel", f"--state={state}", "-u", pwd.getpwuid(os.getuid()).pw_name], check=False)


def stune_sbatch(args, env, stdin=None):
    return subprocess.run(
        [os.path.join(BIN, "stune-sbatch"), *args], capture_output=True, text=True, env=env, input=stdin
    )


def submit(args, env, stdin=None) -> int:
    out = stune_sbatch(["--parsable", *args], env, stdin)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"\d+\n", out.stdout), out.stdout
    return int(out.stdout)


def finished_output(slurm, job_id: int, path: Path) -> str:
    wait_for_state(slurm, job_id, ("COMPLETED",), timeout=60)
    return wait_until(f"{path} written", lambda: path.exists() and path.read_text(), timeout=10)


REPORT = 'echo "HCA=$NCCL_IB_HCA GID=$NCCL_IB_GID_INDEX IF=$NCCL_SOCKET_IFNAME TO=$NCCL_IB_TIMEOUT"'


def test_roce_job_sees_the_profiles_hcas_and_the_gid_index_detected_on_its_node(
    taskprolog, slurm, env, shared_tmp
):
    job = submit(["-p", "roce", "-o", "out-%j.txt", "--wrap", REPORT], env)
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    assert f"HCA={ROCE_HCAS} GID=3 IF=eth0 TO=22" in out


def test_the_users_own_nccl_ib_hca_is_kept(taskprolog, slurm, env, shared_tmp):
    env["NCCL_IB_HCA"] = "=mlx5_6:1"
    job = submit(["-p", "roce", "-o", "out-%j.txt", "--wrap", REPORT], env)
    assert "HCA==mlx5_6:1 GID=3" in finished_output(slurm, job, shared_tmp / f"out-{job}.txt")


def test_export_none_still_carries_stunes_settings(taskprolog, slurm, env, shared_tmp):
    env["UNRELATED"] = "x"
    job = submit(
        ["-p", "roce", "--export=NONE", "-o", "out-%j.txt", "--wrap", REPORT + '; echo "U=$UNRELATED"'], env
    )
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    assert f"HCA={ROCE_HCAS} GID=3" in out and "U=\n" in out


def test_sbatch_partition_directive_is_honoured_from_a_stdin_script(taskprolog, slurm, env, shared_tmp):
    script = (
        "#!/bin/sh\n#SBATCH --partition=vpc\n#SBATCH -o out-%j.txt\n"
        'echo "DISABLE=$NCCL_IB_DISABLE IF=$NCCL_SOCKET_IFNAME P=$SLURM_JOB_PARTITION ARGS=$*"\n'
    )
    job = submit([], env, stdin=script)
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    # these nodes (RoCE fixtures) have no ens5: stune's NCCL_SOCKET_IFNAME is unset, and that is said
    assert "DISABLE=1 IF= P=vpc ARGS=" in out
    assert "NCCL_SOCKET_IFNAME unset: socket interface ens5 does not exist on this node" in out


def test_a_script_file_gets_its_arguments(taskprolog, slurm, env, shared_tmp):
    script = shared_tmp / "job.sh"
    script.write_text('#!/bin/sh\n#SBATCH -p roce -o out-%j.txt\necho "ARGS=$* GID=$NCCL_IB_GID_INDEX"\n')
    job = submit([str(script), "--lr", "0.1"], env)
    assert "ARGS=--lr 0.1 GID=3" in finished_output(slurm, job, shared_tmp / f"out-{job}.txt")


def both(args, env, stdin=None):
    plain = subprocess.run(["sbatch", *args], capture_output=True, text=True, env=env, input=stdin)
    wrapped = stune_sbatch(args, env, stdin)
    return plain, wrapped


@pytest.mark.parametrize(
    "args",
    [
        ["-p", "nope", "--wrap", "true"],
        ["--bogus", "--wrap", "true"],
        ["-p"],
        ["--parsable", "-p", "nope", "--wrap", "true"],
        ["/no/such/script.sh"],
    ],
)
def test_errors_are_sbatchs_own(slurm, env, args):
    """sbatch's exit status, stdout and stderr, unchanged; before them at most one line of stune's, saying
    why (an option the table does not know, a line the table says sbatch refuses: issue 22 §1)."""
    plain, wrapped = both(args, env)
    assert plain.returncode != 0
    assert (wrapped.returncode, wrapped.stdout) == (plain.returncode, plain.stdout)
    assert wrapped.stderr.endswith(plain.stderr)
    ours = wrapped.stderr[: len(wrapped.stderr) - len(plain.stderr)].splitlines()
    assert len(ours) <= 1 and all(line.startswith("stune-sbatch: warning: ") for line in ours), ours


def test_an_unknown_partition_in_the_script_gives_sbatchs_error_too(slurm, env):
    script = "#!/bin/sh\n#SBATCH -p nope\ntrue\n"
    plain, wrapped = both([], env, stdin=script)
    assert plain.returncode == 1 and "invalid partition specified: nope" in plain.stderr
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )


def test_output_has_sbatchs_form(slurm, env):
    plain, wrapped = both(["-H", "-p", "roce", "--wrap", "true"], env)
    assert re.fullmatch(r"Submitted batch job \d+\n", plain.stdout)
    assert re.fullmatch(r"Submitted batch job \d+\n", wrapped.stdout) and wrapped.stderr == ""


@pytest.mark.parametrize(
    "cmd, env_var, directive",
    [
        ("roce", None, None),
        (None, "vpc", None),
        (None, None, "vpc"),
        (None, "roce", "vpc"),
        ("hdr", "roce", "vpc"),
        ("hdr", None, "vpc"),
        (None, None, None),
    ],
)
def test_partition_resolution_matches_sbatchs(slurm, env, cmd, env_var, directive):
    """Differential: sbatch --test-only says which partition it would use; stune's plan must agree."""
    args = ["-p", cmd] if cmd else []
    script = "#!/bin/sh\n" + (f"#SBATCH --partition={directive}\n" if directive else "") + "true\n"
    if env_var:
        env["SBATCH_PARTITION"] = env_var
    plain = subprocess.run(
        ["sbatch", "--test-only", *args], capture_output=True, text=True, env=env, input=script
    )
    expected = re.search(r"in partition (\S+)", plain.stderr).group(1)
    dry = stune_sbatch(["--dry-run", *args], env, stdin=script)
    assert dry.returncode == 0, dry.stderr
    assert re.search(r"^partition\s+(\S+)", dry.stdout, re.M).group(1) == expected


def test_degraded_nodes_are_excluded_from_multi_node_jobs_only(slurm, env):
    slurm.update_node("n2", features=["stune_degraded"])
    multi = submit(["-H", "-p", "hdr", "-N", "2", "--wrap", "true"], env)
    single = submit(["-H", "-p", "hdr", "-N", "1", "--wrap", "true"], env)
    show = lambda j: slurm.run(["scontrol", "show", "job", str(j)])
    assert "ExcNodeList=n2" in show(multi) and re.search(r"Switches=1@", show(multi))
    assert "ExcNodeList=(null)" in show(single)
    assert "Requeue=1" in show(single)


def test_history_diff_of_two_runs_differing_in_one_variable(slurm, env):
    env["STUNE_TEST_KNOB"] = "1"
    a = submit(["-H", "-p", "roce", "--wrap", "true"], env)
    env["STUNE_TEST_KNOB"] = "2"
    b = submit(["-H", "-p", "roce", "--wrap", "true"], env)
    listing = stune_sbatch(["history"], env)
    assert str(a) in listing.stdout and str(b) in listing.stdout
    out = stune_sbatch(["history", "diff", str(a), str(b)], env)
    assert out.returncode == 0 and out.stderr == ""  # the real sacct answered
    assert out.stdout.splitlines()[1:] == [
        "samples/s -: no steps record for either run (docs/steps.md); STUNE_TEST_KNOB changed",
        "environment (1 variable differ):",
        "  ~ STUNE_TEST_KNOB: '1' -> '2'",
    ]


def test_stune_bind_under_srun_lands_on_its_gpus_numa_cpus(taskprolog, slurm, env, shared_tmp):
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    report = shared_tmp / "report.sh"
    report.write_text(
        '#!/bin/sh\necho "task $SLURM_LOCALID $(grep Cpus_allowed_list /proc/self/status | tr -d "\\t")'
        ' $(taskset -cp $$)"\n'
    )
    report.chmod(0o755)
    env["STUNE_SYSFS_ROOT"] = f"{taskprolog.layout.root}/nodes/%n/{SYSFS}"
    job = submit(
        [
            "-p",
            "roce",
            "-N",
            "1",
            "-n",
            "4",
            "--gres=gpu:4",
            "-o",
            "out-%j.txt",
            "--wrap",
            f"srun -n 4 stune-bind {report}",
        ],
        env,
    )
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    lines = sorted(line for line in out.splitlines() if line.startswith("task "))
    assert [line.split()[:3] for line in lines] == [
        ["task", "0", "Cpus_allowed_list:0"],
        ["task", "1", "Cpus_allowed_list:0"],
        ["task", "2", "Cpus_allowed_list:1"],
        ["task", "3", "Cpus_allowed_list:1"],
    ]
    assert all(line.endswith(f"current affinity list: {line.split(':')[1][0]}") for line in lines)


def test_stage_requests_reach_the_taskprolog_and_a_required_one_fails_the_job(
    taskprolog, slurm, env, shared_tmp
):
    """The shipped profiles' cache tier (/local/nvme/stune-cache) does not exist here: an optional request
    falls back to the source (with a warning in the job's stderr), a required one fails the job cleanly."""
    data = shared_tmp / "dataset"
    data.mkdir()
    (data / "part-0").write_text("x")
    job = submit(
        [
            "-p",
            "roce",
            "--stage",
            f"{data}:DATA",
            "-o",
            "out-%j.txt",
            "-e",
            "err-%j.txt",
            "--wrap",
            'echo "DATA=$STUNE_STAGE_DATA"',
        ],
        env,
    )
    assert f"DATA={data}" in finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    assert "not staged" in (shared_tmp / f"err-{job}.txt").read_text()
    job = submit(
        [
            "-p",
            "roce",
            "--stage",
            f"{data}:DATA",
            "--stage-required",
            "-o",
            "out-%j.txt",
            "-e",
            "err-%j.txt",
            "--wrap",
            "echo ran",
        ],
        env,
    )
    assert wait_for_state(slurm, job, ("FAILED", "COMPLETED"), timeout=60) == "FAILED"
    err = (shared_tmp / f"err-{job}.txt").read_text()
    assert "--stage-required: DATA" in err
    assert "ran" not in (shared_tmp / f"out-{job}.txt").read_text()


def test_wait_relays_sbatch_live_returns_the_jobs_status_and_is_recorded(taskprolog, slurm, env):
    plain = subprocess.run(
        ["sbatch", "-W", "-p", "roce", "-o", "/dev/null", "--wrap", "exit 3"],
        capture_output=True,
        text=True,
        env=env,
    )
    wrapped = stune_sbatch(["-W", "-p", "roce", "-o", "/dev/null", "--wrap", "exit 3"], env)
    assert plain.returncode == wrapped.returncode == 3
    job = re.fullmatch(r"Submitted batch job (\d+)\n", wrapped.stdout).group(1)
    assert job in stune_sbatch(["history"], env).stdout


def test_a_short_job_without_a_trap_completes_as_under_sbatch(slurm, env, shared_tmp):
    """Issue 15 §1: the profile's --signal=B:USR1@300 used to be sent at once to a job with -t below 5
    minutes, and bash exits on SIGUSR1: FAILED 0:10 under stune-sbatch, COMPLETED under sbatch."""
    script = shared_tmp / "short.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -t 1\n#SBATCH -p roce\n#SBATCH -o /dev/null\nsrun sleep 8\necho done\n"
    )
    plain = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env)
    wrapped = stune_sbatch(["--parsable", str(script)], env)
    assert plain.returncode == wrapped.returncode == 0 and wrapped.stderr == ""
    a, b = int(plain.stdout), int(wrapped.stdout)
    assert "Requeue=1" in slurm.run(["scontrol", "show", "job", str(b)])  # stune's settings still applied
    assert wait_for_state(slurm, a, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    assert wait_for_state(slurm, b, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    # the same script with a trap gets the signal, and a warning that -t 1 is shorter than its lead
    script.write_text(script.read_text().replace("srun sleep 8", "trap 'echo ckpt' USR1\nsrun sleep 1"))
    trapped = stune_sbatch(["--parsable", str(script)], env)
    assert trapped.returncode == 0 and "the time limit (60s) is not longer than the 300s" in trapped.stderr


def test_values_set_inside_the_job_win_in_every_step(taskprolog, slurm, env, shared_tmp):
    """Issue 15 §2: the TaskProlog re-detects a variable only while it still has the value stune set."""
    script = shared_tmp / "mine.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -p roce -N 2 -o out-%j.txt\n"
        'echo "batch IF=$NCCL_SOCKET_IFNAME HCA=$NCCL_IB_HCA"\n'
        "export NCCL_SOCKET_IFNAME=lo\n"
        "srun -N2 -n2 sh -c 'echo \"step1 $SLURMD_NODENAME IF=$NCCL_SOCKET_IFNAME HCA=$NCCL_IB_HCA\"'\n"
        # (srun 22.05 lets a variable already in its environment beat an --export assignment: env -u)
        "env -u NCCL_IB_HCA srun -N2 -n2 --export=ALL,NCCL_IB_HCA==mlx5_6:1 "
        "sh -c 'echo \"step2 $SLURMD_NODENAME IF=$NCCL_SOCKET_IFNAME HCA=$NCCL_IB_HCA\"'\n"
        "unset NCCL_SOCKET_IFNAME\n"
        "srun -N1 -n1 sh -c 'echo \"step3 IF=$NCCL_SOCKET_IFNAME\"'\n"
    )
    job = submit([str(script)], env)
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    lines = sorted(line for line in out.splitlines() if line.startswith(("batch", "step")))
    assert lines == [
        f"batch IF=eth0 HCA={ROCE_HCAS}",
        f"step1 n1 IF=lo HCA={ROCE_HCAS}",
        f"step1 n2 IF=lo HCA={ROCE_HCAS}",
        "step2 n1 IF=lo HCA==mlx5_6:1",
        "step2 n2 IF=lo HCA==mlx5_6:1",
        "step3 IF=eth0",
    ]  # unset in the script: absent, so stune's to set again


def test_a_value_the_node_proves_wrong_is_unset_and_said_once_per_job(taskprolog, slurm, env, shared_tmp):
    """Issue 15 §3: hdr's socket interface ib0 does not exist on these nodes: stune's NCCL_SOCKET_IFNAME is
    unset in every step, and the job's stderr says so once (not per node and step)."""
    job = submit(
        [
            "-p",
            "hdr",
            "-N",
            "2",
            "-o",
            "out-%j.txt",
            "-e",
            "err-%j.txt",
            "--wrap",
            'echo "batch IF=${NCCL_SOCKET_IFNAME-unset}"; for i in 1 2; do srun -N2 -n2 sh -c '
            "'echo \"step $SLURMD_NODENAME IF=${NCCL_SOCKET_IFNAME-unset}\"'; done",
        ],
        env,
    )
    out = finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    assert sorted(line for line in out.splitlines() if "IF=" in line) == [
        "batch IF=unset",
        "step n1 IF=unset",
        "step n1 IF=unset",
        "step n2 IF=unset",
        "step n2 IF=unset",
    ]
    err = (shared_tmp / f"err-{job}.txt").read_text()
    said = [line for line in err.splitlines() if "NCCL_SOCKET_IFNAME unset" in line]
    assert len(said) == 1, err
    assert said[0].startswith(
        "stune-task-prolog: NCCL_SOCKET_IFNAME unset: socket interface ib0 does not exist"
    )
    assert said[0].endswith("[n1; said once per job]")


def test_node_summary_writes_one_line_per_node(taskprolog, slurm, env, shared_tmp):
    job = submit(
        [
            "-p",
            "roce",
            "-N",
            "2",
            "--node-summary",
            "-o",
            "out-%j.txt",
            "-e",
            "err-%j.txt",
            "--wrap",
            "srun -N2 -n2 true; echo ok",
        ],
        env,
    )
    finished_output(slurm, job, shared_tmp / f"out-{job}.txt")
    err = (shared_tmp / f"err-{job}.txt").read_text()
    lines = sorted(line for line in err.splitlines() if line.startswith("stune: "))
    assert [line.split(":")[1] for line in lines] == [" n1 step 0", " n1 step batch", " n2 step 0"]
    assert (
        f"NCCL_IB_HCA={ROCE_HCAS} NCCL_IB_GID_INDEX=3 NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 "
        f"MASTER_ADDR=n1 MASTER_PORT={12000 + job % 8000}" in lines[0]
    )
