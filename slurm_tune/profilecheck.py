"""The partition profiles' schema and their validation (`profiles.py` is the face, `profilestore.py` the
loading and the cache). Only a profile cache miss, `stune-admin check-profiles` and the tools that read the
schema itself load this module: building the schema costs ~1.4 ms (see docs/speed.md).
"""

from __future__ import annotations

import hashlib
import os

from . import accelspec, profilehealth, validatespec
from .driftspec import DRIFT, with_fabric_defaults
from .errors import ConfigError
from .schema import (
    Bool,
    Duration,
    Float,
    Int,
    List,
    Map,
    Nullable,
    Section,
    Size,
    Str,
    Where,
    deep_merge,
    load_yaml,
)
from .text import parse_vendor_version, parse_version

SITE_FILE = "site.yaml"

FABRICS = ("ib", "roce", "tcp")
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
# The active checks' names (slurm_tune/active/checks.py holds what each one runs).
ACTIVE_CHECKS = (
    "nccl_allreduce",
    "nvbandwidth",
    "dcgm_diag",
    "disk_read",
    "ib_write_bw",
    "nccl_pair",
    "iperf3",
    *("numeric", "hccl_allreduce", "rccl_allreduce"),  # and Ascend's HCCL Test, AMD's rccl-tests (issue 26)
)


def _version_rule(doc: str) -> Nullable:
    return Nullable(
        Section(
            {
                "min": Nullable(Str(), doc="lowest validated version; newer passes"),
                "allowed": List(Str(), doc="exact versions validated for this partition"),
            }
        ),
        doc=doc,
    )


def _counter(degraded: int, fail: int | None) -> Section:
    return Section(
        {
            "degraded": Int(degraded, min=0, doc="increase per health run above which the port is degraded"),
            "fail": Nullable(Int(min=0), default=fail, doc="increase per run above which the node fails"),
        }
    )


HCA = Section(
    {
        "device": Str(doc="RDMA device name, e.g. mlx5_0"),
        "port": Int(1, min=1, max=255),
        "netdev": Nullable(Str(), doc="RoCE: the Ethernet interface bound to this port (GID ndevs)"),
    }
)

