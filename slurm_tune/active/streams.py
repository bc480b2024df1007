"""The store's two other record streams as the comparison and the acceptance page read them: the validation
layers' (`validate`, written by stune-validate: validate/records.py) and the scaling curves' (`scaling`,
written by stune-sweep scaling: scaling_judge.py). Each is read with its writer's own validator, so a record
the writer could not have written (a torn line, a foreign field type, NaN, a huge number) is skipped, never
raises, and the formats have one home each.
"""

from __future__ import annotations

from ..validate.records import VERSION_KEYS, valid_record
from . import store
from .scaling_judge import valid_record as valid_scaling_record

VALIDATE_PARTS = VERSION_KEYS  # what a validation record's fingerprint adds


def load_validate(
    directory: str, partition: str, since: float = 0.0, until: float | None = None
) -> list[dict]:
    return store.load(directory, partition, since, until, kind="validate", accept=valid_record)


def load_scaling(
    directory: str, partition: str, since: float = 0.0, until: float | None = None
) -> list[dict]:
    return store.load(directory, partition, since, until, kind="scaling", accept=valid_scaling_record)
