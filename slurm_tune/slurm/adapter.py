"""The Slurm adapter: `Slurm`, a handle on one cluster. Every other part of stune talks to Slurm through it.

The backend is the Slurm CLI: `--json` for the node and job lists, `-P`/`-o` output elsewhere (sacct, whose
rows are read by field list, and scontrol, sshare, sprio, which have no --json in 22.05). pyslurm only builds
against the exact Slurm release it was made for. Every call has a timeout; any failure raises SlurmError
with the command, its exit code and Slurm's message. Output the adapter does not understand raises SlurmError
naming the command and the Slurm release.

This module builds each command and reads its answer; the rest of the package does one job each: spawn.py
runs the process, sacctargs.py builds sacct's command line, records.py and scontrol.py parse records,
associations.py reads `sacctmgr show assoc`, version.py knows the release and where output changes shape with
it.

Hot path (stune-sbatch): see docs/speed.md. Processes start through spawn.py; json, the records,
associations.py and version.py are imported by the methods that read them.
"""

from __future__ import annotations

import os

from ..errors import SlurmError, SlurmFormatError
from ..text import is_digits
from .commands import SlurmCommands
from .sacctargs import free_text_last, sacct_argv
from .scontrol import parse_config, parse_records
from .spawn import spawn_capture

# The release per (sinfo executable, PATH): read once per process.
_VERSIONS: dict[tuple[str, str], SlurmVersion] = {}


