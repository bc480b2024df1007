"""One accountant run: read sacct from the watermark, charge, compute both fair-share factors, plan and apply
SiteFactor on pending jobs (the SiteFactor each gets, and why that keeps stune's order: sitefactor.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..durations import DurationError, parse_slurm
from ..errors import SlurmError, StuneError
from ..slurm.associations import (
    EXPORT_FORMAT as ASSOC_EXPORT_FORMAT,
)
from ..slurm.associations import (
    AssocColumnsError,
    AssocFormatError,
    parse_associations,
)
from ..usage.config import accountant_state_dir
from . import charges as charges_mod
from . import sacct as sacct_mod
from . import tree as tree_mod
from .ledger import Ledger, LedgerLock
from .sitefactor import site_factor_line, site_factor_target

DEFAULT_HALF_LIFE_S = 7 * 86400
LEDGER_FILE = "ledger.json"


class AccountantError(StuneError):
    """The cluster's priority setup does not allow stune's fair-share (or the run could not complete)."""


@dataclass(frozen=True)
class PrioritySettings:
    """What the accountant needs from `scontrol show config`."""

    algorithm: str = "fair_tree"
    half_life_s: float = DEFAULT_HALF_LIFE_S
    weight_fairshare: int = 0
    damping: float = 1.0
    site_factor_plugin: str | None = None
    gpuutil_recorded: bool = False
    priority_type: str = "priority/multifactor"
    usage_reset: str = "NONE"

    @classmethod
    def from_config(cls, conf: dict) -> PrioritySettings:
        plugin = (conf.get("PrioritySiteFactorPlugin") or "").strip()
        return cls(
            algorithm=tree_mod.algorithm_from_flags(conf.get("PriorityFlags", "")),
            half_life_s=_half_life(conf.get("PriorityDecayHalfLife", "7-00:00:00")),
            weight_fairshare=_int(conf.get("PriorityWeightFairShare"), 0),
            damping=float(_int(conf.get("FairShareDampeningFactor"), 1) or 1),
            site_factor_plugin=None if plugin in ("", "(null)") else plugin,
            gpuutil_recorded="gres/gpuutil" in (conf.get("AccountingStorageTRES") or ""),
            priority_type=(conf.get("PriorityType") or "").strip(),
            usage_reset=(conf.get("PriorityUsageResetPeriod") or "NONE").strip().upper(),
        )

    def problems(self) -> list[str]:
        """Why SiteFactor cannot carry stune's factor on this cluster (empty when it can)."""
        out = []
        if self.priority_type != "priority/multifactor":
            out.append(f"PriorityType is {self.priority_type or 'unset'}, not priority/multifactor")
        if self.site_factor_plugin:
            out.append(
                f"PrioritySiteFactorPlugin={self.site_factor_plugin} would overwrite stune's SiteFactor"
            )
        return out


def _int(text, default: int) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


def _half_life(text) -> float:
    """PriorityDecayHalfLife as `scontrol show config` prints it (7-00:00:00; a bare number is minutes, as in
    slurm.conf); NONE or INFINITE is 0, which Slurm reads as no decay."""
    try:
        return float(parse_slurm(text) or 0)
    except DurationError as exc:
        raise AccountantError(f"scontrol show config: PriorityDecayHalfLife: {exc}") from None


@dataclass(frozen=True)
class SiteFactorChange:
    job_id: int
    account: str
    user: str
    current: int
    target: int
    fairshare_slurm: float
    fairshare_stune: float


@dataclass
class RunResult:
    as_of: int
    settings: PrioritySettings
    table: sacct_mod.JobTable
    charges: charges_mod.Charges
    counted: np.ndarray  # rows that count toward usage now (settled now or provisional)
    settled_now: int
    provisional: int
    usage_slurm: dict  # (account, user) -> decayed usage, eta = 1
    usage_stune: dict  # (account, user) -> decayed usage, penalized
    shares_slurm: tree_mod.ShareResult
    shares_stune: tree_mod.ShareResult
    tree: tree_mod.AssocTree
    sshare: list | None = None  # live sshare rows, when read
    site_line: tuple = (0.0, 0.0)  # (a, b): fair-share points + SiteFactor = a x F_stune + b (sitefactor.py)
    changes: list = field(default_factory=list)
    kept: int = 0  # pending jobs already at their target
    applied: bool = False
    ledger_path: str | None = None
    window_start: int | None = None
    warnings: list = field(default_factory=list)


