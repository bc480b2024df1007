"""The bottleneck verdict (usage/bottleneck.py): the playbook's order, its numbers, and "unmeasured" where a
measurement is missing, never a guess."""

from __future__ import annotations

from slurm_tune.usage.bottleneck import (
    COMMUNICATION,
    COMPUTE,
    HOST,
    STORAGE,
    UNCLEAR,
    UNMEASURED,
    Evidence,
    Measure,
    Network,
    Storage,
    diagnose,
)

NVME = Storage("nvme0n1", "dataset source", "n17", 2.9e9, baseline_bps=3.05e9)
IB_IDLE = Network("IB", 0.85, 0.40, 21e9, "n3")


def test_busy_gpus_are_compute_bound_whatever_else_was_busy():
    d = diagnose(Evidence(gpu_util=Measure(92.0), storage=NVME, network=IB_IDLE, clock_share=Measure(0.98)))
    assert d.bound == COMPUTE and d.headline == "GPU busy 92 %: compute-bound"
    assert "mixed precision, batch size" in d.advice
    assert "storage: dataset source nvme0n1 read at 2.9 GB/s on n17, 95 % of n17's fio baseline" in d.lines


def test_throttled_busy_gpus_say_so():
    d = diagnose(Evidence(gpu_util=Measure(95.0), clock_share=Measure(0.70)))
    assert d.bound == COMPUTE and "70 % of its maximum" in d.advice and "power and cooling" in d.advice


def test_a_sawtooth_at_the_devices_limit_is_storage_bound():
    d = diagnose(Evidence(gpu_util=Measure(40.0), drops=12, storage=NVME, network=IB_IDLE))
    assert d.bound == STORAGE
    assert d.headline == (
        "GPU 40 % in a sawtooth while the dataset source nvme0n1 read at 2.9 GB/s, 95 % of n17's fio "
        "baseline: storage-bound"
    )
    assert "--stage" in d.advice and "before touching NCCL" in d.advice


def test_the_scripts_own_data_wait_is_storage_bound_before_the_network():
    d = diagnose(Evidence(gpu_util=Measure(55.0), data_wait=Measure(0.31), network=IB_IDLE))
    assert d.bound == STORAGE and "data loading took 31 % of a step (median)" in d.headline


def test_a_slow_device_far_below_its_baseline_is_not_called_the_limit():
    slow = Storage("nvme0n1", "dataset source", "n17", 0.3e9, baseline_bps=3.0e9)
    d = diagnose(Evidence(gpu_util=Measure(40.0), drops=9, storage=slow, network=IB_IDLE))
    assert d.bound == COMMUNICATION
    assert "IB at 85 % of line rate in the GPU's idle phases: communication-bound" in d.headline
    assert "--switches" in d.advice


def test_a_starved_data_loader_is_host_bound():
    quiet = Network("TCP", 0.05, 0.03, 1e8, "n1")
    d = diagnose(Evidence(gpu_util=Measure(35.0), cpu_share=Measure(0.97), network=quiet, storage=None))
    assert d.bound == HOST and "CPUs were 97 % busy" in d.headline


def test_missing_measurements_are_named_never_guessed():
    d = diagnose(Evidence(gpu_util=Measure(30.0), storage_why="dataset on lustre: its client is not read"))
    assert d.bound == UNCLEAR and "(storage and network unmeasured)" in d.headline
    assert "storage: unmeasured (dataset on lustre: its client is not read)" in d.lines
    assert "network: unmeasured (not in the job's record)" in d.lines
    d = diagnose(Evidence(gpu_util=Measure(None, "no GPU samples on any node")))
    assert d.bound == UNMEASURED and "no GPU samples on any node" in d.headline


def test_shared_devices_are_called_node_wide():
    shared = Storage("nvme0n1", "cache tier", "n2", 1e9, shared=True)
    d = diagnose(Evidence(gpu_util=Measure(90.0), storage=shared))
    assert any("node-wide: another job shared the node" in line for line in d.lines)


def test_the_transport_verdict_rides_along():
    d = diagnose(
        Evidence(
            gpu_util=Measure(30.0),
            network=IB_IDLE,
            transport=["transport: IB partition, but ranks on n3 used NET/Socket over eth0"],
            transport_bad=True,
        )
    )
    assert d.bound == COMMUNICATION and "transport verdict below" in d.advice
    assert d.lines[-1].endswith("used NET/Socket over eth0")
