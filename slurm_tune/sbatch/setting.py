"""One thing stune considered for a submission (a Setting), its kinds, and where a profile value comes from:
the vocabulary the plan (plan.py) and the staging rules (staging.py) share."""

from __future__ import annotations

from ..frozen import Record

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

ENV, OPTION, NODE, NOTE, WARNING = "env", "option", "node", "note", "warning"
STAGED = "staged"  # a STUNE_STAGE_<NAME> the TaskProlog sets on each node: for the explanation only


class Setting(Record):
    """kind: env (set in the job's environment), option (added to sbatch), node (detected on each node by
    the TaskProlog / stune-env), staged (a dataset's variable, set on each node by the TaskProlog), note
    (advice only), warning (printed at submission too). `source`: the profile key and file:line, or the rule.
    `applied`: False when the user's own value wins; `note` then says so."""

    __slots__ = ("kind", "name", "value", "source", "applied", "note")
    kind: str
    name: str
    value: str | None
    source: str
    applied: bool
    note: str


def origin(profile: Profile, *keys: str) -> str:
    found = [f"{k} @ {profile.origin(k)}" for k in keys]
    return "; ".join(found)
