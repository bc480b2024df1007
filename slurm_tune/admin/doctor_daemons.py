"""`stune-admin doctor`'s checks of the usage pipeline's daemons (usage/pipeline.py): whether
stune-gpu-sampler measures on each GPU node and when the fair-share accountant last ran. A part of Doctor
(doctor.py), which supplies `add`, `env` and `slurm`."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

from ..errors import StuneError
from ..hostlist import expand_hostlist
from ..slurm.tres import accel_count, gres_gpus
from ..thisnode import expand, uses_node
from ..usage import pipeline, summary
from ..usage.config import SCHEMA, load_config
from .findings import ERROR, OK, WARNING

if TYPE_CHECKING:  # for annotations only
    from ..slurm.adapter import Slurm


class DaemonChecks:
    if TYPE_CHECKING:  # what Doctor (doctor.py) supplies, declared for mypy only
        env: dict[str, str]
        slurm: Slurm

        def add(self, severity: str, subject: str, message: str, fix: str = "") -> None: ...

    # ---- daemons -------------------------------------------------------------------------------------
    def check_accountant(self) -> None:
        try:
            from ..fairshare.accountant import ledger_path
        except ImportError as exc:  # the accountant extra (numpy) lives on the accountant host only
            self.add(
                WARNING,
                "accountant",
                f"not installed on this host ({exc.name} missing): its last run is not checked here",
                "run doctor on the accountant host, or pip install 'slurm-tune[accountant]'",
            )
            return

        try:
            config = load_config(self.env.get("STUNE_FAIRSHARE_CONFIG"))
        except StuneError as exc:
            self.add(ERROR, "accountant", str(exc))
            return
        path = ledger_path(config, self.env)  # the env file's, as the accountant's unit reads it
        try:
            age = time.time() - os.stat(path).st_mtime
        except OSError:
            self.add(
                WARNING,
                "accountant",
                f"no successful run recorded ({path} missing)",
                "systemctl enable --now stune-fairshare.timer on the accountant host",
            )
            return
        sev = OK if age < 3 * 300 else WARNING
        self.add(
            sev,
            "accountant",
            f"last successful run {age / 60:.0f} min ago ({path})",
            "systemctl status stune-fairshare.timer",
        )

    def check_sampler(self, nodes) -> None:
        """Whether stune-gpu-sampler runs on each GPU node, from the evidence the controller holds: the usage
        summary (AdminComment) of the last GPU job that ended on the node within a day. Its per-GPU means
        for that node are measured only where the sampler ran."""
        gpu_nodes = {n.name for n in nodes if gres_gpus(n.gres) or gres_gpus(n.gres, "npu")}
        if not gpu_nodes:
            return
        try:
            rows = self.slurm.sacct(
                ["JobIDRaw", "End", "NodeList", "AllocTRES", "AdminComment"], start="now-1days", end="now"
            )
        except StuneError as exc:
            self.add(WARNING, "sampler", f"cannot read the accounting records: {exc}")
            return
        last: dict[str, tuple[int, dict]] = {}
        for row in rows:
            try:
                ended = int(row.get("End") or 0)
                gpus = accel_count(row.get("AllocTRES", ""))
            except ValueError:
                continue
            if ended <= 0 or gpus <= 0:
                continue
            for name in set(expand_hostlist(row.get("NodeList", ""))) & gpu_nodes:
                if name not in last or ended > last[name][0]:
                    last[name] = (ended, row)
        idle, unstored, unsampled, sampled = [], [], [], []
        for name in sorted(gpu_nodes):
            if name not in last:
                idle.append(name)
                continue
            row = last[name][1]
            found = summary.parse(row.get("AdminComment", ""))
            if found is None:
                unstored.append(f"{name} (job {row.get('JobIDRaw')})")
            elif any(g.node == name and g.sm is not None for g in found.per_gpu):
                sampled.append(name)
            else:
                unsampled.append((self.no_record_cause(name), f"{name} (job {row.get('JobIDRaw')})"))
        # a warning: the accountant treats unmeasured GPU time by its coverage rule, no harm done
        for cause, where in _group(unsampled).items():
            if cause:
                self.add(WARNING, "sampler", f"not measuring on {', '.join(where)}: {cause[0]}", cause[1])
            else:
                self.add(
                    WARNING,
                    "sampler",
                    f"not sampling on {', '.join(where)}: the last GPU job's usage "
                    "summary has no measurement from there",
                    "systemctl is-active stune-gpu-sampler there, "
                    f"then check that the prolog 20-stune-jobgpus records jobs in {self.usage_template()}/jobs",
                )
        if unstored:
            self.add(
                WARNING,
                "sampler",
                f"no usage summary stored for the last GPU job on {', '.join(unstored)}: "
                "cannot tell whether the sampler runs there",
                "check the node epilog 20-stune-usage and EpilogSlurmctld (stune-usage-slurmctld)",
            )
        if idle:
            self.add(
                WARNING,
                "sampler",
                f"no GPU job ended on {', '.join(idle)} within a day: cannot tell whether "
                "the sampler runs there",
                "systemctl is-active stune-gpu-sampler on those nodes",
            )
        if sampled:
            self.add(OK, "sampler", f"measured the last GPU job on {', '.join(sampled)}")

    def usage_template(self) -> str:
        """STUNE_USAGE_DIR as the env file gives it to the hooks and the sampler (%n unexpanded)."""
        return self.env.get("STUNE_USAGE_DIR") or SCHEMA.complete({}, "", None)["usage"]["local_dir"]

    def no_record_cause(self, node: str) -> tuple[str, str] | None:
        """Why the sampler on `node` saw no job, where this host can see it: (cause, fix), or None. Job records
        in a literal `%n` directory (a prolog that does not expand %n wrote them: the sampler reads the
        expanded one); or no job directory where the sampler for `node` reads (nothing recorded a job there)."""
        template = self.usage_template()
        expanded = os.path.join(expand(template, node), pipeline.JOBS_DIR)
        literal = os.path.join(template, pipeline.JOBS_DIR)
        if uses_node(template) and os.path.isdir(literal):
            records = sorted(os.listdir(literal))
            if records:
                return (
                    f"job records ({len(records)}, e.g. job {records[-1]}) are in {literal}, a literal %n "
                    f"directory the sampler does not read (it reads {expanded}): the prolog that wrote them "
                    "does not expand %n",
                    "rerun `stune-admin install` on the nodes (the current 20-stune-jobgpus expands %n), "
                    f"then remove {literal}",
                )
        visible = uses_node(template) or node == socket.gethostname().split(".")[0]
        if visible and not os.path.isdir(expanded):
            return (
                f"{expanded} does not exist: no prolog recorded a job there and no sampler runs on it",
                "check PrologFlags=Alloc and that the Prolog glob reaches 20-stune-jobgpus; "
                "systemctl enable --now stune-gpu-sampler",
            )
        return None


def _group(items: list[tuple]) -> dict:
    """[(key, name)] -> {key: [names]}, in first-seen order."""
    out: dict = {}
    for key, name in items:
        out.setdefault(key, []).append(name)
    return out
