"""Baselines and verdicts. Pure functions over stored results (no Slurm, no files).

- A baseline is per partition, check and version fingerprint (driver, CUDA, NCCL, HCA firmware, kernel): the
  median over subjects (nodes, or pairs) of each subject's own median, and the median absolute deviation
  (MAD) around it. A subject is judged only against results with its latest fingerprint, so a changed driver
  starts a new baseline instead of comparing with the old one.
- A run is slow when it is below `median - max(mad_factor * 1.4826 * MAD, min_drop * median)` (the baseline
  needs `min_peers` subjects), or below the profile's absolute floor, or when the tool itself failed.
- A subject is an outlier when k of its last n runs (with that fingerprint) are slow, and its latest sweep
  did not pass. One bad run never acts; a later sweep that passes clears it. Bisection's runs (`bisect`)
  are judged by the bisection alone, never as a subject of their own.
"""

from __future__ import annotations

from collections import namedtuple

from .store import fingerprint_key

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

OUTLIER, OK, UNKNOWN = "outlier", "ok", "unknown"
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data


class Settings(namedtuple("Settings", "k n mad_factor min_drop min_peers floors")):
    __slots__ = ()

    @classmethod
    def from_profile(cls, profile: Profile) -> Settings:
        a = profile.active
        return cls(
            a.k,
            a.n,
            a.mad_factor,
            a.min_drop,
            a.min_peers,
            {name: c["floor"] for name, c in a.checks.to_dict().items() if c["floor"] is not None},
        )


class Baseline(namedtuple("Baseline", "check fingerprint median mad threshold floor subjects unit")):
    """threshold: below it a run is slow (None without enough peers); floor: the profile's absolute floor."""

    __slots__ = ()


class Verdict(namedtuple("Verdict", "subject check status reason value baseline slow runs fingerprint")):
    """value: the subject's median over its window; slow/runs: how many of its judged runs were slow."""

    __slots__ = ()


def median(values: list) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _windows(results, n):
    """(check, subject) -> (fingerprint dict, last n judged results with the subject's latest fingerprint).
    Bisection's one-off pairs are not judged again: they answered their sweep's question (stored for the
    record), are never measured again, and would otherwise stay slow, and re-bisected, for the whole window."""
    by_subject: dict = {}
    for r in results:  # oldest first
        if r.get("status") in ("ok", "fail") and not r.get("bisect"):
            by_subject.setdefault((r["check"], r["subject"]), []).append(r)
    out = {}
    for key, rows in by_subject.items():
        fp = rows[-1].get("fingerprint") or {}
        fkey = fingerprint_key(fp)
        same = [r for r in rows if fingerprint_key(r.get("fingerprint") or {}) == fkey]
        out[key] = (fp, fkey, same[-n:])
    return out


def baselines(results, settings: Settings) -> tuple[dict, dict]:
    """((check, fingerprint key) -> Baseline, the windows used)."""
    windows = _windows(results, settings.n)
    groups: dict = {}
    for (check, _subject), (_fp, fkey, rows) in windows.items():
        values = [r["value"] for r in rows if r["status"] == "ok" and r.get("value") is not None]
        if values:
            groups.setdefault((check, fkey), []).append(median(values))
    out = {}
    units = {r["check"]: r.get("unit", "") for r in results if r.get("unit")}
    for (check, fkey), values in groups.items():
        floor = settings.floors.get(check)
        med = median(values)
        mad = median([abs(v - med) for v in values])
        threshold = None
        if len(values) >= settings.min_peers:
            threshold = med - max(settings.mad_factor * MAD_SCALE * mad, settings.min_drop * med)
        out[(check, fkey)] = Baseline(
            check, fkey, med, mad, threshold, floor, len(values), units.get(check, "")
        )
    return out, windows


def slow_run(r: dict, base: Baseline | None, floor: float | None) -> bool:
    if r["status"] == "fail":
        return True
    v = r.get("value")
    if v is None:
        return False
    if floor is not None and v < floor:
        return True
    return base is not None and base.threshold is not None and v < base.threshold


def judge(results, settings: Settings) -> tuple[dict, list[Verdict]]:
    bases, windows = baselines(results, settings)
    verdicts = []
    for (check, subject), (fp, fkey, rows) in sorted(windows.items()):
        base = bases.get((check, fkey))
        floor = settings.floors.get(check)
        values = [r["value"] for r in rows if r["status"] == "ok" and r.get("value") is not None]
        value = median(values) if values else None
        has_values = any(r.get("value") is not None for r in rows)
        if has_values and floor is None and (base is None or base.threshold is None):
            peers = base.subjects if base else 0
            verdicts.append(
                Verdict(
                    subject,
                    check,
                    UNKNOWN,
                    f"no baseline: {peers} subject(s) with this "
                    f"fingerprint, need {settings.min_peers} (or set a floor)",
                    value,
                    base,
                    0,
                    len(rows),
                    fp,
                )
            )
            continue
        slow = [slow_run(r, base, floor) for r in rows]
        latest_sweep = rows[-1].get("sweep")
        latest = [s for r, s in zip(rows, slow) if r.get("sweep") == latest_sweep]
        n_slow = sum(slow)
        unit = rows[-1].get("unit", "")
        if n_slow >= settings.k and any(latest):
            worst = [r for r, s in zip(rows, slow) if s]
            verdicts.append(
                Verdict(
                    subject,
                    check,
                    OUTLIER,
                    _reason(check, worst, base, floor, n_slow, len(rows), unit),
                    value,
                    base,
                    n_slow,
                    len(rows),
                    fp,
                )
            )
        else:
            why = (
                f"{n_slow} of {len(rows)} runs slow (needs {settings.k})"
                if n_slow
                else f"{len(rows)} run(s) within the baseline"
            )
            if n_slow and not any(latest):
                why += "; the latest sweep passed"
            verdicts.append(Verdict(subject, check, OK, why, value, base, n_slow, len(rows), fp))
    return bases, verdicts