class Slurm(SlurmCommands):
    """A handle on one cluster: its client commands (SlurmCommands: where they are, slurm.conf, the timeout,
    running them, `calls`), and every query and update stune makes."""

    # ---- the Slurm release ------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        """The release of the Slurm client commands this handle runs, read once per process and executable
        directory (`sinfo --version`: 'slurm 24.11.5', Debian's 'slurm-wlm 22.05.8')."""
        key = (self.executable("sinfo"), os.environ.get("PATH", ""))
        found = _VERSIONS.get(key)
        if found is None:  # not in self.calls: it reaches no daemon, and RPC counts stay as they were
            argv = ["sinfo", "--version"]
            try:
                rc, out, err = spawn_capture(argv, None, self.env(), self.timeout, key[0])
            except TimeoutError:
                raise SlurmError(argv, None, f"no answer within {self.timeout:g}s") from None
            except OSError as exc:
                raise SlurmError(argv, 127, f"cannot run sinfo: {exc.strerror}") from None
            if rc != 0:
                raise SlurmError(argv, rc, err or out)
            from .version import parse_version, warn_if_untested

            found = parse_version(out, argv)
            _VERSIONS[key] = found
            warn_if_untested(found)
        return found

    # ---- reading ---------------------------------------------------------------------------------------
    def _json(self, argv: list[str], key: str, out: str | None = None) -> list[dict]:
        """The `key` list of a Slurm JSON document (argv's stdout, or `out` when already run); SlurmError for
        Slurm's own errors and for any document that has no such list (a format this adapter does not know)."""
        import json

        if out is None:
            out = self.run(argv)
        try:
            doc = json.loads(out)
        except ValueError as exc:
            raise self._unknown(argv, None, f"unreadable JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise self._unknown(argv, None, "not a JSON object")
        errors = doc.get("errors") or []
        if not isinstance(errors, list):
            raise self._unknown(argv, doc, "'errors' is not a list")
        errors = [e for e in errors if e]
        if errors:
            raise SlurmError(
                argv,
                0,
                "; ".join(str(e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors),
            )
        records = doc.get(key)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise self._unknown(argv, doc, f"no '{key}' list")
        return records

    def _unknown(self, argv: list[str], doc, problem: str) -> SlurmFormatError:
        """A SlurmFormatError for output of a layout this adapter does not know, naming the whole command and
        the release (from the document's own meta when it has one, else the detected release)."""
        from .version import document_release

        release = document_release(doc)
        if release is None:
            try:  # the error path may spend one more command on naming the release
                release = self.version().release
            except SlurmError:
                release = None
        return SlurmFormatError(argv, release, problem)

    def nodes(self, names: list[str] | None = None) -> list[Node]:
        """Every node (or the ones named, in that order; unknown names are left out). One call:
        `sinfo --json` on 22.05, `scontrol --json show node` on 23.02 and later, whose sinfo --json groups
        nodes by partition and state instead of listing them."""
        from .records import RECORD_ERRORS, node_from_data_parser, node_from_v0038
        from .version import NODES_FROM_SCONTROL_JSON

        if self.version() < NODES_FROM_SCONTROL_JSON:
            argv = ["sinfo", "--json"] + (["-n", ",".join(names)] if names else [])
            parse = node_from_v0038
        else:
            argv = ["scontrol", "--json", "show", "node"] + ([",".join(names)] if names else [])
            parse = node_from_data_parser
        text = None
        if names and parse is node_from_data_parser:
            # 24.11 answers an unknown name with an empty list and a warning; an error (other releases)
            # means the same thing
            rc, text, err = self.run_full(argv)
            if rc != 0:
                message = (err or text).strip()
                if not _is_unknown_node_error(message):
                    raise SlurmError(argv, rc, message)
                if len(names) == 1:
                    return []
                known = {n.name: n for n in self.nodes()}  # one bad name fails the whole list
                return [known[name] for name in names if name in known]
        out = []
        for record in self._json(argv, "nodes", text):
            try:
                out.append(parse(record))
            except RECORD_ERRORS as exc:
                raise self._unknown(argv, None, f"node record {exc!r}") from None
        # 22.05 ignores -n under --json, and sinfo repeats a node per partition: keep the nodes asked for,
        # once each, in that order
        if names:
            by_name = {n.name: n for n in out}
            return [by_name[name] for name in names if name in by_name]
        seen: dict[str, Node] = {}
        for n in out:
            seen.setdefault(n.name, n)
        return list(seen.values())

    def node(self, name: str) -> Node:
        found = self.nodes([name])
        if not found:
            raise SlurmError(["scontrol", "show", "node", name], 1, f"node {name} not found")
        return found[0]

    def jobs(
        self,
        *,
        job_ids: list[int] | None = None,
        states: list[str] | None = None,
        users: list[str] | None = None,
        partition: str | None = None,
    ) -> list[Job]:
        """Jobs slurmctld knows, finished ones included (until MinJobAge) unless `states` narrows them.
        The filters go to squeue (23.02+ honours them under --json; 22.05 ignores them) and are applied
        here as well. A state filter matches the base state or a flag (REQUEUED, COMPLETING)."""
        argv = ["squeue", "--json"]
        if job_ids:
            argv += ["-j", ",".join(str(j) for j in job_ids)]
        # 23.02+ leaves finished jobs out by default, as plain squeue does; 22.05 lists them all
        argv += ["-t", ",".join(states)] if states else ["--states=all"]
        if users:
            argv += ["-u", ",".join(users)]
        if partition:
            argv += ["-p", partition]
        from .records import RECORD_ERRORS, job_from_json

        wanted_ids = {int(j) for j in job_ids} if job_ids else None
        wanted_states = {s.upper() for s in states} if states else None
        wanted_users = set(users) if users else None
        out = []
        for record in self._json(argv, "jobs"):
            try:
                job = job_from_json(record)
            except RECORD_ERRORS as exc:
                raise self._unknown(argv, None, f"job record {exc!r}") from None
            if (
                (wanted_ids is None or job.job_id in wanted_ids)
                and (
                    wanted_states is None
                    or job.state in wanted_states
                    or not wanted_states.isdisjoint(job.flags)
                )
                and (wanted_users is None or job.user in wanted_users)
                and (partition is None or job.partition == partition)
            ):
                out.append(job)
        return out

    def job(self, job_id: int) -> Job:
        found = self.jobs(job_ids=[job_id])
        if not found:
            raise SlurmError(["squeue", "-j", str(job_id)], 1, f"job {job_id} not found")
        return found[0]

    def partitions(self) -> list[Partition]:
        """Slurm 22.05's scontrol has no --json, so this reads its one-line-per-record form."""
        from .records import Partition

        out = []
        for rec in parse_records(self.run(["scontrol", "show", "partition", "-o"])):
            out.append(
                Partition(
                    name=rec.get("PartitionName", ""),
                    nodes=rec.get("Nodes", ""),
                    default=rec.get("Default") == "YES",
                    state=rec.get("State", ""),
                    total_nodes=int(rec.get("TotalNodes") or 0),
                )
            )
        return out

    def default_partition(self) -> str | None:
        return next((p.name for p in self.partitions() if p.default), None)

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
        from .records import ShareRow

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

    def _rows(self, argv: list[str], width: int):
        """(line number, columns) of each non-empty line of a `-P`/`-o a|b` listing with `width` columns;
        a SlurmFormatError naming the line for any line of another width."""
        for number, line in enumerate(self.run(argv).splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split("|")
            if len(cols) != width:
                raise self._unknown(
                    argv, None, f"line {number} has {len(cols)} columns, expected {width}: {line[:120]!r}"
                )
            yield number, cols

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
        from .records import PrioRow

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

    # ---- writing ---------------------------------------------------------------------------------------
    def submit(self, args: list[str], script: str | None = None, env: dict[str, str] | None = None) -> int:
        """sbatch --parsable; returns the job id. `script` is fed on stdin when given."""
        out = self.run(["sbatch", "--parsable", *args], input=script, env=env)
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise self._unknown(
                ["sbatch", "--parsable", *args], None, f"no job id in {out.strip()[:120]!r}"
            ) from None

    def drain(self, nodes: list[str] | str, reason: str) -> None:
        self.update_node(_names(nodes), state="DRAIN", reason=reason)

    def resume(self, nodes: list[str] | str) -> None:
        self.update_node(_names(nodes), state="RESUME")

    def set_site_factor(self, job_id: int, value: int) -> None:
        self.run(["scontrol", "update", f"JobId={job_id}", f"SiteFactor={int(value)}"])

    def set_admin_comment(self, job_id: int | str, text: str) -> None:
        """Write a finished job's AdminComment in the accounting DB (admins only; users are refused)."""
        self.run(
            ["sacctmgr", "-i", "modify", "job", "where", f"JobID={job_id}", "set", f"AdminComment={text}"]
        )

    def job_record(self, job_id: int | str) -> dict[str, str]:
        """`scontrol show job -o` as Key=Value (StdErr, BatchFlag, QOS, UserId, Comment...); {} when unknown."""
        rc, out, _ = self.run_full(["scontrol", "show", "job", "-o", str(job_id)])
        records = parse_records(out) if rc == 0 else []
        return records[0] if records else {}

    def set_job_comment(self, job_id: int | str, text: str) -> None:
        """The job's Comment: what `squeue -o %k` and `scontrol show job` show the user."""
        self.run(["scontrol", "update", f"JobId={job_id}", f"Comment={text}"])

    def cancel(self, job_ids: list[int] | int, signal: str | None = None) -> None:
        ids = [job_ids] if isinstance(job_ids, int) else job_ids
        self.run(["scancel", *([f"--signal={signal}"] if signal else []), *[str(j) for j in ids]])

    # ---- active checks: node addresses and maintenance reservations ---------------------------------
    def node_addresses(self) -> dict[str, str]:
        """NodeName -> NodeAddr (scontrol's one-line records; sinfo --json has no address in 22.05)."""
        return {
            rec["NodeName"]: rec.get("NodeAddr") or rec["NodeName"]
            for rec in parse_records(self.run(["scontrol", "show", "node", "-o"]))
            if rec.get("NodeName")
        }

    def reservation(self, name: str) -> dict[str, str]:
        """`scontrol show reservation NAME -o` as Key=Value (Nodes, StartTime, Users, Flags...); {} when
        scontrol lists none."""
        records = parse_records(self.run(["scontrol", "show", "reservation", name, "-o"]))
        return records[0] if records else {}

    def create_reservation(
        self, name: str, nodes: list[str] | str, *, minutes: int, users: str, flags: str = "maint,ignore_jobs"
    ) -> None:
        """A reservation of `nodes` from now for `minutes`, for `users` only (maint: no accounting charge;
        ignore_jobs: even while jobs still run there)."""
        self.run(
            [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={_names(nodes)}",
                "StartTime=now",
                f"Duration={int(minutes)}",
                f"Users={users}",
                f"Flags={flags}",
            ]
        )

    def delete_reservation(self, name: str) -> None:
        """Delete a reservation; one that is already gone is no error (cleanup paths call this)."""
        self.run(["scontrol", "delete", f"ReservationName={name}"], check=False)

    # ---- node health -----------------------------------------------------------------------------
    def update_node(
        self,
        node: str,
        *,
        state: str | None = None,
        reason: str | None = None,
        features: list[str] | frozenset[str] | None = None,
        comment: str | None = None,
    ) -> None:
        """Change several things of a node (or a comma list of nodes) in ONE `scontrol update` (one RPC):
        State (DRAIN needs a reason; RESUME), Reason, the available and active features together (no
        node_features plugin: both are the same), and the Comment ('' clears)."""
        if state is not None and state.upper() == "DRAIN" and not (reason or "").strip():
            raise ValueError("a drain needs a reason")
        argv = ["scontrol", "update", f"NodeName={node}"]
        if state is not None:
            argv.append(f"State={state.upper()}")
        if reason is not None:
            argv.append(f"Reason={reason}")
        if features is not None:
            value = ",".join(sorted(features))
            argv += [f"AvailableFeatures={value}", f"ActiveFeatures={value}"]
        if comment is not None:
            argv.append(f"Comment={comment}")
        if len(argv) > 3:
            self.run(argv)

    # ---- fair-share accountant -----------------------------------------------------------------
    def associations(self) -> list[Association]:
        """Every association of this cluster, in the order of Slurm's own association tree, the order its
        fair-share code walks siblings in: lft on releases before 23.11, Lineage (which replaced lft) from
        23.11 on. shares is None for Fairshare=parent; a Share that is neither a number nor `parent` is a
        SlurmError naming the command (associations.py holds the rules)."""
        from .associations import AssocFormatError, parse_associations
        from .version import ASSOC_ORDER_BY_LINEAGE

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

    # ---- stune-sbatch ----------------------------------------------------------------------------
    def node_features(self, partition: str) -> dict[str, frozenset[str]]:
        """Each node of `partition` (a name or comma list) -> its available and active features together.
        One `sinfo` call; plain -o output, because 22.05's --json ignores -p."""
        out = self.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%f|%b"])
        nodes: dict[str, frozenset[str]] = {}
        for line in out.splitlines():
            name, _, rest = line.strip().partition("|")
            if name:
                features = {f for f in rest.replace("|", ",").split(",") if f and f != "(null)"}
                nodes[name] = nodes.get(name, frozenset()) | features
        return nodes


def queries_on(commands: SlurmCommands) -> Slurm:
    """The whole adapter on the cluster of `commands` (a submission's handle: the commands alone), recording
    its calls in the same list (a Slurm is returned as it is): for a submission's rare path that asks Slurm
    something (its default partition, its nodes' features)."""
    if isinstance(commands, Slurm):
        return commands
    full = Slurm(commands.conf, commands.timeout, commands.bin_dir)
    full.calls = commands.calls
    return full


def _is_unknown_node_error(message: str) -> bool:
    low = message.lower()
    return "not found" in low or "invalid node name" in low


def _names(nodes: list[str] | str) -> str:
    return nodes if isinstance(nodes, str) else ",".join(nodes)


def _number(text: str) -> float | None:
    """A number column of a `-P` listing: None when Slurm prints none; ValueError for anything else."""
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number") from None
