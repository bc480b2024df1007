"""The usage pipeline's and the accountant's config: one YAML file (fairshare.yaml), validated with
file:line errors. Here, below both, so the sampler, the epilogs and `stune-fairshare` take it from one place.

Looked up as --config, else $STUNE_FAIRSHARE_CONFIG, else /etc/stune/fairshare.yaml. A missing default file
means "all defaults"; a file named explicitly must exist.
"""

from __future__ import annotations

import os

from .. import thisnode
from ..errors import ConfigError
from ..frozen import Frozen
from ..schema import Bool, Duration, Float, Int, Map, Nullable, Section, Str, load_yaml

DEFAULT_PATH = "/etc/stune/fairshare.yaml"
ENV_PATH = "STUNE_FAIRSHARE_CONFIG"
ENV_STATE_DIR = (
    "STUNE_FAIRSHARE_STATE_DIR"  # wins over accountant.state_dir (`stune-admin install --prefix` sets it)
)

SCHEMA = Section(
    {
        "accountant": Section(
            {
                "alpha": Float(
                    1.0,
                    min=0.0,
                    max=100.0,
                    doc="idle penalty: charge = Slurm's charge x (1 + alpha x (1 - eta))",
                ),
                "alpha_by": Section(
                    {
                        "qos": Map(
                            Float(min=0.0, max=100.0), doc="alpha for jobs of this QOS, e.g. {debug: 0}"
                        ),
                        "partition": Map(Float(min=0.0, max=100.0), doc="alpha for jobs in this partition"),
                        "account": Map(Float(min=0.0, max=100.0), doc="alpha for jobs of this account"),
                    },
                    doc="alpha per QOS, partition or account (the first that names the job wins, in that order); "
                    "0 exempts (e.g. an interactive or debug QOS is never charged for idleness)",
                ),
                "coverage_min": Float(
                    0.8,
                    min=0.0,
                    max=1.0,
                    doc="share of held GPU-seconds that must be sampled before eta is trusted",
                ),
                "basis": Str(
                    "billing",
                    choices=("billing", "gpu"),
                    doc="billing: Slurm's own charge (billing TRES x time), so eta = 1 reproduces Slurm "
                    "exactly; gpu: GPUs x time",
                ),
                "settle_delay": Duration(300, doc="jobs that ended less than this ago are re-read each run"),
                "initial_history": Nullable(
                    Duration(), doc="first run reads this far back; default 10 half-lives"
                ),
                "state_dir": Str(
                    "/var/lib/stune/fairshare",
                    absolute_path=True,
                    doc="the ledger (settled usage and the sacct watermark)",
                ),
                "read_gpuutil": Bool(
                    True, doc="also read Slurm's gres/gpuutil where AccountingStorageTRES has it"
                ),
            }
        ),
        "site_factor": Section(
            {
                "min": Nullable(
                    Int(),
                    doc="lowest SiteFactor; default -2 x PriorityWeightFairshare. The line is chosen "
                    "within it (never clamped after); a minimum no line fits is refused",
                ),
                "max": Int(0, doc="highest SiteFactor; 0 means penalties only"),
                "deadband": Int(
                    2, min=0, doc="a pending job's SiteFactor is left alone when within this of the target"
                ),
            }
        ),
        "usage": Section(
            {
                "local_dir": Str(
                    "/var/lib/stune/usage",
                    absolute_path=True,
                    doc="node-local: the prolog's GPU records and the sampler's per-job accumulators",
                ),
                "spool_dir": Str(
                    "/var/spool/stune/usage",
                    absolute_path=True,
                    doc="shared by the nodes and the controller: per-node job summaries",
                ),
                "interval": Float(1.0, min=0.05, max=3600.0, doc="sampler period, seconds"),
                "collect_wait": Duration(30, doc="EpilogSlurmctld waits this long for every node's summary"),
                "spool_max_age": Duration(
                    86400, doc="an incomplete job directory is stored as-is and removed after this"
                ),
            }
        ),
        "report": Section(
            {
                "window": Duration(7 * 86400, doc="how far back `report` looks by default"),
                "top_jobs": Int(10, min=0, max=1000),
                "busy_util": Float(95.0, min=0.0, max=100.0, doc="SM utilization counted as 'busy' (~100%)"),
                "idle_power_w": Float(
                    100.0, min=0.0, doc="mean power below which a busy GPU is flagged for review"
                ),
                "prometheus_textfile": Nullable(
                    Str(absolute_path=True), doc="node_exporter textfile path written by every report/apply"
                ),
            }
        ),
    }
)


class FairshareConfig(Frozen):
    __slots__ = ()

    @property
    def source(self) -> str:
        return self._data.get("_source") or "built-in defaults"

    def error(self, key: str, problem: str) -> ConfigError:
        """A setting that validated on its own but cannot be honoured at run time: file:line: key: problem."""
        return ConfigError(self.source, self._data.get("_lines", {}).get(key), key, problem)


def config_path(explicit: str | None = None) -> tuple[str, bool]:
    """(path, must_exist)."""
    if explicit:
        return explicit, True
    env = os.environ.get(ENV_PATH)
    if env:
        return env, True
    return DEFAULT_PATH, False


def load_config(explicit: str | None = None) -> FairshareConfig:
    path, must_exist = config_path(explicit)
    if not must_exist and not os.path.exists(path):
        data = SCHEMA.complete({}, "", None)
        data["_source"] = None
        return FairshareConfig(data)
    raw, where = load_yaml(path)
    checked = SCHEMA.check(raw, "", where)
    data = SCHEMA.complete(checked, "", where)
    lo, hi = data["site_factor"]["min"], data["site_factor"]["max"]
    if lo is not None and lo > hi:
        raise where.error("site_factor.min", f"{lo} is above site_factor.max ({hi})")
    data["_source"] = path
    data["_lines"] = dict(where.lines)
    return FairshareConfig(data)


def usage_dirs(
    config: FairshareConfig | None = None, node: str | None = None, expand: bool = True
) -> tuple[str, str]:
    """(node-local dir, shared spool dir): $STUNE_USAGE_DIR / $STUNE_USAGE_SPOOL win over the config, so a
    hook can point at per-node directories without a config file of its own. `%n` in either becomes this
    node's name (or `node`), as in every other stune path; expand=False returns the templates."""
    local = os.environ.get("STUNE_USAGE_DIR")
    spool = os.environ.get("STUNE_USAGE_SPOOL")
    if not (local and spool):
        cfg = config or load_config()
        local, spool = local or cfg.usage.local_dir, spool or cfg.usage.spool_dir
    if not expand:
        return local, spool
    return thisnode.expand(local, node), thisnode.expand(spool, node)


def accountant_state_dir(config: FairshareConfig, environ=None) -> str:
    """The accountant's ledger directory: $STUNE_FAIRSHARE_STATE_DIR (the env file of an install with
    --prefix) wins over accountant.state_dir, as $STUNE_USAGE_DIR does over usage.local_dir."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_STATE_DIR) or config.accountant.state_dir
