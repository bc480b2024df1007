"""The fleet's reliability from Slurm's accounting (`stune-health lemons`, `stune-health reliability`;
docs/reliability.md).

- `history`: sacct's job runs (`-X -D`: every run of a requeued job) into numpy columns;
- `events`: the nodes' DOWN and DRAIN events (`sacctmgr show event`) and what their reasons say;
- `causes`: why each run ended (the one home of the cause rules) and which nodes a failure is laid on;
- `stats`: the Poisson tail, its lower bound, Fisher's combination, Holm's levels;
- `lemons`: the lemon test per partition; `mark`: lemons marked degraded (opt-in, health.lemon_mark);
- `report`: ETTR, MTTF by job size, interruptions per 1,000 node-days by cause, per partition and month;
  `render`: the lemons and the report as text, CSV, JSON and PNG.
Everything here runs where sacct is, never on a node's hot path (numpy at module level).
"""
