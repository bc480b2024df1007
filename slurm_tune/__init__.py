"""slurm_tune (stune): make Slurm GPU clusters run distributed training fast and fairly."""

import os

__version__ = "0.1.0"


def cache_dir(environ=None) -> str:
    """stune's per-user cache directory (the profile cache, sbatch's option table): $STUNE_CACHE_DIR,
    else $XDG_CACHE_HOME/stune, else ~/.cache/stune. Here because every stune import loads this module."""
    environ = os.environ if environ is None else environ
    base = environ.get("STUNE_CACHE_DIR")
    if base:
        return base
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "stune")
