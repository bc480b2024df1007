"""The one Slurm adapter: every other part of stune talks to Slurm through `Slurm` (adapter.py).

One file per job (docs/slurm-versions.md has the releases):
- adapter.py: `Slurm`, a handle on one cluster: builds each node, job and partition query and every update,
  and reads the answer;
- accounting.py: `SlurmAccounting`, Slurm's base: the accounting and fair-share reads (sacct, sshare, sprio,
  sacctmgr's associations and QOS, scontrol's config);
- reader.py: `SlurmReader`, its base: the release of the client commands, Slurm's JSON documents and `-P`
  listings, and the error for output of a layout stune does not know;
- commands.py: `SlurmCommands`, the base of all: where the client commands are, slurm.conf, the timeout,
  running them (all a plain submission needs);
- sacctargs.py: how stune asks sacct (the field order, free text last; the command line);
- spawn.py: starting a client command and collecting its output (os.posix_spawn, not subprocess);
- records.py: the typed records (Node, Job, ...) and the parsers of each release's JSON records;
- scontrol.py: scontrol's text output (`show ... -o` records, `show config`);
- associations.py: the one reader of `sacctmgr show assoc` (live and exported);
- tres.py: TRES strings (`cpu=2,gres/gpu=4`);
- version.py: the Slurm release, and the releases where output changes shape.
Host lists (`n[1-3]`) are slurm_tune/hostlist.py: readers that need no adapter take them from there.

`from slurm_tune.slurm import Slurm, SlurmError, Node, ...` is the public import path. Each name loads its
module on first use (__getattr__ below; hot path: see docs/speed.md).
"""

from ..errors import SlurmError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "INFINITE",
    "Association",
    "Job",
    "Node",
    "Partition",
    "PrioRow",
    "ShareRow",
    "Slurm",
    "SlurmCommands",
    "SlurmError",
    "SlurmVersion",
]


def __getattr__(name: str):
    if name == "Slurm":
        from . import adapter

        return adapter.Slurm
    if name in ("SlurmCommands", "DEFAULT_TIMEOUT_S"):
        from . import commands

        return getattr(commands, name)
    if name in ("INFINITE", "Job", "Node", "Partition", "PrioRow", "ShareRow"):
        from . import records

        return getattr(records, name)
    if name == "Association":
        from . import associations

        return associations.Association
    if name == "SlurmVersion":
        from . import version

        return version.SlurmVersion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
