"""Why a job was slow, from its record: the evidence for usage/bottleneck.py read from the job's AdminComment
line (the GPU summary, the sampler's node counters, the steps file, the transport verdict) and the nodes'
fio baselines in the active-check store, and the `stune-job` document's sections built from them.

Nothing here measures: a number the record lacks stays "unmeasured" with why.
"""

from __future__ import annotations

import time

from ..active import store
from . import bottleneck, jobfiles, perf, steps
from .bottleneck import Evidence, Measure, Network, Storage
from .pipeline import admin_fields

BASELINE_CHECK = "disk_read"  # the active check whose fio read rate is a node's storage baseline (GB/s)
BASELINE_WINDOW_S = 90 * 86400
ROLE_WORDS = {"cache": "cache tier", "source": "dataset source", "disk": "local disk"}


def disk_baselines(
    partition: str, store_dir: str | None = None, now: float | None = None
) -> dict[str, float]:
    """{node: read bytes/s}: each node's latest passing fio read (active check `disk_read`) within the
    window; {} when the store has none or cannot be read."""
    now = time.time() if now is None else now
    try:
        results = store.load(store.store_dir(store_dir), partition, since=now - BASELINE_WINDOW_S, until=now)
    except OSError:
        return {}
    out: dict[str, float] = {}
    for r in results:  # oldest first: the latest wins
        if r.get("check") == BASELINE_CHECK and r.get("status") == "ok" and r.get("value"):
            out[r["subject"]] = float(r["value"]) * 1e9
    return out


def _roles(roles: str) -> str:
    return " and ".join(ROLE_WORDS.get(r, r) for r in roles.split("+") if r) or "device"


def evidence(summary, fields: dict[str, str], baselines: dict[str, float]) -> Evidence:
    """The bottleneck evidence of one job from its parsed usage summary (usage/summary.JobSummary or None)
    and its AdminComment fields."""
    job_perf = perf.parse_tokens(fields)
    stats = steps.parse_tokens(fields)
    transport, _counts = jobfiles.parse_comm(fields)
    if summary is not None and summary.covered > 0 and summary.eta is not None:
        gpu = Measure(100.0 * summary.eta)
    else:
        gpu = Measure(None, "no GPU samples in the job's record (the sampler did not see the job)")
    kw: dict = {
        "gpu_util": gpu,
        "drops": summary.drops if summary else 0,
        "gpus": summary.gpus if summary else 0,
    }
    if stats is not None and stats.dwait_p50 is not None:
        kw["data_wait"] = Measure(stats.dwait_p50)
    if transport is not None:
        kw["transport"] = [f"transport: {m}" for m in transport.messages]
        kw["transport_bad"] = transport.status in ("fallback", "no_gdr", "plugin_failed", "errors")
    if job_perf is None:
        why = "the sampler recorded no node counters for this job"
        kw.update(storage_why=why, network_why=why, cpu_share=Measure(None, why))
        return Evidence(**kw)
    if job_perf.clock is not None:
        kw["clock_share"] = Measure(job_perf.clock)
    devices = [d for d in job_perf.sto_devices if d.bps is not None]
    if devices:
        busiest = max(devices, key=lambda d: d.bps)
        rate = float(busiest.bps)
        if len(devices) == 1 and job_perf.sto_idle_bps is not None:
            rate = float(job_perf.sto_idle_bps)  # one device: its rate while the GPUs waited
        kw["storage"] = Storage(
            busiest.name,
            _roles(busiest.roles),
            busiest.node,
            rate,
            baselines.get(busiest.node) if "cache" in busiest.roles or "disk" in busiest.roles else None,
            job_perf.node_wide,
        )
    else:
        why = "; ".join(f"{role} {perf.reason_text(code)}" for role, code in _unmeasured(job_perf))
        kw["storage_why"] = why or "no storage device measured on the job's nodes"
    if job_perf.net_idle_frac is not None and job_perf.net_frac is not None:
        kw["network"] = Network(
            {"ib": "IB", "roce": "RoCE"}.get(job_perf.net_kind, job_perf.net_kind.upper() or "network"),
            float(job_perf.net_idle_frac),
            float(job_perf.net_frac),
            float(job_perf.net_idle_bps or 0.0),
            "",
            job_perf.node_wide,
        )
    elif job_perf.net_frac is not None:
        kw["network_why"] = "no sample fell in a GPU idle phase"
    else:
        kw["network_why"] = "no port with a known line rate was measured"
    cpu = job_perf.cpu_util
    kw["cpu_share"] = (
        Measure(cpu) if cpu is not None else Measure(None, perf.reason_text(job_perf.cpu_why or "no-cgroup"))
    )
    return Evidence(**kw)


