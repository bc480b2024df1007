"""The accounting side of the adapter: `SlurmAccounting`, the reads of the fair-share accountant and of the
usage and job reports. sacct (rows by field list, and the raw dump a bulk reader parses itself), sshare, sprio
and the pending jobs, sacctmgr's associations and QOS usage factors, and scontrol's config (the priority
settings). sacctargs.py builds sacct's command line; associations.py reads `sacctmgr show assoc`.
"""

from __future__ import annotations

from ..text import is_digits
from .reader import SlurmReader
from .sacctargs import free_text_last, sacct_argv
from .scontrol import parse_config

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from .associations import Association
    from .records import PrioRow, ShareRow


class SlurmAccounting(SlurmReader):
    """The accounting and fair-share reads of one cluster; `Slurm` (adapter.py) adds the node, job and
    partition queries and every update."""

    def config(self) -> dict[str, str]:
        """`scontrol show config` as a dict (PriorityDecayHalfLife, PriorityFlags, ...)."""
        return parse_config(self.run(["scontrol", "show", "config"]))

    def sacct(
        self,
        fields: list[str],
        *,
        start: int | str | None = None,
        end: int | str | None = None,
        job_ids: list[str] | None = None,
        states: list[str] | None = None,
        all_users: bool = True,
        allocations: bool = True,
        extra: list[str] | None = None,
    ) -> list[dict[str, str]]:
        """Accounting rows as dicts keyed by the requested field names.

        Princeton jobstats style: -P, an explicit field list, free text last, SLURM_TIME_FORMAT=%s. At most
        one free-text field may be asked for; it is moved last and split off with a bounded split, so a '|'
        in a comment cannot shift the columns."""
        ordered = free_text_last(fields)
        argv = sacct_argv(ordered, ["-n", *(["--allusers"] if all_users else [])], allocations, start, end)
        if job_ids:
            argv.append(f"--jobs={','.join(str(j) for j in job_ids)}")
        if states:
            argv.append(f"--state={','.join(states)}")
        argv += extra or []
        rows = []
        for number, line in enumerate(self.run(argv).splitlines(), 1):
            if not line:
                continue
            values = line.split("|", len(ordered) - 1)
            if len(values) != len(ordered):
                raise self._unknown(
                    argv,
                    None,
                    f"line {number} has {len(values)} fields, expected {len(ordered)}: {line[:120]!r}",
                )
            rows.append(dict(zip(ordered, values)))
        return rows

    def sshare(self) -> list[ShareRow]:
        from .records import ShareRow  # at first use, not with the adapter (test_slurm_adapter)

        fields = [
            "Account",
            "User",
            "RawShares",
            "NormShares",
            "RawUsage",
            "NormUsage",
            "EffectvUsage",
            "FairShare",
            "LevelFS",
        ]
        argv = ["sshare", "-P", "-n", "-a", "-l", f"--format={','.join(fields)}"]
        rows = []
        # Every line is a row: one that is not (a changed layout) fails the read rather than going missing.
        for number, cols in self._rows(argv, len(fields)):
            try:
                # RawShares is `parent` for an association with Fairshare=parent: no shares of its own
                nums = [None if c == "parent" and i == 0 else _number(c) for i, c in enumerate(cols[2:])]
            except ValueError as exc:
                raise self._unknown(argv, None, f"line {number}: {exc}") from None
            if not cols[0].strip():
                raise self._unknown(argv, None, f"line {number} has no account: {'|'.join(cols)[:120]!r}")
            rows.append(ShareRow(cols[0].strip(), cols[1].strip(), *nums))
        return rows

    def pending_jobs(self) -> list[tuple[int, str, str]]:
        """(job id, account, user) of every pending job from one plain listing: the accountant reads tens of
        thousands each run, and `--json` spends 2.7 kB and 100 keys on each (bench_fairshare.py --cycle). An
        array job's tasks not started yet are one line, its base id (%A), as sprio lists them."""
        argv = ["squeue", "-h", "-t", "PENDING", "-o", "%A|%a|%u"]
        out = []
        for number, (job_id, account, user) in self._rows(argv, 3):
            if not is_digits(job_id.strip()):
                raise self._unknown(argv, None, f"line {number}: job id {job_id!r} is not a number")
            out.append((int(job_id), account.strip(), user.strip()))
        return out

    def sprio(self, job_ids: list[int] | None = None) -> list[PrioRow]:
        """Pending jobs' priority factors (all, or the ones in job_ids). Slurm 24.11.5's sprio rejects a
        list of ids ("Invalid job id: N"), so a list is read as every pending job and filtered here."""
        from .records import PrioRow  # at first use, not with the adapter (test_slurm_adapter)

        argv = ["sprio", "-h", "-o", "%i|%u|%Y|%S|%A|%F|%f|%r"]
        wanted = {int(j) for j in job_ids} if job_ids else None
        if wanted is not None and len(wanted) == 1:
            argv += ["-j", str(next(iter(wanted)))]
        rows = []
        for number, cols in self._rows(argv, 8):
            cols = [c.strip() for c in cols]
            try:
                if not is_digits(cols[0]):
                    raise ValueError(f"job id {cols[0]!r} is not a number")
                row = PrioRow(
                    int(cols[0]),
                    cols[1],
                    int(cols[2]),
                    int(cols[3]),
                    int(cols[4]),
                    int(cols[5]),
                    float(cols[6]),
                    cols[7],
                )
            except ValueError as exc:
                raise self._unknown(argv, None, f"line {number}: {exc}") from None
            if wanted is None or row.job_id in wanted:
                rows.append(row)
        return rows

    def associations(self) -> list[Association]:
        """Every association of this cluster, in the order of Slurm's own association tree, the order its
        fair-share code walks siblings in: lft on releases before 23.11, Lineage (which replaced lft) from
        23.11 on. shares is None for Fairshare=parent; a Share that is neither a number nor `parent` is a
        SlurmError naming the command (associations.py holds the rules)."""
        from .associations import (  # at first use, not with the adapter (test_slurm_adapter)
            AssocFormatError,
            parse_associations,
        )
        from .version import ASSOC_ORDER_BY_LINEAGE  # at first use, not with the adapter (test_slurm_adapter)

        fields = [
            "Cluster",
            "Account",
            "User",
            "ParentName",
            "Share",
            "Partition",
            "Lineage" if self.version() >= ASSOC_ORDER_BY_LINEAGE else "LFT",
        ]
        argv = ["sacctmgr", "-n", "-P", "show", "assoc", f"format={','.join(fields)}"]
        out = self.run(argv)
        try:
            return parse_associations(out, fields, cluster=self.config().get("ClusterName"))
        except AssocFormatError as exc:
            raise self._unknown(argv, None, f"line {exc.line}: {exc}") from None

    def qos_usage_factors(self) -> dict[str, float]:
        """QOS name -> UsageFactor. A QOS without a factor is left out (Slurm then charges x1); a line that is
        not `name|number` is a SlurmFormatError, never a QOS silently charged at the default."""
        argv = ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,UsageFactor"]
        factors = {}
        for number, (name, value) in self._rows(argv, 2):
            try:
                factor = _number(value)
            except ValueError as exc:
                raise self._unknown(argv, None, f"line {number}: {exc}") from None
            if not name.strip():
                raise self._unknown(argv, None, f"line {number} has no QOS name: {name}|{value}")
            if factor is not None:
                factors[name.strip()] = factor
        return factors

    def sacct_dump(
        self,
        fields: list[str],
        *,
        start: int | str | None = None,
        end: int | str | None = None,
        allocations: bool = True,
        duplicates: bool = True,
        timeout: float | None = None,
    ) -> str:
        """Raw `sacct -P` text WITH its header line, for bulk readers that parse columns themselves (the
        fair-share accountant reads a million rows this way). Free text goes last, as in sacct()."""
        argv = sacct_argv(
            free_text_last(fields), ["-a", *(["-D"] if duplicates else [])], allocations, start, end
        )
        return self.run(argv, timeout=timeout)

    def node_events_dump(self, start: str, end: str | None = None) -> str:
        """Raw `sacctmgr -n -P show event event=node` text since `start` (until `end`): the nodes' DOWN and
        DRAIN events with their reasons, `NodeName|TimeStart|TimeEnd|State|Reason` (Reason, free text, last),
        for the reliability report (reliability/events.py). Times are sacctmgr's ISO local time: it refuses
        epoch seconds ("Invalid time specification")."""
        argv = ["sacctmgr", "-n", "-P", "show", "event", "event=node", f"start={start}"]
        argv += [f"end={end}"] if end else []
        return self.run([*argv, "format=NodeName,TimeStart,TimeEnd,State,Reason"])


def _number(text: str) -> float | None:
    """A number column of a `-P` listing: None when Slurm prints none; ValueError for anything else."""
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number") from None
