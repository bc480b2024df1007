"""The GPU-utilization fair-share accountant (`stune-fairshare`).

Slurm charges fair-share by what a job holds. stune charges the same thing, times an idle penalty:

    charge = Slurm's charge (billing x seconds, x QOS UsageFactor) x (1 + alpha * (1 - eta))

where eta is the job's measured GPU utilization (from the per-job summary in AdminComment, or Slurm's own
gres/gpuutil where it records one). Jobs without a trustworthy measurement have eta = 1, so they are charged
exactly as Slurm charges them: penalties only.

- The config (fairshare.yaml) is read by `slurm_tune.usage.config`: the sampler and the epilogs read it too.
- `sacct`: reading sacct (live or a dump) into numpy columns, fast.
- `charges`: eta, coverage, penalty and Slurm's decay, vectorized.
- `tree`: the association tree and Slurm's two fair-share formulas (Fair Tree, classic).
- `ledger`: settled, decayed usage per association plus the sacct watermark (idempotent incremental runs).
- `accountant`: one run: read, charge, compute factors, plan and apply SiteFactor.
- `sitefactor`: the SiteFactor a pending job gets from its association's two fair-share factors.
- `report`: the per-account/user report's numbers; `report_render`: it as a table, CSV, JSON, PNG, Prometheus.
- `explain`: "why is my priority low?"; `jobview` and `jobdoc`: "was my job idle?" (`job JOBID`).
"""