def _sacct_time(epoch: float) -> str:
    """sacct takes local wall-clock times, not epochs."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))


def ledger_path(config, environ=None) -> str:
    return os.path.join(accountant_state_dir(config, environ), LEDGER_FILE)


def load_tree_file(path: str) -> tree_mod.AssocTree:
    """An exported `sacctmgr -P show assoc format=Account,User,ParentName,Share[,LFT or Lineage]` (with its
    header) as a tree, read by the adapter's own parser (slurm/associations.py: the same Share rule, and the
    tree order when the export has LFT or Lineage). Errors name the file and line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise AccountantError(f"{path}: cannot read: {exc.strerror}") from None
    if not text.strip():
        raise AccountantError(f"{path}: empty association file")
    try:
        rows = parse_associations(text)
    except AssocFormatError as exc:
        hint = (
            f"; export with sacctmgr -P show assoc format={ASSOC_EXPORT_FORMAT}"
            if isinstance(exc, AssocColumnsError)
            else ""
        )
        raise AccountantError(f"{path}:{exc.line}: {exc}{hint}") from None
    return tree_from_associations(rows, path)


def tree_from_slurm(slurm) -> tree_mod.AssocTree:
    return tree_from_associations(slurm.associations(), "sacctmgr show assoc")


def tree_from_associations(rows, source: str) -> tree_mod.AssocTree:
    """Associations (slurm.Association, in tree order) as the fair-share tree; `source` names where they
    came from in errors."""
    if any(r.partition for r in rows):
        raise AccountantError(
            "partition-specific associations are not supported by stune's fair-share accountant yet"
        )
    try:
        return tree_mod.AssocTree([tree_mod.Assoc(r.account, r.user, r.parent, r.shares) for r in rows])
    except tree_mod.TreeError as exc:
        raise AccountantError(f"{source}: {exc}") from None