def _links_line(job_perf) -> str:
    """The GPUs' host and peer links, per GPU (tx + rx): where a data-parallel job's traffic goes too."""
    parts = []
    for name, bps in (("PCIe", job_perf.pcie_bps), ("NVLink", job_perf.nvlink_bps)):
        parts.append(f"{name} {bottleneck.rate_words(bps)}" if bps is not None else f"{name} unmeasured")
    return "GPU links (per GPU, both directions): " + ", ".join(parts)


def _unmeasured(job_perf) -> list[tuple[str, str]]:
    return [(ROLE_WORDS.get(role, role), code) for role, code in job_perf.sto_unmeasured]


def why_sections(summary, admin_comment: str, partition: str, store_dir: str | None = None) -> dict:
    """The `bottleneck`, `transport`, `throughput` and `series` sections of a job's document."""
    fields = admin_fields(admin_comment or "")
    job_perf = perf.parse_tokens(fields)
    baselines = disk_baselines(partition, store_dir) if job_perf is not None and job_perf.sto_devices else {}
    diagnosis = bottleneck.diagnose(evidence(summary, fields, baselines))
    if job_perf is not None:
        diagnosis.lines.append(_links_line(job_perf))
    transport, counts = jobfiles.parse_comm(fields)
    stats = steps.parse_tokens(fields)
    return {
        "bottleneck": diagnosis.as_dict(),
        "transport": None
        if transport is None
        else {
            "status": transport.status,
            "messages": list(transport.messages),
            "nodes": dict(transport.by_status),
            "judged": counts[0] if counts else None,
            "ok": counts[1] if counts else None,
            "not_judged": counts[2] if counts else None,
        },
        "throughput": None if stats is None else stats.as_dict(),
        "series": {
            "network": _timeline(job_perf.net_tl) if job_perf else [],
            "storage": _timeline(job_perf.sto_tl) if job_perf else [],
            "storage_peak_bps": job_perf.sto_peak if job_perf else None,
        },
    }


BOUND_KEY = "bound"  # the AdminComment token the controller adds: the verdict when the record was stored


def bound_of(line: str, partition: str, store_dir: str | None = None) -> str:
    """The bottleneck verdict of a job's record line (what `stune-job` says first), for its `bound=` token."""
    from . import summary

    fields = admin_fields(line)
    job_perf = perf.parse_tokens(fields)
    baselines = (
        disk_baselines(partition, store_dir) if partition and job_perf and job_perf.sto_devices else {}
    )
    return bottleneck.diagnose(evidence(summary.parse(line), fields, baselines)).bound


def _timeline(text: str) -> list:
    return [None if c == "-" else int(c) * 100.0 / 9 for c in text if c == "-" or c.isdigit()]


def why_text(doc: dict) -> list[str]:
    """The verdict's lines for `stune-job`'s text, after the charge."""
    b = doc.get("bottleneck")
    if not b:
        return []
    lines = [f"  why: {b['headline']}", f"       {b['advice']}"]
    lines += [f"  {line}" for line in b["lines"]]
    t = doc.get("throughput")
    if t and t.get("sps_p50") is not None:
        spread = f" ({t['sps_p10']:.0f}-{t['sps_p90']:.0f})" if t.get("sps_p10") is not None else ""
        wait = f", data wait {100 * t['dwait_p50']:.0f} %" if t.get("dwait_p50") is not None else ""
        lines.append(f"  throughput: {t['sps_p50']:.0f} samples/s{spread}{wait} over {t['steps']} steps")
    elif doc.get("transport") is None:
        lines.append("  throughput: not recorded (write $STUNE_STEPS_FILE from your script: docs/steps.md)")
    return lines
