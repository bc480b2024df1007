"""Active checks: measure nodes and node pairs with real benchmarks, judge them against the partition's
baseline for their version fingerprint, and mark the slow ones degraded (see docs/active.md).

- `parse`: the tools' real output formats -> Reading (a number, a tool-reported failure, or unknown);
- `checks`: the catalogue of checks (tool, command, metric, install hint) and the profile's choices;
- `agent`: what runs inside a sweep job on the node: the tool under a deadline, parsed, with the fingerprint;
- `store`: every result with its fingerprint, append-only per partition and month;
- `judge`: baselines (median, MAD) per partition/check/fingerprint, floors, k-of-n verdicts, pair blame;
- `sweep`: submitting checks as low-priority, time-limited Slurm jobs on idle nodes, collecting, marking;
- `report`: per-node results against the baseline (table, CSV, JSON, PNG, Prometheus), version drift.
"""
