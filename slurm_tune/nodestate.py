"""How stune marks nodes in Slurm. The health hooks write these marks; stune-sbatch and reports read them.

- A node stune drains has a reason that starts with REASON_PREFIX ("stune: mlx5_2/1 state DOWN"). stune
  only ever resumes or re-reasons nodes whose reason carries this prefix: an admin's drain is never touched.
- A degraded ("half-broken") node stays in service with the DEGRADED_FEATURE feature added to its features
  (the admin's own features are kept), and its Comment says why. Multi-node jobs exclude such nodes.
"""

REASON_PREFIX = "stune: "
DEGRADED_FEATURE = "stune_degraded"
# The active checks (stune-sweep) tag their reasons: `stune: degraded: active <check>: ...` in the Comment,
# `stune: active <check>: ...` as a drain reason. The passive health run leaves marks with this tag alone.
ACTIVE_TAG = "active "
ACTIVE_COMMENT = f"{REASON_PREFIX}degraded: {ACTIVE_TAG}"
ACTIVE_DRAIN = f"{REASON_PREFIX}{ACTIVE_TAG}"
# The lemon scoring (`stune-health lemons --mark`, reliability/mark.py) marks degraded with
# `stune: degraded: lemon: ...` and clears its own marks; the passive health run leaves them alone too.
LEMON_COMMENT = f"{REASON_PREFIX}degraded: lemon"