PROFILE_SCHEMA = Section(
    {
        "partition": Str(doc="the Slurm partition name"),
        "description": Str("", nonempty=False),
        "fabric": Section(
            {
                "type": Str(
                    choices=FABRICS, doc="ib: InfiniBand; roce: RDMA over Converged Ethernet v2; tcp: no RDMA"
                ),
                "hcas": List(
                    HCA, unique=True, doc="the fabric HCA ports NCCL may use; storage NICs are left out"
                ),
                "rate_gbps": Nullable(Int(min=1), doc="expected link rate per port; lower is degraded"),
                "socket_ifname": Nullable(
                    Str(), doc="interface for NCCL bootstrap/socket traffic, e.g. ib0, eth0"
                ),
                "gid_index": Nullable(
                    Int(min=0, max=255), doc="RoCE: fixed GID index; empty means detect per node"
                ),
            }
        ),
        "nccl": Section(
            {
                "ib_timeout": Int(22, min=1, max=31, doc="NCCL_IB_TIMEOUT: 4.096us * 2^n per retry"),
                "ib_retry_cnt": Int(7, min=0, max=7, doc="NCCL_IB_RETRY_CNT"),
                "net_gdr_level": Nullable(
                    Str(choices=GDR_LEVELS), doc="NCCL_NET_GDR_LEVEL; empty lets NCCL decide"
                ),
                "env": Map(Str(), key_spec=Str(prefix="NCCL_"), doc="further NCCL_* variables, verbatim"),
                "transport_log": Bool(
                    True,
                    doc="multi-node jobs: NCCL's INIT,NET log into the job's directory on each node, read by "
                    "the epilog to prove the transport NCCL used (docs/comm.md); the user's NCCL_DEBUG wins",
                ),
            }
        ),
        "versions": Section(
            {
                "hca_firmware": Map(
                    _version_rule("fw_ver"), doc="by board_id (e.g. MT_0000000223) or HCA model"
                ),
                "gpu_driver": _version_rule("NVIDIA driver, e.g. 535.161.08"),
                "cuda_driver": _version_rule("CUDA driver API version, e.g. 12.2"),
                "vbios": _version_rule("GPU VBIOS"),
                **accelspec.version_keys(_version_rule),
            }
        ),
        "gpu": Section(
            {
                "count": Int(0, min=0, max=64, doc="GPUs (or NPUs) per node; 0 skips their checks"),
                "gres": accelspec.GPU_GRES,
                "model": Nullable(Str(), doc="substring of the NVML name, e.g. 'H100 80GB HBM3'"),
                "nvlink_down": Str("fail", choices=("degraded", "fail")),
                "persistence_mode": Bool(True, doc="persistence mode off is degraded"),
            }
        ),
        "numa": Section(
            {
                "bind": Str(
                    "stune",
                    choices=("stune", "slurm", "none"),
                    doc="stune: stune-bind per task; slurm: --gpu-bind=closest and --cpu-bind; none",
                ),
                "cpu_bind": Str("cores", doc="--cpu-bind value when bind is slurm"),
            }
        ),
        "cache": Section(
            {
                "path": Nullable(
                    Str(absolute_path=True), doc="node-local cache tier; empty disables staging"
                ),
                "quota": Nullable(Size(), doc="bytes this tier may use, e.g. 1.5T"),
                "high_watermark": Float(0.90, min=0.0, max=1.0),
                "low_watermark": Float(0.75, min=0.0, max=1.0),
                "freshness": Str("fast", choices=("fast", "strict")),
                "stage": List(Str(), doc="SRC[:NAME] staged for every job of the partition"),
            }
        ),
        "health": Section(
            {
                "max_gpu_temp_c": Int(85, min=30, max=120),
                "counters": Section(
                    {
                        "symbol_error": _counter(10, None),
                        "link_downed": _counter(0, 3),
                        "link_error_recovery": _counter(3, None),
                        "port_rcv_errors": _counter(10, None),
                    }
                ),
                "probe_timeout_s": Float(5.0, min=0.1, max=120),
                "drain_max_fraction": Float(
                    0.10, min=0.0, max=1.0, doc="circuit breaker: share of a partition"
                ),
                "drain_window": Duration(3600, doc="circuit breaker window"),
                "unknown_degrade_after": Int(
                    3,
                    min=0,
                    max=1000,
                    doc="periodic runs in a row with the same unknown finding (a read that hangs, "
                    "a counter stuck saturated) after which the node is marked degraded; "
                    "0 never",
                ),
                "comm_degrade_after": Int(
                    3,
                    min=0,
                    max=1000,
                    doc="multi-node jobs on a node whose NCCL fell back to sockets on an RDMA fabric, or ran "
                    "without the GPUDirect RDMA the profile expects, within comm_window, after which the node "
                    "is marked degraded (docs/comm.md); 0 never",
                ),
                "comm_window": Duration(7 * 86400, doc="how far back comm_degrade_after counts"),
                "xid": profilehealth.XID,
                **profilehealth.HANG_KEYS,
                # lemon nodes (`stune-health lemons`, docs/reliability.md): scored from sacct, per partition
                "lemon_window": Duration(30 * 86400, doc="how far back the lemon scoring reads sacct"),
                "lemon_alpha": Float(
                    0.01,
                    min=1e-9,
                    max=0.5,
                    doc="family-wise false-lemon rate over the partition's nodes (Holm)",
                ),
                "lemon_margin": Float(
                    1.5,
                    min=1.0,
                    max=100.0,
                    doc="a lemon breaks multi-node jobs over this many times its share",
                ),
                "lemon_min_failures": Int(3, min=1, max=100000, doc="fewer failed jobs never make a lemon"),
                "lemon_mark": Bool(
                    False, doc="`stune-health lemons --mark` marks this partition's lemons degraded"
                ),
            }
        ),
        "remediation": profilehealth.REMEDIATION,
        "recovery": Section(
            {
                "requeue": Bool(True),
                "signal": Nullable(
                    Str(), default="USR1", doc="sent to the batch shell before the time limit"
                ),
                "signal_seconds": Int(300, min=1, max=65535),
                # trapped: stune-sbatch adds --signal only to a script that traps the signal (bash's default action
                # for SIGUSR1 is to exit, which would fail a job plain sbatch completes); always: every job.
                "signal_when": Str(
                    "trapped", choices=("trapped", "always"), doc="which jobs get recovery.signal"
                ),
                # issue 25 section 5: health/requeue.py, docs/health.md "Requeue that avoids the culprit"
                "avoid_culprit": Bool(
                    False,
                    doc="a multi-node job that failed on a node stune then drains or marks is requeued "
                    "once without that node (opt-in)",
                ),
                "expedite": Bool(
                    False,
                    doc="stune-sbatch submits multi-node jobs with --requeue=expedite (Slurm 25.11.3+; "
                    "needs SlurmctldParameters=enable_expedited_requeue, else Slurm refuses the job)",
                ),
            }
        ),
        "placement": Section(
            {
                "exclude_degraded": Bool(True, doc="multi-node jobs avoid nodes stune marked degraded"),
                "switches": Nullable(Int(min=1), doc="--switches count for multi-node jobs"),
                "switches_max_wait": Duration(600),
            }
        ),
        "active": Section(
            {
                "checks": Map(
                    Section(
                        {
                            "command": Nullable(
                                Str(),
                                doc="the tool's command line ({gpus} {hca} {port} {server} {path} "
                                "{file} {tcp_port} are filled in); empty: the built-in one",
                            ),
                            "time_limit": Duration(
                                600, doc="Slurm time limit of one check job (all its runs)"
                            ),
                            "floor": Nullable(
                                Float(min=0.0),
                                doc="absolute floor in the check's unit; below it is an outlier",
                            ),
                        }
                    ),
                    key_spec=Str(choices=ACTIVE_CHECKS),
                    doc="the active checks this partition runs, by name",
                ),
                "tools": Map(
                    Str(absolute_path=True),
                    doc="tool name -> absolute path, e.g. all_reduce_perf: /opt/nccl-tests/"
                    "build/all_reduce_perf; default: found on the node's PATH",
                ),
                "runs": Int(3, min=1, max=20, doc="measurements per check and sweep"),
                "k": Int(2, min=1, max=50, doc="an outlier must be slow in k ..."),
                "n": Int(3, min=1, max=50, doc="... of its last n measurements"),
                "mad_factor": Float(
                    3.0, min=0.5, max=20.0, doc="slow: below the median by this many scaled MADs ..."
                ),
                "min_drop": Float(
                    0.10, min=0.0, max=0.9, doc="... and by at least this fraction of the median"
                ),
                "min_peers": Int(3, min=2, doc="fewest subjects with one fingerprint for a median baseline"),
                "drain": Bool(False, doc="drain outliers instead of marking them degraded (opt-in)"),
                "gate_resume": Bool(
                    False, doc="a node stune drained is resumed only after its active checks pass"
                ),
                "reservation": Nullable(Str(), doc="run sweep jobs inside this (maintenance) reservation"),
                "qos": Nullable(Str(), doc="QOS for sweep jobs, e.g. a low-priority scavenger QOS"),
                "nice": Int(10000, min=0, max=2147483645, doc="--nice for sweep jobs: below every user job"),
                "disk_path": Nullable(
                    Str(absolute_path=True), doc="where the disk check reads; default cache.path"
                ),
                "disk_size": Size(1 << 30, doc="bytes the disk check reads"),
                "window": Duration(30 * 86400, doc="how far back results count for baselines and k-of-n"),
                "bisect": Bool(True, doc="test both members of a slow pair against good partners"),
            }
        ),
        **accelspec.SECTIONS,  # accelerator, accel, hccl, rccl (issue 26)
        **validatespec.SECTIONS,  # validate, scaling (issue 27)
        "drift": DRIFT,  # tuning drift: the host settings the nodes are tuned to (driftspec.py)
        # stune-fairshare idle-policy (docs/fairshare.md): off unless enabled, judged over a sliding window
        "idle_policy": Section(
            {
                "enabled": Bool(False, doc="warn, then cancel, jobs whose GPUs stay idle"),
                "threshold": Float(
                    5.0, min=0.0, max=100.0, doc="GPU utilization (%) below which a GPU counts as idle"
                ),
                "warn_after": Duration(
                    1800, doc="warn once the last this-long window is below the threshold"
                ),
                "cancel_after": Duration(
                    7200, doc="cancel once the last this-long window is below the threshold"
                ),
                "min_coverage": Float(
                    0.9,
                    min=0.5,
                    max=1.0,
                    doc="share of the window that must be sampled; below it the job is left alone",
                ),
                "exempt_interactive": Bool(
                    True, doc="never act on interactive jobs (salloc/srun without a batch script)"
                ),
                "exempt_qos": List(Str(), doc="QOS names never acted on"),
                "exempt_accounts": List(Str(), doc="accounts never acted on"),
            }
        ),
    }
)

