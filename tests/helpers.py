"""Helpers for tests that drive the local cluster."""

from __future__ import annotations

import time


def restore_cluster(handle, nodes) -> None:
    """Leave the cluster as a test found it: no jobs, every node idle and undrained, no stune marks."""
    for state in ("PENDING", "RUNNING", "SUSPENDED"):  # scancel takes one --state per call
        handle.run(["scancel", "--full", f"--state={state}"], check=False)
    for node in nodes:  # one by one: RESUME on a node that is not drained fails the whole update
        handle.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        handle.run(
            ["scontrol", "update", f"NodeName={node}", "AvailableFeatures=", "ActiveFeatures=", "Comment="],
            check=False,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = handle.run(["squeue", "-h", "-o", "%i"], check=False)
        if not out.strip():
            break
        time.sleep(0.3)


def wait_for_state(slurm, job_id: int, states: tuple[str, ...], timeout: float = 60) -> str:
    """Poll sacct until the job reaches one of `states` (e.g. COMPLETED); return the state."""
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        rows = slurm.sacct(["JobID", "State"], job_ids=[str(job_id)])
        if rows:
            state = rows[0]["State"].split()[0]
            if state in states:
                return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} stayed {state}, expected one of {states} within {timeout}s")


def wait_until(what: str, predicate, timeout: float = 30, interval: float = 0.3):
    """Poll predicate() until it returns a truthy value, which is returned; fail the test at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def slurm_env() -> dict[str, str]:
    """What a hook or a command with its own environment needs to reach the test cluster's Slurm:
    SLURM_CONF, and on a built Slurm (STUNE_SLURM=24.11) STUNE_SLURM_BIN, which Slurm.from_env() reads."""
    import os

    return {k: os.environ[k] for k in ("SLURM_CONF", "STUNE_SLURM_BIN") if os.environ.get(k)}


def slurm_exports() -> str:
    """slurm_env() as `K=V K=V` words for a shell `export` line."""
    return " ".join(f"{k}={v}" for k, v in slurm_env().items())


def slurm_path(path: str) -> str:
    """A PATH with the test cluster's Slurm commands first when they are not Debian's (/usr/bin)."""
    import os

    bin_dir = os.environ.get("STUNE_SLURM_BIN")
    return f"{bin_dir}:{path}" if bin_dir else path


def reconfigure(slurm) -> None:
    """`scontrol reconfigure` through the adapter's runner (only the dev cluster and tests reconfigure Slurm)."""
    slurm.run(["scontrol", "reconfigure"])


def sacctmgr(slurm, args: list[str]) -> str:
    """An accounting change without sacctmgr's prompt (-i): the dev cluster's and tests' only, not the adapter's."""
    return slurm.run(["sacctmgr", "-i", *args])
