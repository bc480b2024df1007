"""The usage pipeline, in one place: how one job's GPU usage travels from the node's GPUs to the fair-share
ledger. Five processes hand it on through the formats below; each has one home module, named here, and the
constants that mark a format on disk or in Slurm are defined here and imported by that module.

    stage  process (runs as, where)                              reads                  writes
    1      prolog/20-stune-jobgpus (Prolog, root, node; sh)     $SLURM_JOB_GPUS         <local_dir>/jobs/<jobid>
    2      stune-gpu-sampler run (systemd, root, node)          the jobs files, NVML,   ACCUMULATOR,
                                                                node counters           PERF_RECORD
    3      epilog/20-stune-usage (Epilog, root, node)           ACCUMULATOR, PERF_      NODE_SUMMARY
                                                                RECORD, the job's dir
    4      epilog/stune-usage-slurmctld (EpilogSlurmctld,       NODE_SUMMARY (every     ADMIN_COMMENT
           SlurmUser, controller); `stune-fairshare collect`    node of the job)
           sweeps what a slow node delivered late
    5      stune-fairshare (systemd timer, accountant host)     ADMIN_COMMENT (sacct)   LEDGER

The formats:
- ACCUMULATOR: a small mmap'd binary file per job and node, `<local_dir>/acc/<jobid>`, one record of sums
  per GPU plus the job's utilization series (usage/accum.py). Node-local; survives a sampler restart.
- PERF_RECORD: the job's node counters beside its GPU samples, one mmap'd file per job and node,
  `<local_dir>/perf/<jobid>` (usage/perfrec.py; summarised by usage/perf.py).
- the job's directory `<local_dir>/run/<jobid>/` (usage/jobdir.py): what the job's processes wrote for the
  epilog (NCCL logs, the steps file), read by usage/jobfiles.py into the node summary.
- NODE_SUMMARY: one node's summary of a job as JSON, `<spool_dir>/<jobid>/<node>.json`, written atomically
  into the spool the nodes and the controller share (usage/spool.py).
- ADMIN_COMMENT: the job's merged summary as one line of text in Slurm's AdminComment, `stune1 held=...`,
  then the tokens of usage/perf.py, usage/steps.py and the transport verdict (usage/jobfiles.py)
  (usage/summary.py; stored by usage/collect.py through sacctmgr, which users cannot write).
- LEDGER: the accountant's settled usage per association and its sacct watermark, a JSON file
  (fairshare/ledger.py).

Nodes never call Slurm commands (stages 1-3); the controller's stage 4 is the only writer of AdminComment;
the accountant (stage 5) reads only sacct. The directories come from one config file (usage/config.py:
`usage.local_dir`, `usage.spool_dir`). docs/fairshare.md tells the same story for admins.
"""

from __future__ import annotations

# stage 1 -> 2: the prolog's record of a job's GPUs, and stage 2 -> 3: the accumulators, under usage.local_dir
JOBS_DIR = "jobs"
ACC_DIR = "acc"
# beside the accumulator, stage 2 -> 3: the job's node counters (network, storage, CPU, GPU links; perfrec.py)
PERF_DIR = "perf"
PERF_MAGIC = b"STUNEPF1"
# ACCUMULATOR: the header's magic (the version 1 files, 16 fields and no series, are still read)
ACCUMULATOR_MAGIC = b"STUNEAC2"
ACCUMULATOR_MAGIC_V1 = b"STUNEAC1"
# NODE_SUMMARY: <spool_dir>/<jobid>/<node> + this suffix; `stored` marks what the controller last stored
NODE_SUMMARY_SUFFIX = ".json"
STORED_MARKER = "stored"
# ADMIN_COMMENT: the line's first word, its format's version
ADMIN_COMMENT_PREFIX = "stune1 "


def admin_fields(comment: str) -> dict[str, str]:
    """An ADMIN_COMMENT line's key=value tokens; {} when the line is not stune's. The one reader of the line's
    tokens (usage/summary.py, usage/steps.py, usage/perf.py and comm/ each read their own keys from it);
    here, with no import, so stune-sbatch's history reads it without loading the summary module."""
    if not comment or not comment.startswith(ADMIN_COMMENT_PREFIX):
        return {}
    return dict(
        token.split("=", 1) for token in comment[len(ADMIN_COMMENT_PREFIX) :].split(" ") if "=" in token
    )


# LEDGER: the file's `format` value
LEDGER_FORMAT = "stune-fairshare-ledger/1"

# (stage, process, the format it writes, the module that defines that format)
STAGES = (
    (1, "prolog/20-stune-jobgpus", "jobs file", "usage/spool.py"),
    (2, "stune-gpu-sampler", "ACCUMULATOR", "usage/accum.py"),
    (2, "stune-gpu-sampler", "PERF_RECORD", "usage/perfrec.py"),
    (3, "epilog/20-stune-usage", "NODE_SUMMARY", "usage/spool.py"),
    (4, "epilog/stune-usage-slurmctld", "ADMIN_COMMENT", "usage/summary.py"),
    (5, "stune-fairshare", "LEDGER", "fairshare/ledger.py"),
)