# site.yaml: the same sections, all optional, merged under every partition.
SITE_SCHEMA = Section(
    {
        "defaults": Section(
            {k: v for k, v in PROFILE_SCHEMA.fields.items() if k not in ("partition", "description")}
        )
    }
)


def _cross_checks(data: dict, where: Where) -> None:
    fabric = data["fabric"]
    if fabric["type"] in ("ib", "roce") and not fabric["hcas"]:
        raise where.error("fabric.hcas", f"a {fabric['type']} fabric needs at least one HCA")
    if fabric["type"] == "tcp":
        if fabric["hcas"]:
            raise where.error("fabric.hcas", "a tcp fabric uses no HCAs; remove them or use ib/roce")
        if not fabric["socket_ifname"]:
            raise where.error("fabric.socket_ifname", "a tcp fabric needs the socket interface")
    if fabric["type"] == "roce":
        for i, hca in enumerate(fabric["hcas"]):
            if not hca["netdev"] and fabric["gid_index"] is None:
                raise where.error(
                    f"fabric.hcas[{i}].netdev",
                    "RoCE GID detection needs the netdev bound to each HCA (or a fixed gid_index)",
                )
    cache = data["cache"]
    if cache["low_watermark"] >= cache["high_watermark"]:
        raise where.error(
            "cache.low_watermark", f"must be below high_watermark ({cache['high_watermark']:g})"
        )
    versions = data["versions"]
    for name, rule in [(f"versions.hca_firmware.{k}", v) for k, v in versions["hca_firmware"].items()] + [
        (f"versions.{k}", versions[k]) for k in ("gpu_driver", "cuda_driver", "vbios", *accelspec.VERSIONS)
    ]:
        if rule is not None and rule["min"] is None and not rule["allowed"]:
            raise where.error(name, "give `min` or `allowed`")
        if rule is not None and rule["min"] is not None and rule["allowed"]:
            raise where.error(name, "give either `min` or `allowed`, not both")
        if rule is None:
            continue
        hex_parts = name == "versions.vbios"
        for version in rule["allowed"] + ([rule["min"]] if rule["min"] is not None else []):
            vendor = name.removeprefix("versions.") in accelspec.VERSIONS  # 24.1.rc2: parse_vendor_version
            if (parse_vendor_version(version) if vendor else parse_version(version, hex_parts)) is None:
                form = "dot-separated hex numbers" if hex_parts else "dot-separated numbers"
                raise where.error(
                    name,
                    f"{version!r} is not a version ({form}, e.g. "
                    f"{'96.00.74.00.0D' if hex_parts else '20.31.1014'})",
                )
    gpu = data["gpu"]
    if gpu["count"] == 0 and gpu["model"]:
        raise where.error("gpu.model", "a GPU model is set but gpu.count is 0")
    profilehealth.check(data, where)
    accelspec.check(data, where)
    recovery = data["recovery"]
    if recovery["expedite"] and not (recovery["avoid_culprit"] and recovery["requeue"]):
        raise where.error(
            "recovery.expedite",
            "needs recovery.requeue and recovery.avoid_culprit: stune releases the jobs Slurm holds after an "
            "expedited requeue that no epilog explained",
        )
    active = data["active"]
    if active["k"] > active["n"]:
        raise where.error("active.k", f"k ({active['k']}) cannot exceed n ({active['n']})")