def _sum_dicts(*dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def run(
    config,
    slurm=None,
    *,
    sacct_file: str | None = None,
    assoc_file: str | None = None,
    now: int | None = None,
    dry_run: bool = False,
    plan: bool = True,
    since: int | None = None,
    read_sshare: bool = False,
    settings: PrioritySettings | None = None,
    use_ledger: bool = True,
) -> RunResult:
    """One accountant run. Live (slurm given, no sacct_file): incremental from the ledger's watermark, and
    the ledger is saved unless dry_run. With sacct_file: a stateless what-if over the whole dump, offline
    unless `slurm` is given (then the cluster's settings, tree and pending jobs are used).
    `plan` computes SiteFactor changes for pending jobs (needs slurm); they are applied unless dry_run.
    Without `use_ledger` (a user's `explain`: the ledger is root's) a live run reads the whole history
    window from sacct instead, writes nothing, and plans nothing."""
    if not use_ledger:
        dry_run, plan = True, False
    acc = config.accountant
    warnings: list[str] = []
    if slurm is not None:
        settings = PrioritySettings.from_config(slurm.config())
    elif settings is None:
        settings = PrioritySettings()
    if slurm is None and sacct_file is not None and not assoc_file:
        warnings.append(
            "offline what-if: flat association tree (every account and user with Fairshare=1); "
            "give --assoc-file or --cluster for the real one"
        )
    if settings.weight_fairshare <= 0:
        warnings.append("PriorityWeightFairshare is 0: fair-share (and so stune's SiteFactor) has no weight")
    if settings.usage_reset not in ("NONE", ""):
        warnings.append(
            f"PriorityUsageResetPeriod={settings.usage_reset} is not modelled: usage is decayed only"
        )
    if sacct_file is None and slurm is None:
        raise AccountantError("no sacct source: give --sacct-file or run where Slurm answers")
    as_of = int(now if now is not None else time.time())
    half_life = settings.half_life_s
    qos_factors = {}
    if slurm is not None:
        try:
            qos_factors = slurm.qos_usage_factors()
        except SlurmError as exc:
            warnings.append(f"QOS UsageFactor not read ({exc}); 1.0 assumed")

    ledger = Ledger()
    path = ledger_path(config)
    if sacct_file is not None:
        table = sacct_mod.read_file(sacct_file)
        if now is None:
            last = max(int(table.end.max(initial=-1)), int((table.start + table.elapsed).max(initial=-1)))
            as_of = last if last > 0 else as_of
        settle = table.ran  # the whole dump counts: a what-if has no ledger
        provisional = np.zeros(table.n, dtype=bool)
        window_start = None
    else:
        ledger = Ledger.load(path) if use_ledger else Ledger()
        history = (
            acc.initial_history
            if acc.initial_history is not None
            else (10 * half_life if half_life > 0 else 365 * 86400)
        )
        window_start = (
            (ledger.watermark - acc.settle_delay) if ledger.watermark is not None else as_of - int(history)
        )
        if since is not None:
            window_start = min(window_start, since)
        fields = list(sacct_mod.FIELDS)
        gpuutil = settings.gpuutil_recorded and acc.read_gpuutil
        if gpuutil:
            fields[-1:-1] = ["NTasks", "TRESUsageInAve"]
        text = slurm.sacct_dump(
            fields,
            start=_sacct_time(window_start),
            end=_sacct_time(as_of + 1),
            allocations=not gpuutil,
            timeout=max(slurm.timeout, 600.0),
        )
        table = sacct_mod.parse(text, "sacct")
        new_watermark = as_of - acc.settle_delay
        if ledger.watermark is not None:
            new_watermark = max(new_watermark, ledger.watermark)
        ran = table.ran
        ended = table.end >= 0
        keys = table.keys()
        known = np.fromiter((k in ledger.settled for k in keys), dtype=bool, count=table.n)
        done = ended & (table.end < new_watermark)
        # runs that ended before the previous read window are in the ledger already (a report reaching
        # further back reads them for its tables, not to charge them again)
        fresh = (
            table.end >= (ledger.watermark - acc.settle_delay)
            if ledger.watermark is not None
            else np.ones(table.n, dtype=bool)
        )
        settle = ran & done & ~known & fresh
        provisional = ran & ~done
    counted = settle | provisional
    warnings += table.warnings()
    ch = charges_mod.compute(
        table,
        counted,
        as_of=as_of,
        half_life_s=half_life,
        alpha=acc.alpha,
        coverage_min=acc.coverage_min,
        basis=acc.basis,
        qos_usage_factor=qos_factors,
        alpha_by=acc.alpha_by,
    )

    base_slurm, base_stune = {}, {}
    if ledger.as_of is not None and ledger.usage:
        if ledger.half_life_s not in (None, half_life):
            warnings.append(
                f"PriorityDecayHalfLife changed ({ledger.half_life_s:g}s -> {half_life:g}s); "
                "stored usage is decayed with the new value from now on"
            )
        factor = float(charges_mod.decay_to(1.0, as_of - ledger.as_of, half_life))
        base_slurm = {k: v[0] * factor for k, v in ledger.usage.items()}
        base_stune = {k: v[1] * factor for k, v in ledger.usage.items()}
    settled_slurm = _sum_dicts(base_slurm, charges_mod.per_assoc(table, np.where(settle, ch.slurm, 0.0)))
    settled_stune = _sum_dicts(base_stune, charges_mod.per_assoc(table, np.where(settle, ch.stune, 0.0)))
    usage_slurm = _sum_dicts(
        settled_slurm, charges_mod.per_assoc(table, np.where(provisional, ch.slurm, 0.0))
    )
    usage_stune = _sum_dicts(
        settled_stune, charges_mod.per_assoc(table, np.where(provisional, ch.stune, 0.0))
    )

    if assoc_file:
        tree = load_tree_file(assoc_file)
    elif slurm is not None:
        tree = tree_from_slurm(slurm)
    else:
        tree = tree_mod.AssocTree.flat(list(usage_slurm) + table.assoc_keys)
    unknown = sorted({k for k in usage_slurm if k not in tree.index})
    if unknown:
        shown = ", ".join(f"{u}/{a}" for a, u in unknown[:5])
        warnings.append(
            f"{len(unknown)} association(s) with usage are not in the tree and are ignored: {shown}"
        )
    shares_slurm = tree_mod.compute(tree, usage_slurm, settings.algorithm, settings.damping)
    shares_stune = tree_mod.compute(tree, usage_stune, settings.algorithm, settings.damping)

    result = RunResult(
        as_of=as_of,
        settings=settings,
        table=table,
        charges=ch,
        counted=counted,
        settled_now=int(settle.sum()) if sacct_file is None else 0,
        provisional=int(provisional.sum()),
        usage_slurm=usage_slurm,
        usage_stune=usage_stune,
        shares_slurm=shares_slurm,
        shares_stune=shares_stune,
        tree=tree,
        ledger_path=None if sacct_file is not None or not use_ledger else path,
        window_start=window_start,
        warnings=warnings,
    )
    line = site_factor_line(
        settings.weight_fairshare, shares_slurm, shares_stune, config.site_factor.min, config.site_factor.max
    )
    if line is None:
        safe = 1 - settings.weight_fairshare
        raise config.error(
            "site_factor.min",
            f"{config.site_factor.min} is too high for these users: Slurm's "
            "own fair-share points already spread wider, so the clamp would tie users stune "
            f"orders apart; set it to {safe} (1 - PriorityWeightFairshare) or lower, or remove it",
        )
    result.site_line = line
    if read_sshare and slurm is not None:
        try:
            result.sshare = slurm.sshare()
        except SlurmError as exc:
            warnings.append(f"sshare not read: {exc}")
    if plan and slurm is not None:
        _plan(result, slurm, config)
        if result.changes and not dry_run:
            problems = settings.problems()
            if problems:
                raise AccountantError("; ".join(problems))
            by_target: dict = {}
            for change in result.changes:
                by_target.setdefault(change.target, []).append(str(change.job_id))
            for target, ids in sorted(by_target.items()):
                for at in range(
                    0, len(ids), 500
                ):  # scontrol takes a job list: one RPC per value, not per job
                    slurm.set_site_factor(",".join(ids[at : at + 500]), target)
            result.applied = True
    if sacct_file is None and not dry_run:
        ledger.usage = {
            k: [settled_slurm.get(k, 0.0), settled_stune.get(k, 0.0)]
            for k in set(settled_slurm) | set(settled_stune)
        }
        keep_from = new_watermark - acc.settle_delay
        settled = {k: e for k, e in ledger.settled.items() if e >= keep_from}
        for i in np.flatnonzero(settle).tolist():  # only runs the next read window can still return
            if table.end[i] >= keep_from:
                settled[keys[i]] = int(table.end[i])
        ledger.settled = settled
        ledger.watermark, ledger.as_of, ledger.half_life_s = int(new_watermark), as_of, half_life
        ledger.save(path)
    return result


def run_locked(config, slurm=None, **kwargs) -> RunResult:
    """run() under the ledger lock (live runs), so two accountants never settle the same job twice."""
    if kwargs.get("sacct_file") is not None:
        return run(config, slurm, **kwargs)
    with LedgerLock(ledger_path(config)):
        return run(config, slurm, **kwargs)


def _plan(result: RunResult, slurm, config) -> None:
    weight = result.settings.weight_fairshare
    deadband = config.site_factor.deadband
    pending = slurm.pending_jobs()
    if not pending:
        return
    current = {row.job_id: row.site for row in slurm.sprio()}
    for job_id, account, user in pending:
        if job_id not in current:  # held (priority 0) jobs are not in sprio; next run sees them
            continue
        key = (account, user)
        f_slurm = result.shares_slurm.factor(*key)
        f_stune = result.shares_stune.factor(*key)
        if f_slurm is None or f_stune is None:
            continue
        target = site_factor_target(config, weight, f_slurm, f_stune, result.site_line)
        have = current[job_id]
        if abs(target - have) > deadband:
            result.changes.append(SiteFactorChange(job_id, account, user, have, target, f_slurm, f_stune))
        else:
            result.kept += 1
