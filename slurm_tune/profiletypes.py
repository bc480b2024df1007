"""The typed face of a partition profile, for mypy: what `Profile.fabric.hcas[0].port` and every other key hold.

At run time a profile is a read-only attribute view over validated data (frozen.Frozen, profilestore.Profile):
no class per section, so the hot paths build nothing. These classes give mypy the schema's types, section by
section, and nothing imports this module at run time (profilestore names it under TYPE_CHECKING).
tests/test_profiles.py checks them against profilecheck.PROFILE_SCHEMA: every key, and the type its spec
returns (Str: str, Int and Duration: int, Float: float, Bool: bool, Size: int, Nullable: `| None`, List: a
tuple, Map: a Frozen mapping, Section: its class here).
"""

from __future__ import annotations

from .frozen import Frozen


class Hca:
    device: str
    port: int
    netdev: str | None


class Fabric:
    type: str
    hcas: tuple[Hca, ...]
    rate_gbps: int | None
    socket_ifname: str | None
    gid_index: int | None


class Nccl:
    ib_timeout: int
    ib_retry_cnt: int
    net_gdr_level: str | None
    env: Frozen
    transport_log: bool


class VersionRule:
    min: str | None
    allowed: tuple[str, ...]


class Versions:
    hca_firmware: Frozen
    gpu_driver: VersionRule | None
    cuda_driver: VersionRule | None
    vbios: VersionRule | None
    npu_driver: VersionRule | None
    npu_firmware: VersionRule | None
    cann: VersionRule | None
    rocm: VersionRule | None
    amdgpu_driver: VersionRule | None


class Gpu:
    count: int
    gres: str | None
    model: str | None
    nvlink_down: str
    persistence_mode: bool


class Numa:
    bind: str
    cpu_bind: str


class Cache:
    path: str | None
    quota: int | None
    high_watermark: float
    low_watermark: float
    freshness: str
    stage: tuple[str, ...]


class Counter:
    degraded: int
    fail: int | None


class Counters:
    symbol_error: Counter
    link_downed: Counter
    link_error_recovery: Counter
    port_rcv_errors: Counter


class Xid:
    burst_window: int
    hold: int
    recur_window: int
    codes: Frozen


class Health:
    max_gpu_temp_c: int
    counters: Counters
    probe_timeout_s: float
    drain_max_fraction: float
    drain_window: int
    unknown_degrade_after: int
    comm_degrade_after: int
    comm_window: int
    xid: Xid
    hang_degrade_after: int
    hang_drain_after: int
    lemon_window: int
    lemon_alpha: float
    lemon_margin: float
    lemon_min_failures: int
    lemon_mark: bool


class Remediation:
    enabled: bool
    reset: bool
    reboot: bool
    reset_command: tuple[str, ...]
    reset_timeout: int
    reboot_timeout: int
    forget_after: int


class Recovery:
    requeue: bool
    signal: str | None
    signal_seconds: int
    signal_when: str
    avoid_culprit: bool
    expedite: bool


class Placement:
    exclude_degraded: bool
    switches: int | None
    switches_max_wait: int


class Active:
    checks: Frozen
    tools: Frozen
    runs: int
    k: int
    n: int
    mad_factor: float
    min_drop: float
    min_peers: int
    drain: bool
    gate_resume: bool
    reservation: str | None
    qos: str | None
    nice: int
    disk_path: str | None
    disk_size: int
    window: int
    bisect: bool


class Validate:
    python: str | None
    reference: str | None
    time_limit: int
    seed: int
    tolerances: Frozen
    steps: int
    cold_steps: int
    band: float


class Scaling:
    devices: tuple[int, ...]
    max_nodes: int | None
    knee: float
    time_limit: int
    command: str | None
    multinode_command: str | None


class IdlePolicy:
    enabled: bool
    threshold: float
    warn_after: int
    cancel_after: int
    min_coverage: float
    exempt_interactive: bool
    exempt_qos: tuple[str, ...]
    exempt_accounts: tuple[str, ...]


class Drift:
    gdr_module: bool
    pcie_acs: bool
    iommu: tuple[str, ...] | None
    cpu_governor: str | None
    thp: tuple[str, ...] | None
    numa_balancing: bool | None
    slurmd_memlock: bool
    fabricmanager: bool
    gpu_power_limit_w: int | None
    gpu_sm_clock_mhz: int | None
    gpu_mem_clock_mhz: int | None
    roce_mtu_min: int | None
    sysctls: Frozen


class Hccn:
    check: bool
    require_ip: bool
    net_health: str


class Accel:
    max_temp_c: int | None
    max_power_w: float | None
    health_warning: str
    ecc_uncorrected: str
    ecc_corrected_max: int | None
    links_down: str
    hccn: Hccn
    tools: Frozen


class Hccl:
    socket_ifname: str | None
    if_ip: bool
    connect_timeout: int | None
    exec_timeout: int | None
    buffsize: int | None
    rank_table: bool
    env: Frozen


class Rccl:
    fine_grain_pcie: bool
    env: Frozen


class Sections:
    """A profile's sections (profilestore.Profile adds its name, source, digest and key origins)."""

    partition: str
    description: str
    fabric: Fabric
    nccl: Nccl
    versions: Versions
    accelerator: str
    gpu: Gpu
    numa: Numa
    cache: Cache
    health: Health
    remediation: Remediation
    recovery: Recovery
    placement: Placement
    active: Active
    idle_policy: IdlePolicy
    accel: Accel
    hccl: Hccl
    rccl: Rccl
    drift: Drift
    validate: Validate
    scaling: Scaling
