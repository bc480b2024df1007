"""The cli_filter plugin: plain `sbatch`, `salloc` and `srun` get the partition's settings (docs/sbatch.md).

`cli_filter.lua` (shipped here) runs inside Slurm's commands; `render.py` turns the profiles into the data it
reads, through the same plan as stune-sbatch (`stune-admin install --cli-filter` writes both).
"""
