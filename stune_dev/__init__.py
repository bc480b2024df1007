"""stune's developer tools, kept out of the production package: the local Slurm cluster the tests and the
demo run on (`stune-devcluster`, `devcluster`) and README's demo (`python -m stune_dev.demo`).

They use slurm_tune; slurm_tune never imports them (tests/test_devcluster.py checks it).
"""