def version_key(version: str) -> tuple:
    """Numeric tuple of a well-formed decimal dotted version ('20.31.1014' -> (20, 31, 1014)); () otherwise."""
    return parse_version(version) or ()


def _digest(data: dict) -> str:
    return hashlib.sha256(repr(sorted(_items(data))).encode()).hexdigest()[:16]


def _items(data, prefix=""):
    for k, v in data.items():
        if isinstance(v, dict):
            yield from _items(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", repr(v)


def _validate_all(directory: str, names: list[str]) -> dict[str, dict]:
    """Every profile among `names` (the YAML files of `directory`, profilestore._yaml_files), validated."""
    site_defaults: dict = {}
    site_lines: dict[str, list] = {}
    if SITE_FILE in names:
        path = os.path.join(directory, SITE_FILE)
        raw, where = load_yaml(path)
        site = SITE_SCHEMA.check(raw, "", where)
        site_defaults = site.get("defaults", {})
        site_lines = {
            k.removeprefix("defaults."): [path, v]
            for k, v in where.lines.items()
            if k.startswith("defaults.")
        }
    profiles: dict[str, dict] = {}
    for name in names:
        if name == SITE_FILE:
            continue
        path = os.path.join(directory, name)
        raw, where = load_yaml(path)
        if raw is None:
            raise ConfigError(path, None, "", "the file is empty")
        checked = PROFILE_SCHEMA.check(raw, "", where)
        merged = with_fabric_defaults(deep_merge(site_defaults, checked))
        data = PROFILE_SCHEMA.complete(merged, "", where)
        _cross_checks(data, where)
        partition = data["partition"]
        if partition in profiles:
            raise where.error(
                "partition", f"partition {partition!r} is already defined in {profiles[partition]['_source']}"
            )
        lines = dict(site_lines)
        lines.update({k: [path, v] for k, v in where.lines.items() if k})
        data["_digest"] = _digest(data)
        data["_source"] = path
        data["_lines"] = lines
        profiles[partition] = data
    return profiles
