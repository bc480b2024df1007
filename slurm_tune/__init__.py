"""slurm_tune (stune): make Slurm GPU clusters run distributed training fast and fairly."""
__version__ = "0.1.0"
