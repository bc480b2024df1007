"""The one Slurm adapter. Every other part of stune talks to Slurm through this module.

The backend is the Slurm CLI: `--json` for the node and job lists, `-P`/`-o` output elsewhere (sacct, whose
rows are read by field list, and scontrol, sshare, sprio, which have no --json in 22.05). pyslurm only builds
against the exact Slurm release it was made for. Every call has a timeout; any failure raises SlurmError
with the command, its exit code and Slurm's message.

One adapter for Slurm 22.05 through 25.x (docs/slurm-versions.md). The release is read once per process
(`sinfo --version`, cached), and only by the methods whose command depends on it: nodes() and
associations(). Each JSON format has its own parser, chosen by the release, not guessed from the output:
22.05's `sinfo --json` (openapi v0.0.38) for nodes, `scontrol --json show node` (data_parser) on 23.02+.
squeue's job records differ only in value shapes (a state string or a list of state and flags, a number
or {set,infinite,number}); _job(), _state() and _int() normalise them in one place. Output the adapter does
not understand raises SlurmError naming the command and the Slurm release.

This module is on the stune-sbatch and prolog paths, so it avoids heavy imports: processes are started with
os.posix_spawn rather than subprocess, records are namedtuples, and json is imported only by JSON readers.
"""
from __future__ import annotations

import os
from collections import namedtuple

from .text import is_digits
from .errors import SlurmError

DEFAULT_TIMEOUT_S = 30.0
SLURM_COMMANDS = frozenset({"sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
                            "scrontab", "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat",
                            "strigger"})
# sacct fields whose text is free (may hold '|'); at most one is allowed, and it is always asked for last.
FREE_TEXT_FIELDS = frozenset(f.lower() for f in (
    "AdminComment", "Comment", "SystemComment", "JobName", "Constraints", "Reason", "WorkDir", "SubmitLine",
    "Reservation", "WCKey"))


class Node(namedtuple("Node", "name state flags reason reason_user reason_time features active_features "
                              "comment partitions gres gres_used tres")):
    """A node, the same on every Slurm release. `state` is the lower-case base state (idle, mixed,
    allocated, down...), `flags` the upper-case state flags (DRAIN, NOT_RESPONDING, ...), features
    comma-separated text, reason_time epoch seconds (0: none)."""

    __slots__ = ()

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def feature_set(self) -> frozenset[str]:
        return frozenset(f for f in self.features.split(",") if f)

    @property
    def active_feature_set(self) -> frozenset[str]:
        return frozenset(f for f in self.active_features.split(",") if f)


class Job(namedtuple("Job", "job_id name user account partition state reason nodes node_count priority "
                            "tres_req tres_alloc submit_time start_time end_time admin_comment comment "
                            "requeue restart_count batch_host flags", defaults=((),))):
    """A job, the same on every Slurm release. `state` is one upper-case base state (PENDING, RUNNING,
    COMPLETED...), `flags` the upper-case state flags newer releases list beside it (REQUEUED, COMPLETING,
    ...). Numbers are plain ints: 0 when Slurm has no value, INFINITE when it says infinite."""

    __slots__ = ()

    @property
    def state_set(self) -> frozenset[str]:
        """The state and its flags: a completing job is {'COMPLETED', 'COMPLETING'} on 23.02+ and
        {'COMPLETING'} on 22.05, so test membership here rather than comparing `state` alone."""
        return frozenset((self.state, *self.flags))


class Partition(namedtuple("Partition", "name nodes default state total_nodes")):
    __slots__ = ()


class ShareRow(namedtuple("ShareRow", "account user raw_shares norm_shares raw_usage norm_usage "
                                      "effective_usage fairshare level_fs")):
    """One `sshare -l` row. user is '' for an account row. Numbers are float, or None when Slurm prints none."""

    __slots__ = ()


class PrioRow(namedtuple("PrioRow", "job_id user priority site age fairshare fairshare_norm partition")):
    """One `sprio` row: weighted factors (site is the SiteFactor), plus the normalized fair-share factor."""

    __slots__ = ()


