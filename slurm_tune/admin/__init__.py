"""Admin tooling: what the package ships (shipped), placing it on a node or controller (install), the
Slurm settings stune needs (slurmconf), and checking a live cluster (doctor, facts)."""
