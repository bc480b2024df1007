"""The job environment's rules: one table, read by every side that sets or explains a variable.

Each row says, for one variable: when it applies (the partition's fabric), where it is decided (`submit`:
stune-sbatch sets it from the profile; `submit, node`: stune-sbatch sets it and the TaskProlog narrows or
unsets it on each node; `node`: only the node can tell, the TaskProlog / stune-env detect it), how it is
derived, and whose value wins. The readers:
- sbatch/plan.py turns the rows into the plan's settings (the dry run, the submission, the cli_filter's
  data.lua through build_plan);
- nodeenv/taskenv.py decides the node side by the same conditions and the one `hca_value`, and
  stune-task-prolog's --node-summary names the node-side rows;
- docs/sbatch.md shows `markdown_table()` (tests check it is the same).

Plain data and small functions: the TaskProlog imports it before every task (the hot-path import rule).
"""

from __future__ import annotations

from ..gdr import profile_expects_gdr
from .managed import MASTER_PORT_BASE, MASTER_PORT_SPAN

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

SUBMIT, REFINED, NODE = "submit", "submit, node", "node"
# NCCL's transport log (issue 24): the level and subsystems the epilog's verdict needs (docs/comm.md)
TRANSPORT_LOG_LEVEL, TRANSPORT_LOG_SUBSYS = "INFO", "INIT,NET"

# Whose value wins. USER: the user's own value (environment, --export NAME=, --export-file) is kept at
# submission (the dry run says so), and on each node stune (re)sets the variable only while it is absent or
# still holds the value stune set (STUNE_MANAGED). ONCE: set when absent, once per job; never refined.
USER = "yours wins"
ONCE = "set once per job when absent; yours wins"


def nccl(profile) -> bool:
    """NCCL's variables apply: NVIDIA (NCCL) and AMD (RCCL reads NCCL_*); not Ascend (HCCL)."""
    return profile.accelerator != "ascend"


def ascend(profile) -> bool:
    return profile.accelerator == "ascend"


def rdma(fabric) -> bool:
    return fabric.type in ("ib", "roce")


def gid_fixed(fabric) -> bool:
    return fabric.type == "roce" and fabric.gid_index is not None


def gid_detected(fabric) -> bool:
    """A RoCE fabric whose profile leaves the GID index to each node."""
    return fabric.type == "roce" and fabric.gid_index is None


def socket(fabric) -> bool:
    return bool(fabric.socket_ifname)


def hca_value(ports) -> str:
    """NCCL_IB_HCA in exact-match form, `=device:port,...`: `=` makes mlx5_1 not also match mlx5_11. `ports`:
    the profile's fabric HCAs at submission, the ACTIVE ones on a node (anything with .device and .port)."""
    return "=" + ",".join(f"{p.device}:{p.port}" for p in ports)


class Rule:
    """One row. `when(profile)`: whether it applies; `value(profile)`: what stune-sbatch sets, or None when
    the node decides; `cites`: the profile keys its value comes from; `rule`: the rule, when the value is
    not simply those keys'; `how`: the derivation in words (docs); `note`: what the dry run says beside it
    (`{ifname}`: the profile's socket interface); `many(profile)`: for a family of variables, the
    (name, value, key) of each."""

    __slots__ = (
        "name",
        "applies",
        "when",
        "decided",
        "value",
        "cites",
        "rule",
        "how",
        "note",
        "user",
        "many",
    )

    def __init__(
        self,
        name: str,
        applies: str,
        when,
        decided: str,
        value,
        cites: tuple[str, ...],
        rule: str,
        how: str,
        note: str = "",
        user: str = USER,
        many=None,
    ):
        self.name, self.applies, self.when, self.decided, self.value = name, applies, when, decided, value
        self.cites, self.rule, self.how, self.note, self.user, self.many = cites, rule, how, note, user, many

    def values(self, profile: Profile) -> list[tuple[str, str | None, tuple[str, ...]]]:
        """(name, value or None for the node's to detect, the profile keys it cites) for `profile`."""
        if self.many is not None:
            return self.many(profile)
        return [(self.name, None if self.value is None else self.value(profile), self.cites)]

    def source(self, profile: Profile, cites: tuple[str, ...]) -> str:
        """Where a value comes from, for the dry run: `key @ file:line`, or `rule: ... @ file:line`."""
        if self.rule:
            return f"rule: {self.rule}" + (
                " @ " + "; ".join(profile.origin(k) for k in cites) if cites else ""
            )
        return "; ".join(f"{k} @ {profile.origin(k)}" for k in cites)

    def note_for(self, profile: Profile) -> str:
        return self.note.format(ifname=profile.fabric.socket_ifname or "the socket interface")