class Slurm:
    """A handle on one cluster. `conf` is the slurm.conf path (SLURM_CONF); None means Slurm's default.
    `calls` records every command run, so tests can count RPCs."""

    def __init__(self, conf: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, bin_dir: str | None = None):
        self.conf, self.timeout, self.bin_dir = conf, timeout, bin_dir
        self.calls: list[list[str]] = []

    @classmethod
    def from_env(cls, timeout: float = DEFAULT_TIMEOUT_S) -> "Slurm":
        return cls(conf=os.environ.get("SLURM_CONF") or None, timeout=timeout,
                   bin_dir=os.environ.get("STUNE_SLURM_BIN") or None)

    def __repr__(self):
        return f"Slurm(conf={self.conf!r})"

    # ---- running commands ------------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        env["SLURM_TIME_FORMAT"] = "%s"  # epoch seconds: no locale or timezone parsing
        if extra:
            env.update(extra)
        return env

    def executable(self, name: str) -> str:
        """A Slurm client command from bin_dir when one is set; anything else (runuser...) from PATH."""
        return os.path.join(self.bin_dir, name) if self.bin_dir and name in SLURM_COMMANDS else name

    def run(self, argv: list[str], *, input: str | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None, check: bool = True) -> str:
        """Run one Slurm command and return its stdout. Raises SlurmError on failure or timeout."""
        rc, out, err = self.run_full(argv, input=input, timeout=timeout, env=env)
        if check and rc != 0:
            raise SlurmError(argv, rc, err or out)
        return out

    def run_full(self, argv: list[str], *, input: str | None = None, timeout: float | None = None,
                 env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); raises SlurmError only when the command cannot run or times out."""
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        limit = self.timeout if timeout is None else timeout
        try:
            rc, out, err = spawn_capture(argv, input, self.env(env), limit, self.executable(argv[0]))
        except TimeoutError:
            raise SlurmError(argv, None, f"no answer within {limit:g}s") from None
        except OSError as exc:
            raise SlurmError(argv, 127, f"cannot run {argv[0]}: {exc.strerror}") from None
        return rc, out, err

    # ---- the Slurm release ------------------------------------------------------------------------------
    def version(self) -> "SlurmVersion":
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
            found = parse_version(out, argv)
            _VERSIONS[key] = found
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
            raise SlurmError(argv, 0, f"unreadable JSON from {argv[0]}: {exc}") from None
        if not isinstance(doc, dict):
            raise self._unknown(argv, None, "not a JSON object")
        errors = doc.get("errors") or []
        if not isinstance(errors, list):
            raise self._unknown(argv, doc, "'errors' is not a list")
        errors = [e for e in errors if e]
        if errors:
            raise SlurmError(argv, 0, "; ".join(str(e.get("error") or e) if isinstance(e, dict) else str(e)
                                                for e in errors))
        records = doc.get(key)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise self._unknown(argv, doc, f"no '{key}' list")
        return records

    def _unknown(self, argv: list[str], doc, problem: str) -> SlurmError:
        """A SlurmError for output of a shape this adapter does not know, naming the command and the
        release (from the document's own meta when it has one, else the detected release)."""
        release = _doc_release(doc)
        if release is None:
            try:  # the error path may spend one more command on naming the release
                release = self.version().release
            except SlurmError:
                release = "of unknown release"
        return SlurmError(argv, 0, f"output of {' '.join(argv[:3])} from Slurm {release} is not in a format "
                                   f"stune knows: {problem}")

    def nodes(self, names: list[str] | None = None) -> list[Node]:
        """Every node (or the ones named, in that order; unknown names are left out). One call:
        `sinfo --json` on 22.05, `scontrol --json show node` on 23.02 and later, whose sinfo --json groups
        nodes by partition and state instead of listing them."""
        if self.version() < (23, 2):
            argv = ["sinfo", "--json"] + (["-n", ",".join(names)] if names else [])
            parse = _node_v0038
        else:
            argv = ["scontrol", "--json", "show", "node"] + ([",".join(names)] if names else [])
            parse = _node_data_parser
        text = None
        if names and parse is _node_data_parser:
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

    def jobs(self, *, job_ids: list[int] | None = None, states: list[str] | None = None,
             users: list[str] | None = None, partition: str | None = None) -> list[Job]:
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
        wanted_ids = {int(j) for j in job_ids} if job_ids else None
        wanted_states = {s.upper() for s in states} if states else None
        wanted_users = set(users) if users else None
        out = []
        for record in self._json(argv, "jobs"):
            try:
                job = _job(record)
            except RECORD_ERRORS as exc:
                raise self._unknown(argv, None, f"job record {exc!r}") from None
            if ((wanted_ids is None or job.job_id in wanted_ids)
                    and (wanted_states is None or job.state in wanted_states
                         or not wanted_states.isdisjoint(job.flags))
                    and (wanted_users is None or job.user in wanted_users)
                    and (partition is None or job.partition == partition)):
                out.append(job)
        return out

    def job(self, job_id: int) -> Job:
        found = self.jobs(job_ids=[job_id])
        if not found:
            raise SlurmError(["squeue", "-j", str(job_id)], 1, f"job {job_id} not found")
        return found[0]

    def partitions(self) -> list[Partition]:
        """Slurm 22.05's scontrol has no --json, so this reads its one-line-per-record form."""
        out = []
        for rec in parse_records(self.run(["scontrol", "show", "partition", "-o"])):
            out.append(Partition(name=rec.get("PartitionName", ""), nodes=rec.get("Nodes", ""),
                                 default=rec.get("Default") == "YES", state=rec.get("State", ""),
                                 total_nodes=int(rec.get("TotalNodes") or 0)))
        return out

    def default_partition(self) -> str | None:
        return next((p.name for p in self.partitions() if p.default), None)

    def config(self) -> dict[str, str]:
        """`scontrol show config` as a dict (PriorityDecayHalfLife, PriorityFlags, ...)."""
        conf = {}
        for line in self.run(["scontrol", "show", "config"]).splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and " " not in key.strip():
                conf[key.strip()] = value.strip()
        return conf

    def sacct(self, fields: list[str], *, start: int | str | None = None, end: int | str | None = None,
              job_ids: list[str] | None = None, states: list[str] | None = None, all_users: bool = True,
              allocations: bool = True, extra: list[str] | None = None) -> list[dict[str, str]]:
        """Accounting rows as dicts keyed by the requested field names.

        Princeton jobstats style: -P, an explicit field list, free text last, SLURM_TIME_FORMAT=%s. At most
        one free-text field may be asked for; it is moved last and split off with a bounded split, so a '|'
        in a comment cannot shift the columns."""
        ordered = free_text_last(fields)
        argv = _sacct_argv(ordered, ["-n", *(["--allusers"] if all_users else [])], allocations, start, end)
        if job_ids:
            argv.append(f"--jobs={','.join(str(j) for j in job_ids)}")
        if states:
            argv.append(f"--state={','.join(states)}")
        argv += extra or []
        rows = []
        for line in self.run(argv).splitlines():
            if not line:
                continue
            values = line.split("|", len(ordered) - 1)
            if len(values) != len(ordered):
                raise SlurmError(argv, 0, f"sacct row has {len(values)} fields, expected {len(ordered)}: {line!r}")
            rows.append(dict(zip(ordered, values)))
        return rows

    def sshare(self) -> list[ShareRow]:
        fields = ["Account", "User", "RawShares", "NormShares", "RawUsage", "NormUsage", "EffectvUsage",
                  "FairShare", "LevelFS"]
        out = self.run(["sshare", "-P", "-n", "-a", "-l", f"--format={','.join(fields)}"])
        rows = []
        for line in out.splitlines():
            cols = line.split("|")
            if len(cols) != len(fields):
                continue
            nums = [_number(c) for c in cols[2:]]
            rows.append(ShareRow(cols[0].strip(), cols[1].strip(), *nums))
        return rows

    def sprio(self, job_ids: list[int] | None = None) -> list[PrioRow]:
        """Pending jobs' priority factors (all, or the ones in job_ids). Slurm 24.11.5's sprio rejects a
        list of ids ("Invalid job id: N"), so a list is read as every pending job and filtered here."""
        argv = ["sprio", "-h", "-o", "%i|%u|%Y|%S|%A|%F|%f|%r"]
        wanted = {int(j) for j in job_ids} if job_ids else None
        if wanted is not None and len(wanted) == 1:
            argv += ["-j", str(next(iter(wanted)))]
        rows = []
        for line in self.run(argv).splitlines():
            cols = [c.strip() for c in line.split("|")]
            if len(cols) != 8 or not is_digits(cols[0]):
                continue
            if wanted is not None and int(cols[0]) not in wanted:
                continue
            rows.append(PrioRow(int(cols[0]), cols[1], int(cols[2]), int(cols[3]), int(cols[4]), int(cols[5]),
                                float(cols[6]), cols[7]))
        return rows

    # ---- writing ---------------------------------------------------------------------------------------
    def submit(self, args: list[str], script: str | None = None, env: dict[str, str] | None = None) -> int:
        """sbatch --parsable; returns the job id. `script` is fed on stdin when given."""
        out = self.run(["sbatch", "--parsable", *args], input=script, env=env)
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise SlurmError(["sbatch", *args], 0, f"unexpected sbatch output {out.strip()!r}") from None

    def drain(self, nodes: list[str] | str, reason: str) -> None:
        self.update_node(_names(nodes), state="DRAIN", reason=reason)

    def resume(self, nodes: list[str] | str) -> None:
        self.update_node(_names(nodes), state="RESUME")

    def set_features(self, node: str, features: list[str] | frozenset[str]) -> None:
        """Set a node's available and active features (no node_features plugin: both are the same)."""
        self.update_node(node, features=features)

    def set_node_comment(self, node: str, comment: str) -> None:
        self.update_node(node, comment=comment)

    def set_site_factor(self, job_id: int, value: int) -> None:
        self.run(["scontrol", "update", f"JobId={job_id}", f"SiteFactor={int(value)}"])

    def set_admin_comment(self, job_id: int | str, text: str) -> None:
        """Write a finished job's AdminComment in the accounting DB (admins only; users are refused)."""
        self.run(["sacctmgr", "-i", "modify", "job", "where", f"JobID={job_id}", "set", f"AdminComment={text}"])

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

    def reconfigure(self) -> None:
        self.run(["scontrol", "reconfigure"])

    def sacctmgr(self, args: list[str]) -> str:
        return self.run(["sacctmgr", "-i", *args])

    # ---- node health -----------------------------------------------------------------------------
    def update_node(self, node: str, *, state: str | None = None, reason: str | None = None,
                    features: list[str] | frozenset[str] | None = None, comment: str | None = None) -> None:
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
    def associations(self) -> list["Association"]:
        """Every association of this cluster, in the order of Slurm's own association tree, the order its
        fair-share code walks siblings in: lft on releases before 23.11, Lineage (which replaced lft) from
        23.11 on. shares is None for Fairshare=parent."""
        by_lineage = self.version() >= (23, 11)
        fields = ["Cluster", "Account", "User", "ParentName", "Share", "Partition",
                  "Lineage" if by_lineage else "LFT"]
        argv = ["sacctmgr", "-n", "-P", "show", "assoc", f"format={','.join(fields)}"]
        out = self.run(argv)
        cluster = self.config().get("ClusterName")
        rows = []
        for line in out.splitlines():
            cols = line.split("|")
            if len(cols) != len(fields):
                if line.strip():
                    raise self._unknown(argv, None, f"{len(cols)} columns, expected {len(fields)}: {line!r}")
                continue
            if cluster and cols[0] != cluster:
                continue
            share = cols[4].strip().lower()
            shares = None if share == "parent" else int(share) if is_digits(share) else 1
            if by_lineage:
                if not cols[6].startswith("/"):
                    raise self._unknown(argv, None, f"Lineage {cols[6]!r} is not a path")
                order = cols[6]
            else:
                if not is_digits(cols[6]):
                    raise self._unknown(argv, None, f"LFT {cols[6]!r} is not a number")
                order = int(cols[6])
            rows.append(Association(cols[1], cols[2], cols[3], shares, cols[5], order))
        rows.sort(key=lambda a: a.order)
        return rows

    def qos_usage_factors(self) -> dict[str, float]:
        out = self.run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,UsageFactor"])
        factors = {}
        for line in out.splitlines():
            name, _, value = line.partition("|")
            number = _number(value)
            if name and number is not None:
                factors[name] = number
        return factors

    def sacct_dump(self, fields: list[str], *, start: int | str | None = None, end: int | str | None = None,
                   allocations: bool = True, duplicates: bool = True, timeout: float | None = None) -> str:
        """Raw `sacct -P` text WITH its header line, for bulk readers that parse columns themselves (the
        fair-share accountant reads a million rows this way). Free text goes last, as in sacct()."""
        argv = _sacct_argv(free_text_last(fields), ["-a", *(["-D"] if duplicates else [])], allocations, start, end)
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

    def sbatch_passthrough(self, args: list[str], script: bytes | None, env: dict[str, str],
                           while_waiting=None) -> tuple[int, str]:
        """Run `sbatch ARGS` as the user would: its stderr is ours, its stdout is relayed to ours as it
        comes (and returned, for the job id), `script` (when given) is its stdin, and its exit status is
        returned (128+N for a signal). No timeout: sbatch has its own, and --wait lasts as long as the job.
        `while_waiting()` runs once sbatch has started (work that overlaps its round trip to slurmctld)."""
        argv = ["sbatch", *args]
        self.calls.append(argv)
        if self.conf and "SLURM_CONF" not in env:
            env = dict(env, SLURM_CONF=self.conf)
        try:
            rc, out = spawn_relay(["sbatch", *args], script, env, while_waiting, self.executable("sbatch"))
        except OSError as exc:
            raise SlurmError(argv, 127, f"cannot run sbatch: {exc.strerror}") from None
        return rc, out


class Association(namedtuple("Association", "account user parent shares partition order")):
    """One `sacctmgr show assoc` row: user is '' for an account, parent the parent account (accounts only),
    shares the raw Fairshare or None for Fairshare=parent. `order` is the tree-order key: the lft number
    before Slurm 23.11, the Lineage path ('/physics/0-stune-alice/') from 23.11 on."""

    __slots__ = ()

    @property
    def lft(self):  # the field's name before 23.11 support
        return self.order


class SlurmVersion(namedtuple("SlurmVersion", "major minor micro release")):
    """A Slurm release; compares with tuples: `version >= (23, 2)`."""

    __slots__ = ()

    def __lt__(self, other):
        return tuple(self[:3]) < tuple(other)

    def __le__(self, other):
        return tuple(self[:3]) <= tuple(other)

    def __gt__(self, other):
        return tuple(self[:3]) > tuple(other)

    def __ge__(self, other):
        return tuple(self[:3]) >= tuple(other)

    def __str__(self):
        return self.release


# The release per (sinfo executable, PATH): read once per process.
_VERSIONS: dict[tuple[str, str], SlurmVersion] = {}
# Slurm's "no value" and "infinite" become 0 and INFINITE, so every number is a plain int.
INFINITE = 2 ** 63 - 1
NODE_BASE_STATES = frozenset({"IDLE", "DOWN", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN"})
JOB_BASE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                             "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})


def parse_version(text: str, argv: list[str] | None = None) -> SlurmVersion:
    """`sinfo --version` output ('slurm 24.11.5', 'slurm-wlm 22.05.8', 'slurm 25.05.0-0rc1') to a version."""
    words = text.split()
    if len(words) == 2 and words[0] in ("slurm", "slurm-wlm"):
        parts = words[1].split("-")[0].split(".")
        if len(parts) == 3 and all(is_digits(p) for p in parts):
            return SlurmVersion(int(parts[0]), int(parts[1]), int(parts[2]), words[1])
    raise SlurmError(argv or ["sinfo", "--version"], 0, f"cannot tell the Slurm release from {text.strip()[:80]!r}")


def _doc_release(doc) -> str | None:
    """The release a Slurm JSON document names in its meta (22.05: meta.Slurm, 23.02+: meta.slurm)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
        return None
    slurm = doc["meta"].get("slurm") or doc["meta"].get("Slurm")
    release = slurm.get("release") if isinstance(slurm, dict) else None
    return release if isinstance(release, str) else None


def _int(value) -> int:
    """A Slurm JSON number as a plain int: 22.05 prints plain numbers, 23.02+ {set, infinite, number}."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return INFINITE
        if not value.get("set"):
            return 0
        value = value.get("number")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    return int(value)


def _text(value) -> str:
    """A text or a list of texts (23.02+ lists features and partitions) as comma-separated text."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    raise ValueError(f"not text: {value!r}")


def _state(value, base_states: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """(base state, flags), upper case. 22.05 gives one string, 23.02+ a list of the base state and flags.
    A 22.05 string that is a flag (COMPLETING) stands for the state as well."""
    if isinstance(value, str):
        words = [value.upper()] if value else []
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = [v.upper() for v in value]
    else:
        raise ValueError(f"state {value!r}")
    base = next((w for w in words if w in base_states), words[0] if words else "")
    return base, tuple(w for w in words if w != base)


def _str(value) -> str:
    """A text field: a string, or nothing (None) as ''. Anything else is a format stune does not know."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"not text: {value!r}")
    return value


def _name_tuple(value) -> tuple[str, ...]:
    """A list of names (23.02+) or a comma-separated text (22.05) as a tuple of names."""
    if isinstance(value, list):
        return tuple(_str(v) for v in value)
    return tuple(v for v in _str(value).split(",") if v)


def _node_v0038(n: dict) -> Node:
    """A node record of 22.05's `sinfo --json` (openapi v0.0.38): state 'idle', state_flags ['DRAIN']."""
    base, flags = _state(n.get("state") or "", NODE_BASE_STATES)
    extra = tuple(f.upper() for f in _name_tuple(n.get("state_flags")))
    return Node(name=_name(n), state=base.lower(), flags=flags + extra, reason=_str(n.get("reason")),
                reason_user=_str(n.get("reason_set_by_user")), reason_time=_int(n.get("reason_changed_at")),
                features=_text(n.get("features")), active_features=_text(n.get("active_features")),
                comment=_str(n.get("comment")), partitions=_name_tuple(n.get("partitions")),
                gres=_str(n.get("gres")), gres_used=_str(n.get("gres_used")), tres=_str(n.get("tres")))


def _node_data_parser(n: dict) -> Node:
    """A node record of `scontrol --json show node` (data_parser v0.0.39+): state ['IDLE', 'DRAIN'],
    features and partitions as lists, times as {set, infinite, number}."""
    base, flags = _state(n.get("state") or [], NODE_BASE_STATES)
    return Node(name=_name(n), state=base.lower(), flags=flags, reason=_str(n.get("reason")),
                reason_user=_str(n.get("reason_set_by_user")), reason_time=_int(n.get("reason_changed_at")),
                features=_text(n.get("features")), active_features=_text(n.get("active_features")),
                comment=_str(n.get("comment")), partitions=_name_tuple(n.get("partitions")),
                gres=_str(n.get("gres")), gres_used=_str(n.get("gres_used")), tres=_str(n.get("tres")))


def _name(record: dict) -> str:
    name = record["name"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"name {name!r}")
    return name


# What a record parser raises on a record it does not understand; the caller turns it into a SlurmError.
RECORD_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


def _job(j: dict) -> Job:
    """A squeue --json job record of any release as a Job: one state string, plain ints."""
    state, flags = _state(j.get("job_state") or "", JOB_BASE_STATES)
    job_id = j["job_id"]
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise ValueError(f"job_id {job_id!r}")
    return Job(job_id=job_id, name=_str(j.get("name")), user=_str(j.get("user_name")),
               account=_str(j.get("account")), partition=_str(j.get("partition")), state=state,
               reason=_str(j.get("state_reason")), nodes=_str(j.get("nodes")), node_count=_int(j.get("node_count")),
               priority=_int(j.get("priority")), tres_req=_str(j.get("tres_req_str")),
               tres_alloc=_str(j.get("tres_alloc_str")), submit_time=_int(j.get("submit_time")),
               start_time=_int(j.get("start_time")), end_time=_int(j.get("end_time")),
               admin_comment=_str(j.get("admin_comment")), comment=_str(j.get("comment")),
               requeue=bool(j.get("requeue")), restart_count=_int(j.get("restart_cnt")),
               batch_host=_str(j.get("batch_host")), flags=flags)


def _is_unknown_node_error(message: str) -> bool:
    low = message.lower()
    return "not found" in low or "invalid node name" in low


def free_text_last(fields: list[str]) -> list[str]:
    """The sacct field list with its one free-text field (if any) moved last: it is split off with a bounded
    split, so a '|' inside a comment cannot shift the columns."""
    free = [f for f in fields if f.lower() in FREE_TEXT_FIELDS]
    if len(free) > 1:
        raise ValueError(f"at most one free-text sacct field, got {free}")
    return [f for f in fields if f not in free] + free


def _sacct_argv(ordered: list[str], flags: list[str], allocations: bool, start, end) -> list[str]:
    argv = ["sacct", "-P", "--noconvert", *flags, f"--format={','.join(ordered)}"]
    if allocations:
        argv.append("-X")
    if start is not None:
        argv.append(f"--starttime={start}")
    if end is not None:
        argv.append(f"--endtime={end}")
    return argv


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's compressed host list to names: `n[1-3,5],gpu[08-10],rack[1-2]-n[1-2]` -> n1 n2 n3 n5 gpu08
    gpu09 gpu10 rack1-n1 rack1-n2 rack2-n1 rack2-n2. Zero padding is kept; a range part that is not a
    number, or an unbalanced bracket, is taken literally (sbatch judges a bad --nodelist, not stune)."""
    names: list[str] = []
    depth, term = 0, ""
    for ch in (expr or "").strip() + ",":
        if ch == "," and depth == 0:
            if term:
                names.extend(_expand_term(term))
            term = ""
            continue
        depth += (ch == "[") - (ch == "]")
        term += ch
    if term:  # an unbalanced bracket swallowed the rest
        names.append(term[:-1])
    return names


def _expand_term(term: str) -> list[str]:
    head, sep, rest = term.partition("[")
    body, closed, tail = rest.partition("]")
    if not sep or not closed:
        return [term]
    heads = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if dash and is_digits(lo) and is_digits(hi) and int(hi) - int(lo) < 1_000_000:
            heads.extend(f"{head}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
        else:
            heads.append(head + part)
    return [h + t for h in heads for t in _expand_term(tail)] if tail else heads


def tres_value(tres: str, key: str) -> str | None:
    """The value of `key` in a TRES string ('billing=2,cpu=2,gres/gpu=4,node=2' -> '4' for 'gres/gpu'), or
    None. Only the exact key counts: a typed entry (gres/gpu:a100=4) counts the same GPUs again."""
    for item in tres.split(","):
        name, sep, value = item.partition("=")
        if sep and name == key:
            return value
    return None


def _names(nodes: list[str] | str) -> str:
    return nodes if isinstance(nodes, str) else ",".join(nodes)


def _number(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_records(text: str) -> list[dict[str, str]]:
    """Parse `scontrol show ... -o` output: one record per line, Key=Value pairs separated by spaces.
    A value may contain spaces (Reason=...), so a token without '=' continues the previous value."""
    records = []
    for line in text.splitlines():
        rec: dict[str, str] = {}
        last = None
        for token in line.split(" "):
            key, sep, value = token.partition("=")
            if sep and key and (key[0].isupper() or is_digits(key[0])) and "/" not in key:
                rec[key] = value
                last = key
            elif last is not None and token:
                rec[last] += " " + token
        if rec:
            records.append(rec)
    return records


def spawn_capture(argv: list[str], input: str | None, env: dict[str, str], timeout: float,
                  executable: str | None = None) -> tuple[int, str, str]:
    """Run argv, feed `input`, collect stdout/stderr, kill it after `timeout` s. Raises TimeoutError/OSError.

    Built on os.posix_spawn and select.poll: importing subprocess costs more than this whole call's
    own work on the stune-sbatch path."""
    import select
    import signal as _signal
    import time

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    actions = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    try:
        # the program's own name stays argv[0]: Slurm's messages start with it ("sbatch: error: ...")
        pid = os.posix_spawnp(executable or argv[0], argv, env, file_actions=actions, setsid=True)
    except OSError:
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    chunks = {out_r: [], err_r: []}
    pending = input.encode() if input is not None else b""
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    if in_w >= 0:
        if pending:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1
    open_fds = {out_r, err_r} | ({in_w} if in_w >= 0 else set())
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.killpg(pid, _signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                raise TimeoutError(timeout)
            for fd, event in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        sent = os.write(in_w, pending[:65536])
                    except BrokenPipeError:
                        sent, pending = 0, b""
                    pending = pending[sent:]
                    if not pending:
                        poller.unregister(in_w)
                        os.close(in_w)
                        open_fds.discard(in_w)
                        in_w = -1
                    continue
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
    return (os.waitstatus_to_exitcode(status), b"".join(chunks[out_r]).decode("utf-8", "replace"),
            b"".join(chunks[err_r]).decode("utf-8", "replace"))


def spawn_relay(argv: list[str], stdin_data: bytes | None, env: dict[str, str], while_waiting=None,
                executable: str | None = None) -> tuple[int, str]:
    """Run argv with our stderr, `stdin_data` (or our stdin) as its stdin, and its stdout copied to ours
    as it arrives. `while_waiting()` runs after the start (its exceptions propagate once the child has been
    waited for). Returns (exit status, stdout text). Raises OSError when it cannot start."""
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe() if stdin_data is not None else (-1, -1)
    actions = [(os.POSIX_SPAWN_DUP2, out_w, 1)] + ([(os.POSIX_SPAWN_DUP2, in_r, 0)] if in_r >= 0 else [])
    try:
        pid = os.posix_spawnp(executable or argv[0], argv, env, file_actions=actions)
    except OSError:
        for fd in (out_r, out_w, in_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    os.close(out_w)
    if in_r >= 0:
        os.close(in_r)
        try:  # sbatch reads its whole script before it writes anything, so this cannot deadlock
            view = memoryview(stdin_data)
            while view:
                view = view[os.write(in_w, view):]
        except BrokenPipeError:  # it exited early (a bad option); its own message says why
            pass
        finally:
            os.close(in_w)
    chunks = []
    pending_error = None
    if while_waiting is not None:
        try:
            while_waiting()
        except Exception as exc:  # raised after the child is reaped: never leave it behind
            pending_error = exc
    try:
        while True:
            data = os.read(out_r, 65536)
            if not data:
                break
            chunks.append(data)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view):]
            except OSError:  # our stdout is gone: keep reading so sbatch is not blocked
                pass
    finally:
        os.close(out_r)
    _, status = os.waitpid(pid, 0)
    if pending_error is not None:
        raise pending_error
    code = os.waitstatus_to_exitcode(status)
    return (128 - code if code < 0 else code), b"".join(chunks).decode("utf-8", "replace")
