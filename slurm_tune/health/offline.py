"""The offline check (`stune-health check`): judge a snapshot file by a partition's profile, away from the node
it was taken on. Apart from node.py so that judging a file loads none of the hooks' and the periodic run's
code (the hot-path rule, docs/speed.md)."""

from __future__ import annotations

import os

from ..errors import ConfigError
from . import judge, result, state

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


def choose_profile(partition: str | None, environ=None):
    """--partition, else $STUNE_HEALTH_PARTITION, else the only profile there is."""
    from ..profilestore import load_profile, load_profiles, profile_dir

    environ = os.environ if environ is None else environ
    partition = partition or environ.get("STUNE_HEALTH_PARTITION")
    if partition:
        return load_profile(partition)
    profiles = load_profiles()
    if len(profiles) == 1:
        return next(iter(profiles.values()))
    raise ConfigError(
        profile_dir(),
        None,
        "",
        "several profiles (" + ", ".join(sorted(profiles)) + "): say which with --partition",
    )


def check(
    snapshot: dict, profile: Profile, previous_snapshot: dict | None = None
) -> tuple[result.Verdict, dict]:
    """Judge a snapshot offline. With a previous snapshot, counters are judged as increases since it and
    only Xids after it count; without one, this is a first sight (baselines only)."""
    previous = state.empty()
    if previous_snapshot is not None:
        _, updates = judge.judge(previous_snapshot, profile, previous)
        judge.merge_state(previous, updates, rebaseline=True)
        previous["xid_sticky"] = []
    return judge.judge(snapshot, profile, previous)[0], previous