def _reason(check, worst, base, floor, n_slow, n_runs, unit) -> str:
    failed = [r for r in worst if r["status"] == "fail"]
    if failed:
        return f"active {check}: {failed[-1].get('detail', 'failed')[:120]} ({n_slow} of {n_runs} runs)"
    values = sorted(r["value"] for r in worst)
    seen = f"{median(values):.4g} {unit}".strip()
    ref = []
    if base is not None and base.threshold is not None:
        ref.append(f"partition median {base.median:.4g}")
    if floor is not None:
        ref.append(f"floor {floor:g}")
    where = worst[-1].get("detail") or ""
    where = (
        f"; {where[where.index('slowest') :].rstrip(')')[:80]}" if "slowest" in where else ""
    )  # the GPU at fault
    return f"active {check}: {seen} vs {', '.join(ref)} ({n_slow} of {n_runs} runs slow{where})"


def pair_members(subject: str) -> list[str]:
    """'a+b' or 'a+b/mlx5_0' (a pair measured on one HCA) -> ['a', 'b']."""
    return subject.split("/", 1)[0].split("+")


def pair_hca(subject: str) -> str:
    return subject.split("/", 1)[1] if "/" in subject else ""


def blame_pairs(verdicts: list[Verdict]) -> tuple[dict, list[Verdict]]:
    """From pair verdicts alone: a node in slow pairs with two or more different partners, each of which is
    in a good pair elsewhere, is named; other slow pairs stay open (for bisection).
    Returns ({node: reason}, open slow pairs)."""
    slow = [v for v in verdicts if v.status == OUTLIER]
    good_nodes = {m for v in verdicts if v.status == OK for m in pair_members(v.subject)}
    partners: dict = {}  # node -> check -> partner -> {hca}
    for v in slow:
        a, b = pair_members(v.subject)[:2]
        hca = pair_hca(v.subject)
        partners.setdefault(a, {}).setdefault(v.check, {}).setdefault(b, set()).add(hca)
        partners.setdefault(b, {}).setdefault(v.check, {}).setdefault(a, set()).add(hca)
    named = {}
    for node, by_check in sorted(partners.items()):
        for check, others in sorted(by_check.items()):
            vouched = {o for o in others if o in good_nodes}
            if len(vouched) >= 2:
                hcas = set.intersection(*(others[o] for o in vouched)) - {""}
                on = f" on {','.join(sorted(hcas))}" if hcas else ""
                named[node] = (
                    f"active {check}: slow{on} with {len(vouched)} partners that are fast elsewhere "
                    f"({','.join(sorted(vouched))})"
                )
                break
    still_open = [v for v in slow if not any(m in named for m in pair_members(v.subject))]
    return named, still_open


def bisect_plan(open_pairs: list[Verdict], good: list[str]) -> list[tuple[str, str]]:
    """For each member of an open slow pair, a known-good partner (not the other member): the pairs to test."""
    plan: list[tuple[str, str]] = []
    used: set[str] = set()
    for v in open_pairs:
        members = pair_members(v.subject)[:2]
        for m in members:
            if any(m == p[0] for p in plan):
                continue
            partner = next((g for g in good if g not in members and g not in used), None) or next(
                (g for g in good if g not in members), None
            )
            if partner is None:
                continue
            used.add(partner)
            plan.append((m, partner))
    return plan


def bisect_verdict(pair_subject: str, tests: dict) -> tuple[list[str], str]:
    """tests: member -> (slow: bool | None, partner, detail). Names the member(s) slow with a good partner
    (and the HCA, for a per-HCA check); if neither is, the path between the two (a switch port or cable) is
    at fault."""
    members = pair_members(pair_subject)[:2]
    hca = pair_hca(pair_subject)
    on = f" {hca}" if hca else ""
    slow = [m for m in members if tests.get(m, (None,))[0]]
    judged = [m for m in members if tests.get(m, (None,))[0] is not None]
    if slow:
        return slow, "; ".join(f"{m}{on}: slow with known-good {tests[m][1]} ({tests[m][2]})" for m in slow)
    if len(judged) == 2:
        return [], (
            f"{members[0]} and {members[1]} are each fast with known-good partners: the path between "
            "them (switch port, cable) is at fault"
        )
    return [], "not enough known-good partners to bisect"
