"""Partition profiles: `partitions/*.yaml`, one per Slurm partition, over site-wide defaults in `site.yaml`.

A profile says what a partition's nodes should look like (fabric, HCAs, link rate, GPUs, versions) and how
jobs there should run (NCCL tunables, NUMA binding, cache tier, recovery). Files are validated at load time;
any mistake is one ConfigError line naming file:line and the key path.

Loading is on the prolog and stune-sbatch paths. After a first full load the validated result is cached with
`marshal`, keyed by every file's (size, mtime, inode), so later loads neither import yaml nor re-validate.
Root (the hooks) loads profiles and the cache only from files and directories that root alone can write.

This module is the face: the schema and the validation live in profilecheck.py, the loading and the cache in
profilestore.py (the hot paths import that one alone).
"""

from __future__ import annotations

import os

from .profilecheck import (
    ACTIVE_CHECKS,
    FABRICS,
    GDR_LEVELS,
    PROFILE_SCHEMA,
    SITE_FILE,
    SITE_SCHEMA,
    _validate_all,
    parse_version,
    version_key,
)
from .profilestore import (
    CACHE_FORMAT,
    CACHE_MAX_BYTES,
    DEFAULT_DIR,
    Profile,
    _yaml_files,
    load_profile,
    load_profiles,
    profile_dir,
)

# The face (the docstring): profilecheck's and profilestore's public names, and validate_directory.
__all__ = [
    "ACTIVE_CHECKS",
    "CACHE_FORMAT",
    "CACHE_MAX_BYTES",
    "DEFAULT_DIR",
    "FABRICS",
    "GDR_LEVELS",
    "PROFILE_SCHEMA",
    "SITE_FILE",
    "SITE_SCHEMA",
    "Profile",
    "load_profile",
    "load_profiles",
    "parse_version",
    "profile_dir",
    "validate_directory",
    "version_key",
]


def validate_directory(directory: str | os.PathLike) -> dict[str, Profile]:
    """Validate every file afresh, bypassing the cache (for `stune-admin check-profiles`)."""
    directory = os.fspath(directory)
    return {name: Profile(data) for name, data in _validate_all(directory, _yaml_files(directory)).items()}
