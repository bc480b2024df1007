"""`stune-health <command> --help`: every option of each command, with its help line, and the exit codes.
Kept apart from cli/health.py so that the prolog does not load the text."""

from __future__ import annotations

from ..progs import HEALTH as PROG

# Every option, with its help line: `stune-health <command> --help` prints exactly these.
COMMON_HELP = (
    (
        "-p, --partition P",
        "judge by partition P's profile (default: $STUNE_HEALTH_PARTITION, else the one this "
        "node used before)",
    ),
    (
        "--sysfs-root DIR",
        "read sysfs, /dev/kmsg and boot_id under DIR (default: $STUNE_SYSFS_ROOT or /; %n = node name)",
    ),
    ("--gpu-snapshot FILE", "replay NVML from a snapshot file instead of the driver ($STUNE_GPU_SNAPSHOT)"),
    (
        "--state-dir DIR",
        "node-local state (default: $STUNE_STATE_DIR or /var/lib/stune/health; %n = node name)",
    ),
    ("--node NAME", "this node's name (default: $SLURMD_NODENAME, else the host name)"),
    ("--prom FILE", "also write a Prometheus textfile ($STUNE_HEALTH_PROM)"),
    ("--json-out FILE", "also write the report as JSON ($STUNE_HEALTH_JSON)"),
)
COMMAND_HELP = {
    "capture": (
        "the node's full state as one JSON snapshot (for triage: `check --snapshot` it anywhere)",
        (
            ("-o, --output FILE", "write the snapshot to FILE (default: stdout)"),
            ("--no-nvml", "do not ask NVML (the GPU section says 'not captured')"),
            (
                "--timeout SECONDS",
                "deadline of each probe (default: the profile's health.probe_timeout_s, else 5)",
            ),
            ("--json", "the snapshot is JSON anyway (accepted, as on every read command)"),
        ),
        "0 written; 1 cannot write; 2 usage error",
    ),
    "check": (
        "judge a snapshot offline and print every finding that is not ok",
        (
            ("--snapshot FILE", "the snapshot to judge (required)"),
            ("--previous FILE", "an older snapshot: counters are judged as increases since it"),
            ("-v, --verbose", "print the ok results too"),
            ("--json", "print the report as JSON"),
        ),
        "0 ok, 4 unknown, 5 degraded, 6 fail; 1 unreadable snapshot or profile error; 2 usage error",
    ),
    "prolog": (
        "the Slurm Prolog hook: fast checks, no Slurm command, no NVML",
        (),
        "10 only for a failure under a policy this node has passed (the hook script turns it into "
        "exit 1); 0 for anything else, a bug or a bad profile included",
    ),
    "epilog": (
        "the Slurm Epilog hook: the full checks (NVML when the profile has GPUs), no Slurm command",
        (),
        "10 only for an enforced failure; 0 for anything else",
    ),
    "run": (
        "the HealthCheckProgram: full checks, then drain / resume / mark degraded through Slurm",
        (
            (
                "--dry-run",
                "judge and say what would change (every finding that is not ok, warnings included); "
                "change nothing, neither Slurm nor the node state",
            ),
            ("--json", "print the report as JSON"),
        ),
        "0 done; 1 Slurm or the profile failed; 7 the circuit breaker held back a drain; 2 usage error",
    ),
    "status": (
        "this node's health state (JSON)",
        (("--json", "the state is JSON anyway (accepted, as on every read command)"),),
        "0; 2 usage error",
    ),
    "clear": (
        "forget held state",
        (
            ("--xid", "release held Xids and end the remediation ladder (after a GPU reset or a repair)"),
            ("--baselines", "forget the error counter baselines (re-taken next run)"),
            ("--trust", "forget the policies this node has passed"),
            (
                "--unknown",
                "forget the consecutive-unknown counts (the degraded mark they led to clears on "
                "the next run)",
            ),
        ),
        "0; 2 usage error (nothing to forget)",
    ),
    "xids": (
        "print the Xid rules in force (stune's table, or with -p the partition's profile over it): action, "
        "burst, remedy, meaning",
        (),
        "0; 1 profile error",
    ),
    "incidents": (
        "this node's Xid incidents (what is held, what was released and how), the events per code, the "
        "remediation ladder's steps and any probe that keeps hanging",
        (("--json", "print them as JSON"),),
        "0; 2 usage error",
    ),
}


def command_help(command: str) -> str:
    """`stune-health <command> --help`: what it does, every option it takes, and its exit codes."""
    text, own, exits = COMMAND_HELP[command]
    lines = [f"usage: {PROG} {command} [options]", "", text, ""]
    options = list(own) + list(COMMON_HELP)
    if options:
        width = max(len(o) for o, _ in options)
        lines.append("options:")
        lines += [f"  {o:{width}s}  {h}" for o, h in options]
        lines.append(f"  {'-h, --help':{width}s}  show this help")
        lines.append("")
    lines.append(f"exit status: {exits}")
    return "\n".join(lines)
