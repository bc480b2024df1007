"""Node health: checks over a hardware snapshot, node-local state, and applying the verdict to Slurm.

- `result`: the typed result every check returns (ok / degraded / fail / unknown + one human line).
- `ib`, `versions`, `gpu`, `xid`: one family of checks per module, each a pure function over
  (snapshot, profile, previous state). `xid` also holds the one table of NVIDIA Xid meanings.
- `judge`: runs the families; a check that raises is "unknown", never "fail".
- `state`: the node-local state file (counter baselines, last Xid, last verdict, what was applied).
- `apply`: turns a verdict into drain / resume / degraded mark through the Slurm adapter, with the circuit
  breaker, and only when something changed.
- `outputs`: the Prometheus textfile and the JSON verdict.
- `collect`: the prolog's fast read and the full capture; `prologhook`: the Python side of the shipped
  prolog hook (env file, exit status).

JSON on these paths goes through `slurm_tune.fastjson` (the C scanner and encoder, without `json`'s `re`).
"""