def _nccl_env(profile: Profile) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [
        (name, str(value), (f"nccl.env.{name}",))
        for name, value in sorted(profile.nccl.env.to_dict().items())
    ]


def _always(profile: Profile) -> bool:
    return True


def hccl_ifname(profile: Profile) -> str | None:
    """HCCL_SOCKET_IFNAME: hccl.socket_ifname, else the fabric's socket interface."""
    return profile.hccl.socket_ifname or profile.fabric.socket_ifname


def _hccl_env(profile: Profile) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [(n, str(v), (f"hccl.env.{n}",)) for n, v in sorted(profile.hccl.env.to_dict().items())]


def _rccl_env(profile: Profile) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [(n, str(v), (f"rccl.env.{n}",)) for n, v in sorted(profile.rccl.env.to_dict().items())]


def _hccl_value(key: str) -> Rule:
    """HCCL_<KEY> from hccl.<key>, when the profile sets it (empty: HCCL's own default)."""
    return Rule(
        f"HCCL_{key.upper()}",
        f"ascend, `hccl.{key}` set",
        lambda p: ascend(p) and getattr(p.hccl, key) is not None,
        SUBMIT,
        lambda p: str(getattr(p.hccl, key)),
        (f"hccl.{key}",),
        "",
        "the profile's value",
    )


