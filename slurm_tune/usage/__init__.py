"""Per-job GPU usage: measured on the nodes, stored in Slurm's accounting DB. pipeline.py names the stages
and the formats (the accumulator file, the node summary JSON, the AdminComment line, the ledger) in one place.

The path of one job's numbers:

1. `prolog/20-stune-jobgpus` (plain sh) writes $SLURM_JOB_GPUS to `<local_dir>/jobs/<jobid>`.
2. `stune-gpu-sampler run` (one per node) samples every GPU each interval and adds each sample to the
   accumulators of the job that holds that GPU: a small mmap'd file `<local_dir>/acc/<jobid>` (`accum`), so a
   sampler restart loses nothing and the epilog always reads the latest sample.
3. `epilog/20-stune-usage` turns this node's accumulators into a node summary and drops it, atomically, into
   the shared spool `<spool_dir>/<jobid>/<node>.json` (`spool`). Nodes never call Slurm commands.
4. `epilog/stune-usage-slurmctld` (EpilogSlurmctld, on the controller) waits for every node's file, merges
   them (`summary`) and writes the job summary into AdminComment with `sacctmgr` (users cannot write it).
   `stune-fairshare collect` sweeps whatever a slow node delivered late.

The config file these steps and the accountant share (fairshare.yaml: its `usage` section names the
directories above, the others the accountant's settings) is `config`: the one place either reads it from.
"""
