"""The Slurm adapter: `Slurm`, a handle on one cluster. Every other part of stune talks to Slurm through it.

The backend is the Slurm CLI: `--json` for the node and job lists, `-P`/`-o` output elsewhere (sacct, whose
rows are read by field list, and scontrol, sshare, sprio, which have no --json in 22.05). pyslurm only builds
against the exact Slurm release it was made for. Every call has a timeout; any failure raises SlurmError
with the command, its exit code and Slurm's message. Output the adapter does not understand raises SlurmError
naming the command and the Slurm release.

This module holds `Slurm`: the node, job and partition queries and every update, on SlurmAccounting
(accounting.py: sacct, sshare, sprio, sacctmgr, scontrol's config), on SlurmReader (reader.py: the release,
JSON documents, `-P` listings, the error for output of an unknown layout), on SlurmCommands (commands.py:
where the commands are, running them). The rest of the package does one job each: spawn.py runs the process,
sacctargs.py builds sacct's command line, records.py and scontrol.py parse records, associations.py reads
`sacctmgr show assoc`, version.py knows the release and where output changes shape with it.

Hot path (stune-sbatch): see docs/speed.md. Processes start through spawn.py; json, the records,
associations.py and version.py are imported by the methods that read them.
"""

from __future__ import annotations

from ..errors import SlurmError
from .accounting import SlurmAccounting
from .commands import SlurmCommands
from .scontrol import parse_records

TYPE_CHECKING = False  # (typing's constant, without importing typing on stune-sbatch's path)
if TYPE_CHECKING:
    from .records import Job, Node, Partition


class Slurm(SlurmAccounting):
    """A handle on one cluster: its client commands (SlurmCommands: where they are, slurm.conf, the timeout,
    running them, `calls`), and every query and update stune makes."""

    # ---- nodes, jobs, partitions -------------------------------------------------------------------------

    def nodes(self, names: list[str] | None = None) -> list[Node]:
        """Every node (or the ones named, in that order; unknown names are left out). One call:
        `sinfo --json` on 22.05, `scontrol --json show node` on 23.02 and later, whose sinfo --json groups
        nodes by partition and state instead of listing them."""
        from .records import (  # at first use, not with the adapter (test_slurm_adapter)
            RECORD_ERRORS,
            node_from_data_parser,
            node_from_v0038,
        )
        from .version import (
            NODES_FROM_SCONTROL_JSON,  # at first use, not with the adapter (test_slurm_adapter)
        )

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
        from .records import (  # at first use, not with the adapter (test_slurm_adapter)
            RECORD_ERRORS,
            job_from_json,
        )

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
        from .records import Partition  # at first use, not with the adapter (test_slurm_adapter)

        return [
            Partition(
                name=rec.get("PartitionName", ""),
                nodes=rec.get("Nodes", ""),
                default=rec.get("Default") == "YES",
                state=rec.get("State", ""),
                total_nodes=int(rec.get("TotalNodes") or 0),
            )
            for rec in parse_records(self.run(["scontrol", "show", "partition", "-o"]))
        ]

    def default_partition(self) -> str | None:
        return next((p.name for p in self.partitions() if p.default), None)

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

    # ---- requeue that avoids the culprit (health/requeue.py) ----------------------------------------------
    def requeue(self, job_id: int) -> None:
        """`scontrol requeue`: a running or finished batch job becomes pending again, eligible after Slurm's
        requeue delay. Slurm refuses a job with Requeue=0, a non-batch job and a pending one (SlurmError)."""
        self.run(["scontrol", "requeue", str(job_id)])

    def release(self, job_id: int) -> None:
        """`scontrol release`: end a hold (here: Slurm's REQUEUE_HOLD of an expedited-requeue job)."""
        self.run(["scontrol", "release", str(job_id)])

    def update_job(
        self, job_id: int, *, exclude_nodes: str | None = None, comment: str | None = None
    ) -> None:
        """Several things of a pending job in ONE `scontrol update`: ExcNodeList (only a pending job takes it;
        '' clears) and the Comment."""
        argv = ["scontrol", "update", f"JobId={job_id}"]
        if exclude_nodes is not None:
            argv.append(f"ExcNodeList={exclude_nodes}")
        if comment is not None:
            argv.append(f"Comment={comment}")
        if len(argv) > 3:
            self.run(argv)

    def expedited_requeue(self) -> bool:
        """Whether this release has `--requeue=expedite` as stune uses it (version.EXPEDITED_REQUEUE)."""
        from .version import EXPEDITED_REQUEUE  # at first use, not with the adapter (test_slurm_adapter)

        return self.version() >= EXPEDITED_REQUEUE

    def requeue_option(self, expedite: bool) -> str:
        """The sbatch word for a requeueable job: `--requeue=expedite` where asked for and the release has it
        (25.11's own help spells it `expedited`, which 25.11 reads as a plain --requeue and 26.05 refuses),
        else `--requeue`."""
        return "--requeue=expedite" if expedite and self.expedited_requeue() else "--requeue"

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

    def topology(self) -> list[dict[str, str]]:
        """`scontrol show topology`: one record per switch (SwitchName, Level, LinkSpeed, Nodes, Switches; a
        switch above the leaves lists every node beneath it). [] when no topology plugin is configured
        (scontrol then says "No topology information available", exit 0 on 22.05)."""
        argv = ["scontrol", "show", "topology"]
        rc, out, err = self.run_full(argv)
        if rc != 0 and "topology" not in (err + out).lower():
            raise SlurmError(argv, rc, err or out)
        return [rec for rec in parse_records(out) if rec.get("SwitchName")]

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

    def reboot_node(self, node: str, reason: str, *, asap: bool = True, next_state: str = "RESUME") -> None:
        """`scontrol reboot ASAP nextstate=RESUME reason=... NODE`: Slurm drains the node (ASAP: new jobs
        stay off, running ones finish), runs its RebootProgram once the node is idle, and returns the node to
        service when it registers again after the boot (health/ladder.py's second step)."""
        asap_word = ["ASAP"] if asap else []
        self.run(["scontrol", "reboot", *asap_word, f"nextstate={next_state}", f"reason={reason}", node])

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