# In the order the plan lists them (and STUNE_MANAGED records them).
RULES: tuple[Rule, ...] = (
    Rule(
        "NCCL_IB_HCA",
        "ib, roce; nvidia, amd",
        lambda p: nccl(p) and rdma(p.fabric),
        REFINED,
        lambda p: hca_value(p.fabric.hcas),
        ("fabric.hcas",),
        "",
        "`=device:port` of each fabric HCA (exact match: the storage HCA is left out); on "
        "each node, only the ACTIVE ports (none ACTIVE: unset)",
        "narrowed to the ACTIVE ports on each node by stune-task-prolog / stune-env",
    ),
    Rule(
        "NCCL_IB_GID_INDEX",
        "roce, `fabric.gid_index` set; nvidia, amd",
        lambda p: nccl(p) and gid_fixed(p.fabric),
        SUBMIT,
        lambda p: str(p.fabric.gid_index),
        ("fabric.gid_index",),
        "",
        "the profile's index; each node warns when it is not a RoCE v2 GID there",
    ),
    Rule(
        "NCCL_IB_GID_INDEX",
        "roce, `fabric.gid_index` empty; nvidia, amd",
        lambda p: nccl(p) and gid_detected(p.fabric),
        NODE,
        None,
        (),
        "roce fabric with fabric.gid_index empty",
        "the RoCE v2, IPv4-mapped GID index on each ACTIVE port's "
        "netdev (the ports disagree: the most common, and a message)",
        "the RoCE v2, IPv4-mapped GID on each HCA's netdev, detected on each node",
    ),
    Rule(
        "NCCL_IB_TIMEOUT",
        "ib, roce; nvidia, amd",
        lambda p: nccl(p) and rdma(p.fabric),
        SUBMIT,
        lambda p: str(p.nccl.ib_timeout),
        ("nccl.ib_timeout",),
        "",
        "the profile's value",
    ),
    Rule(
        "NCCL_IB_RETRY_CNT",
        "ib, roce; nvidia, amd",
        lambda p: nccl(p) and rdma(p.fabric),
        SUBMIT,
        lambda p: str(p.nccl.ib_retry_cnt),
        ("nccl.ib_retry_cnt",),
        "",
        "the profile's value",
    ),
    Rule(
        "NCCL_NET_GDR_LEVEL",
        "ib, roce, `nccl.net_gdr_level` set; nvidia, amd",
        lambda p: nccl(p) and rdma(p.fabric) and bool(p.nccl.net_gdr_level),
        SUBMIT,
        lambda p: p.nccl.net_gdr_level,
        ("nccl.net_gdr_level",),
        "",
        "the profile's value",
    ),
    Rule(
        "NCCL_IB_DISABLE",
        "tcp; nvidia, amd",
        lambda p: nccl(p) and not rdma(p.fabric),
        SUBMIT,
        lambda p: "1",
        ("fabric.type",),
        "fabric.type tcp (no RDMA)",
        "`1`: no RDMA",
    ),
    Rule(
        "NCCL_NET_GDR_LEVEL",
        "tcp; nvidia, amd",
        lambda p: nccl(p) and not rdma(p.fabric),
        SUBMIT,
        lambda p: "0",
        ("fabric.type",),
        "fabric.type tcp: no GPUDirect RDMA",
        "`0`: no GPUDirect RDMA",
    ),
    Rule(
        "NCCL_SOCKET_IFNAME",
        "`fabric.socket_ifname` set; nvidia, amd",
        lambda p: nccl(p) and socket(p.fabric),
        REFINED,
        lambda p: p.fabric.socket_ifname,
        ("fabric.socket_ifname",),
        "",
        "the profile's interface (NCCL's prefix syntax); unset on a node where none that matches is up",
        "checked on each node: the interface must exist and be up",
    ),
    Rule(
        "GLOO_SOCKET_IFNAME",
        "`fabric.socket_ifname` set",
        lambda p: socket(p.fabric),
        NODE,
        None,
        ("fabric.socket_ifname",),
        "",
        "the first interface up on the node that matches `fabric.socket_ifname` (gloo takes exact names)",
        "the first interface matching {ifname} that is up on each node (gloo takes exact names)",
    ),
    Rule(
        "MASTER_ADDR",
        "all",
        _always,
        NODE,
        None,
        (),
        "distributed training rendezvous",
        "the job's first node: its IPv4 address on the first up `fabric.socket_ifname` interface, set by the "
        "batch step there (else the node's name); later steps inherit it",
        "the job's first node: its IPv4 address on {ifname} (else its name), once per job, the same on every "
        "rank",
        ONCE,
    ),
    Rule(
        "MASTER_PORT",
        "all",
        _always,
        NODE,
        None,
        (),
        "distributed training rendezvous",
        f"`{MASTER_PORT_BASE} + job id mod {MASTER_PORT_SPAN}`",
        f"per job: {MASTER_PORT_BASE} + job id mod {MASTER_PORT_SPAN}, so two jobs sharing a node do not collide",
        ONCE,
    ),
    Rule(
        "NCCL_DEBUG",
        "all, `nccl.transport_log` on; nvidia, amd",
        lambda p: nccl(p) and p.nccl.transport_log,
        NODE,
        None,
        ("nccl.transport_log",),
        "",
        f"`{TRANSPORT_LOG_LEVEL}` on each node of a multi-node job, unless you set `NCCL_DEBUG` or "
        "`NCCL_DEBUG_FILE` (then the job's transport is not judged)",
        "multi-node jobs: NCCL's transport log for the epilog's verdict (docs/comm.md)",
    ),
    Rule(
        "NCCL_DEBUG_SUBSYS",
        "all, `nccl.transport_log` on; nvidia, amd",
        lambda p: nccl(p) and p.nccl.transport_log,
        NODE,
        None,
        ("nccl.transport_log",),
        "",
        f"`{TRANSPORT_LOG_SUBSYS}`, with stune's `NCCL_DEBUG` (what the transport verdict reads)",
        "with stune's NCCL_DEBUG",
    ),
    Rule(
        "NCCL_DEBUG_FILE",
        "all, `nccl.transport_log` on; nvidia, amd",
        lambda p: nccl(p) and p.nccl.transport_log,
        NODE,
        None,
        ("nccl.transport_log",),
        "",
        "`<job dir>/nccl.%h.%p.log`, with stune's `NCCL_DEBUG`: one log per process in the job's directory on "
        "the node, read by the epilog",
        "one log per process in the job's directory on each node (yours only)",
    ),
    Rule(
        "STUNE_STEPS_FILE",
        "all",
        _always,
        NODE,
        None,
        (),
        "the job's directory on each node",
        "`<job dir>/steps.jsonl`: where a training script may write its step records (docs/steps.md)",
        "where your script may record its steps (docs/steps.md); summarised in your job's record",
    ),
    Rule(
        "nccl.env",
        "nvidia, amd",
        nccl,
        SUBMIT,
        None,
        (),
        "",
        "every `nccl.env` entry, verbatim",
        many=_nccl_env,
    ),
    # Ascend: HCCL (docs/accelerators.md, "Communication settings"); nodeenv/ascendenv.py decides the node's rows
    Rule(
        "HCCL_SOCKET_IFNAME",
        "ascend, a socket interface set",
        lambda p: ascend(p) and bool(hccl_ifname(p)),
        SUBMIT,
        hccl_ifname,
        ("hccl.socket_ifname", "fabric.socket_ifname"),
        "hccl.socket_ifname, else fabric.socket_ifname",
        "`hccl.socket_ifname`, else `fabric.socket_ifname`: the host interface of HCCL's bootstrap",
    ),
    Rule(
        "HCCL_IF_IP",
        "ascend, `hccl.if_ip` on",
        lambda p: ascend(p) and p.hccl.if_ip and bool(hccl_ifname(p)),
        NODE,
        None,
        ("hccl.if_ip",),
        "",
        "the IPv4 address of HCCL_SOCKET_IFNAME's first up interface on each node",
        "the IPv4 address of the HCCL interface, detected on each node",
    ),
    _hccl_value("connect_timeout"),
    _hccl_value("exec_timeout"),
    _hccl_value("buffsize"),
    Rule(
        "ASCEND_RT_VISIBLE_DEVICES",
        "ascend",
        ascend,
        NODE,
        None,
        (),
        "the job's NPUs on each node",
        "the job's NPUs on the node, Slurm's GRES ids (gres/npu: `scontrol show job -d`, asked once per job "
        "and node; gres/gpu: SLURM_JOB_GPUS)",
        "the job's NPUs on each node: Slurm sets no variable for gres/npu",
    ),
    Rule(
        "RANK_TABLE_FILE",
        "ascend, `hccl.rank_table` on",
        lambda p: ascend(p) and p.hccl.rank_table,
        NODE,
        None,
        ("hccl.rank_table",),
        "",
        "multi-node jobs: `<job dir>/rank_table.json`, HCCL's rank table v1.0 from the allocation and each "
        "node's published NPU port addresses",
        "multi-node jobs: HCCL's rank table, from the allocation and each node's NPU port addresses",
    ),
    Rule(
        "hccl.env", "ascend", ascend, SUBMIT, None, (), "", "every `hccl.env` entry, verbatim", many=_hccl_env
    ),
    # AMD: RCCL reads the NCCL_* rows above; these are ROCm's own
    Rule(
        "HSA_FORCE_FINE_GRAIN_PCIE",
        "amd, GPUDirect RDMA expected, `rccl.fine_grain_pcie` on",
        lambda p: p.accelerator == "amd" and p.rccl.fine_grain_pcie and profile_expects_gdr(p),
        SUBMIT,
        lambda p: "1",
        ("rccl.fine_grain_pcie", "nccl.net_gdr_level"),
        "",
        "`1`: RCCL's RDMA from GPU memory needs fine-grained PCIe memory",
    ),
    Rule(
        "rccl.env",
        "amd",
        lambda p: p.accelerator == "amd",
        SUBMIT,
        None,
        (),
        "",
        "every `rccl.env` entry, verbatim",
        many=_rccl_env,
    ),
)

# What the node sets or refines, in the table's order (stune-task-prolog --node-summary prints these).
NODE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(r.name for r in RULES if r.decided != SUBMIT))
# What stune-sbatch sets and each node then narrows or unsets (the cli_filter leaves these to the node).
REFINED_NAMES: tuple[str, ...] = tuple(dict.fromkeys(r.name for r in RULES if r.decided == REFINED))


def markdown_table() -> str:
    """docs/sbatch.md's table of the rules (tests/test_nodeenv.py checks the docs hold exactly this)."""
    rows = [
        "| variable | applies | decided | from | how | who wins |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in RULES:
        name = f"`{r.name}.NAME` → `NAME`" if r.many else f"`{r.name}`"
        where = ", ".join(f"`{k}`" for k in r.cites) or (f"`{r.name}`" if r.many else f"rule: {r.rule}")
        rows.append(f"| {name} | {r.applies} | {r.decided} | {where} | {r.how} | {r.user} |")
    return "\n".join(rows) + "\n"
