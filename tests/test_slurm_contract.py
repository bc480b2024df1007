"""Contract tests: every public adapter method against real captured Slurm output of each release.

Each directory under tests/fixtures/slurm/ (22.05.8, 24.11.5, 25.05.8, ...) is one release's captures of
the same scenario (CAPTURES.md): n3 drained by stune, n2 marked degraded, job 4 running on n1, job 5 pending
for resources with SiteFactor -100, job 6 pending for its begin time, jobs 1-3 finished. Adding a release
is adding its directory. The stand-in commands (fixtures/slurm/replay.py) answer only argv that were
captured (or that aliases.json maps to a capture, saying why); a method whose argv a directory lacks is
skipped there with the argv named, so the run shows what each release proved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import reconfigure
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.errors import SlurmError, SlurmFormatError
from slurm_tune.slurm import INFINITE, Association, Job, Node, Slurm, SlurmVersion
from slurm_tune.slurm.records import RECORD_ERRORS, job_from_json, node_from_data_parser, node_from_v0038
from slurm_tune.slurm.version import parse_version

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if (p / "commands.json").exists())
COMMANDS = ["sinfo", "squeue", "scontrol", "sacct", "sacctmgr", "sshare", "sprio", "sbatch", "scancel"]
SCENARIO_USERS = {
    1: "stune-alice",
    2: "stune-bob",
    3: "stune-alice",
    4: "stune-alice",
    5: "stune-bob",
    6: "stune-alice",
}


class Replay:
    """A Slurm handle whose commands answer from one version directory."""

    def __init__(self, version: str, bin_dir: Path):
        self.dir = FIXTURES / version
        self.release = version
        index = json.loads((self.dir / "commands.json").read_text())
        self.entries = index["commands"]
        self.job_ids = {k: int(v) for k, v in index["job_ids"].items()}
        aliases = self.dir / "aliases.json"
        self.argvs = [e["argv"] for e in self.entries]
        if aliases.exists():
            self.argvs += [a["argv"] for a in json.loads(aliases.read_text())["aliases"]]
        for name in COMMANDS:
            tool = bin_dir / name
            tool.write_text(f'#!/bin/sh\nexec "{os.sys.executable}" "{FIXTURES / "replay.py"}" "$0" "$@"\n')
            tool.chmod(0o755)
        self.slurm = Slurm(bin_dir=str(bin_dir))

    def need(self, *argv: str) -> None:
        """Skip (naming the argv) when this release's captures do not hold the command a method runs."""
        if list(argv) not in self.argvs:
            pytest.skip(f"{self.release} captures hold no `{' '.join(argv)}`")

    def captured(self, file: str) -> list[str]:
        return next(e["argv"] for e in self.entries if e["file"] == file)


@pytest.fixture(params=VERSIONS)
def replay(request, tmp_path, monkeypatch):
    monkeypatch.setenv("STUNE_REPLAY_DIR", str(FIXTURES / request.param))
    return Replay(request.param, tmp_path)


def test_there_are_captures_of_an_old_and_a_new_release():
    assert "22.05.8" in VERSIONS and any(v >= "23" for v in VERSIONS), VERSIONS


def test_version_is_read_once_per_process(replay, tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STUNE_REPLAY_LOG", str(log))
    version = replay.slurm.version()
    assert isinstance(version, SlurmVersion) and str(version) == replay.release
    assert version == (*(int(p) for p in replay.release.split(".")), replay.release)
    again = Slurm(bin_dir=replay.slurm.bin_dir)  # another handle in the same process
    assert again.version() is version
    assert log.read_text().count("--version") == 1


def test_nodes(replay):
    nodes = {n.name: n for n in replay.slurm.nodes()}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    for n in nodes.values():
        assert isinstance(n, Node)
        assert n.state in {"idle", "mixed", "allocated"} and n.state == n.state.lower()
        assert all(isinstance(f, str) and f == f.upper() for f in n.flags)
        assert n.partitions == ("hdr", "roce", "vpc")
        assert n.gres == "gpu:4" and "gres/gpu=4" in n.tres
        assert isinstance(n.reason_time, int)
    n3 = nodes["n3"]
    assert n3.drain and n3.flags == ("DRAIN",) and n3.state == "idle"
    assert (n3.reason, n3.reason_user) == ("stune: mlx5_2/1 state DOWN", "root")
    assert n3.reason_time > 1_700_000_000
    n2 = nodes["n2"]
    assert not n2.drain and n2.feature_set == {"stune_degraded"} == n2.active_feature_set
    assert n2.comment == "stune: degraded: gpu3 PCIe x8" and n2.reason == "" and n2.reason_time == 0
    assert nodes["n1"].state == "mixed"  # job 4 holds one of its cores
    assert nodes["n1"].features == "" and nodes["n1"].feature_set == frozenset()


def test_node_by_name(replay):
    argv = (
        ["sinfo", "--json", "-n", "n2"]
        if replay.slurm.version() < (23, 2)
        else ["scontrol", "--json", "show", "node", "n2"]
    )
    replay.need(*argv)
    n2 = replay.slurm.node("n2")
    assert n2.name == "n2" and n2.comment == "stune: degraded: gpu3 PCIe x8"
    assert replay.slurm.nodes(["n2"]) == [n2]


def test_an_unknown_node_is_not_found(replay):
    argv = (
        ["sinfo", "--json", "-n", "n9"]
        if replay.slurm.version() < (23, 2)
        else ["scontrol", "--json", "show", "node", "n9"]
    )
    replay.need(*argv)
    assert replay.slurm.nodes(["n9"]) == []
    with pytest.raises(SlurmError, match="node n9 not found"):
        replay.slurm.node("n9")


def _check_job_types(job: Job) -> None:
    assert isinstance(job.state, str) and job.state == job.state.upper() and job.state
    for field in ("node_count", "priority", "submit_time", "start_time", "end_time", "restart_count"):
        value = getattr(job, field)
        assert type(value) is int, (field, value)
    assert all(isinstance(f, str) for f in job.flags)


def test_jobs_lists_finished_jobs_too(replay):
    replay.need("squeue", "--json", "--states=all")
    jobs = {j.job_id: j for j in replay.slurm.jobs()}
    for job in jobs.values():
        _check_job_types(job)
    ids = replay.job_ids
    assert jobs[ids["alice_done_hdr_2gpu"]].state == "COMPLETED"
    failed = jobs[ids["alice_failed_vpc_pipe_in_name"]]
    assert (failed.state, failed.name, failed.comment) == ("FAILED", "alice|pipe", "a|b comment")
    assert jobs[ids["alice_running_n1_4gpu"]].state == "RUNNING"
    assert {j.user for j in jobs.values()} >= {"stune-alice", "stune-bob"}


def test_jobs_pending(replay):
    pending = replay.slurm.jobs(states=["PENDING"])
    ids = replay.job_ids
    assert sorted(j.job_id for j in pending) == sorted(
        [ids["bob_pending_resources_3node"], ids["alice_pending_begintime"]]
    )
    by_id = {j.job_id: j for j in pending}
    big = by_id[ids["bob_pending_resources_3node"]]
    _check_job_types(big)
    assert (big.state, big.reason, big.user, big.account, big.partition) == (
        "PENDING",
        "Resources",
        "stune-bob",
        "biology",
        "hdr",
    )
    assert big.node_count == 3 and big.priority > 0 and "gres/gpu=12" in big.tres_req
    assert big.nodes == "" and big.tres_alloc == "" and big.batch_host == ""
    assert by_id[ids["alice_pending_begintime"]].reason == "BeginTime"


def test_job_by_id(replay):
    job_id = replay.job_ids["alice_running_n1_4gpu"]
    replay.need("squeue", "--json", "-j", str(job_id), "--states=all")
    job = replay.slurm.job(job_id)
    _check_job_types(job)
    assert (job.job_id, job.state, job.flags, job.user, job.nodes, job.batch_host) == (
        job_id,
        "RUNNING",
        (),
        "stune-alice",
        "n1",
        "n1",
    )
    assert job.node_count == 1 and "gres/gpu=4" in job.tres_alloc
    assert job.submit_time <= job.start_time < job.end_time < INFINITE
    assert job.state.upper() == "RUNNING" and "RUNNING" in job.state_set  # stage/admin.py's use


def test_jobs_of_a_user(replay):
    replay.need("squeue", "--json", "--states=all", "-u", "stune-bob")
    jobs = replay.slurm.jobs(users=["stune-bob"])
    assert {j.user for j in jobs} == {"stune-bob"}
    assert {j.job_id for j in jobs} == {i for i, u in SCENARIO_USERS.items() if u == "stune-bob"}


def test_partitions_and_default(replay):
    parts = replay.slurm.partitions()
    assert [(p.name, p.default, p.state, p.total_nodes, p.nodes) for p in parts] == [
        ("hdr", True, "UP", 3, "n[1-3]"),
        ("roce", False, "UP", 3, "n[1-3]"),
        ("vpc", False, "UP", 3, "n[1-3]"),
    ]
    assert replay.slurm.default_partition() == "hdr"


def test_node_addresses(replay):
    replay.need("scontrol", "show", "node", "-o")
    assert replay.slurm.node_addresses() == {"n1": "127.0.0.1", "n2": "127.0.0.1", "n3": "127.0.0.1"}


def test_config(replay):
    conf = replay.slurm.config()
    assert conf["ClusterName"] == "stune"
    assert conf["PriorityType"] == "priority/multifactor"
    assert "gres/gpu" in conf["AccountingStorageTRES"].split(",")
    assert conf["PriorityWeightFairShare"] == "10000"


def test_node_features(replay):
    assert replay.slurm.node_features("hdr") == {
        "n1": frozenset(),
        "n2": frozenset({"stune_degraded"}),
        "n3": frozenset(),
    }


def test_associations_in_tree_order(replay):
    rows = replay.slurm.associations()
    assert all(isinstance(r, Association) for r in rows)
    assert {(r.account, r.user, r.parent, r.shares, r.partition) for r in rows} == {
        ("root", "", "", 1, ""),
        ("root", "root", "", 1, ""),
        ("biology", "", "root", 1, ""),
        ("biology", "stune-bob", "", 1, ""),
        ("physics", "", "root", 1, ""),
        ("physics", "stune-alice", "", 1, ""),
    }
    assert rows == sorted(rows, key=lambda r: r.order)
    # a preorder walk of the tree: every account after its parent, every user right under its account
    seen_accounts: list[str] = []
    for r in rows:
        if r.user:
            assert r.account in seen_accounts
        else:
            assert r.parent == "" or r.parent in seen_accounts
            seen_accounts.append(r.account)
    assert rows[0].account == "root" and rows[0].user == ""
    accounts_order = [r.account for r in rows if not r.user]
    assert accounts_order.index("biology") < accounts_order.index("physics")


def test_sshare(replay):
    rows = {(r.account, r.user): r for r in replay.slurm.sshare()}
    assert set(rows) == {
        ("root", ""),
        ("root", "root"),
        ("biology", ""),
        ("biology", "stune-bob"),
        ("physics", ""),
        ("physics", "stune-alice"),
    }
    alice = rows[("physics", "stune-alice")]
    assert alice.raw_shares == 1.0 and alice.norm_shares == 1.0 and alice.raw_usage >= 0
    assert rows[("physics", "")].fairshare is None  # Slurm prints none for an account


def test_sprio(replay):
    rows = replay.slurm.sprio()
    big = replay.job_ids["bob_pending_resources_3node"]
    assert [r.job_id for r in rows] == [big]  # the begin-time job is not yet eligible
    assert (rows[0].user, rows[0].site, rows[0].partition) == ("stune-bob", -100, "hdr")
    assert all(type(v) is int for v in (rows[0].priority, rows[0].age, rows[0].fairshare))


def test_sprio_of_several_jobs_filters_the_full_list(replay, tmp_path, monkeypatch):
    """24.11.5's sprio rejects `-j A,B`: a list is read from the full output and filtered."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("STUNE_REPLAY_LOG", str(log))
    big = replay.job_ids["bob_pending_resources_3node"]
    rows = replay.slurm.sprio([big, replay.job_ids["alice_pending_begintime"], 424242])
    assert [r.job_id for r in rows] == [big]
    assert json.loads(log.read_text().splitlines()[-1]) == ["sprio", "-h", "-o", "%i|%u|%Y|%S|%A|%F|%f|%r"]


def test_qos_usage_factors(replay):
    assert replay.slurm.qos_usage_factors() == {"normal": 1.0}


def test_sacct(replay):
    argv = replay.captured("sacct_P_JobIDRaw_AllocTRES_job.txt")
    job = argv[-1].split("=")[1]
    rows = replay.slurm.sacct(["JobIDRaw", "AllocTRES"], job_ids=[job])
    assert rows == [{"JobIDRaw": job, "AllocTRES": "billing=1,cpu=1,gres/gpu=2,node=1"}]
    assert replay.slurm.calls[-1] == argv


def test_sacct_keeps_a_pipe_in_the_last_free_text_field(replay):
    argv = replay.captured("sacct_P_demo_fields.txt")
    ids = argv[-1].split("=")[1].split(",")
    rows = replay.slurm.sacct(["JobID", "State", "AllocTRES", "NodeList", "Elapsed", "JobName"], job_ids=ids)
    by_id = {r["JobID"]: r for r in rows}
    failed = by_id[str(replay.job_ids["alice_failed_vpc_pipe_in_name"])]
    assert (failed["JobName"], failed["State"]) == ("alice|pipe", "FAILED")


@pytest.mark.parametrize(
    "capture, allocations", [("sacct_dump_X.txt", True), ("sacct_dump_steps.txt", False)]
)
def test_sacct_dump(replay, capture, allocations):
    argv = replay.captured(capture)
    fields = next(a for a in argv if a.startswith("--format=")).split("=", 1)[1].split(",")
    start = next(a for a in argv if a.startswith("--starttime=")).split("=", 1)[1]
    end = next(a for a in argv if a.startswith("--endtime=")).split("=", 1)[1]
    text = replay.slurm.sacct_dump(fields, start=start, end=end, allocations=allocations)
    header, *rows = text.splitlines()
    assert header.split("|") == fields
    assert all(len(r.split("|", len(fields) - 1)) == len(fields) for r in rows)
    job1 = next(r for r in rows if r.startswith(f"{replay.job_ids['alice_done_hdr_2gpu']}|"))
    assert job1.endswith(
        "|stune1 held=7200.0 used=6480.2 cov=7195.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 "
        "per_gpu=n1/0:90.1:40.2:30517:250.3"
    )


def test_writes(replay):
    slurm = replay.slurm
    slurm.drain("n3", "stune: mlx5_2/1 state DOWN")
    slurm.resume("n3")
    slurm.update_node("n2", features=["stune_degraded"], comment="stune: degraded: gpu3 PCIe x8")
    slurm.set_site_factor(replay.job_ids["bob_pending_resources_3node"], -100)
    reconfigure(slurm)
    argv = replay.captured("write_sacctmgr_modify_job_admincomment.txt")
    slurm.set_admin_comment(argv[5].split("=")[1], argv[7].split("=", 1)[1])
    sbatch = replay.captured("write_sbatch_parsable.txt")
    job_id = slurm.submit(sbatch[2:])
    assert job_id == int((replay.dir / "write_sbatch_parsable.txt").read_text().strip())
    slurm.cancel(job_id)
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        slurm.set_site_factor(999999, -5)


def test_sbatch_passthrough(replay, capfd):
    sbatch = replay.captured("write_sbatch_parsable.txt")
    rc, out = replay.slurm.sbatch_passthrough(sbatch[1:], None, dict(os.environ))
    assert rc == 0 and out.strip().isdigit()


# ---- output the adapter does not understand: SlurmError naming the command and the release -----------------


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize(
    "version_line, command, document, expect",
    [
        # a 25.05-style sinfo --json (grouped) where 22.05's node list is expected
        (
            "slurm-wlm 22.05.8",
            "sinfo",
            '{"sinfo": [], "meta": {"Slurm": {"release": "22.05.8"}}, "errors": []}',
            r"^output of `sinfo --json` from Slurm 22.05.8 is not in a format stune knows: no 'nodes' list$",
        ),
        (
            "slurm 25.05.8",
            "scontrol",
            '{"nodes": {"n1": 1}, "meta": {"slurm": {"release": "25.05.8"}}}',
            r"^output of `scontrol --json show node` from Slurm 25.05.8 .*no 'nodes' list",
        ),
        (
            "slurm 26.05.0",
            "scontrol",
            '{"nodes": [{"name": "n1", "state": {"base": "IDLE"}}], "meta": {}}',
            r"^output of `scontrol --json show node` from Slurm 26.05.0 is not in a format stune knows: node record",
        ),
        (
            "slurm 25.05.8",
            "squeue",
            '{"jobs": [{"job_id": "4", "job_state": ["RUNNING"]}]}',
            r"^output of `squeue --json --states=all` from Slurm 25.05.8 .*job record",
        ),
        (
            "slurm 24.11.5",
            "squeue",
            '{"jobs": [{"job_id": 4, "job_state": ["RUNNING"], "priority": {"number": "x", "set": true}}]}',
            r"^output of `squeue --json --states=all` from Slurm 24.11.5 .*job record",
        ),
        (
            "slurm 24.11.5",
            "squeue",
            "[]",
            r"^output of `squeue --json --states=all` from Slurm 24.11.5 .*not a JSON object",
        ),
        (
            "slurm 24.11.5",
            "squeue",
            '{"jobs": [',
            r"^output of `squeue --json --states=all` from Slurm 24.11.5 is not in "
            r"a format stune knows: unreadable JSON",
        ),
    ],
)
def test_an_unknown_shape_is_a_slurm_error_naming_command_and_release(
    tmp_path, version_line, command, document, expect
):
    _fake(
        tmp_path,
        "sinfo",
        f'[ "$1" = --version ] && {{ echo "{version_line}"; exit 0; }}\necho \'{document}\'\n',
    )
    if command != "sinfo":
        _fake(tmp_path, command, f"echo '{document}'\n")
    slurm = Slurm(bin_dir=str(tmp_path))
    with pytest.raises(SlurmFormatError, match=expect) as caught:
        slurm.jobs() if command == "squeue" else slurm.nodes()
    assert "failed (exit" not in str(caught.value)  # the command succeeded: its output is what is unknown


def test_an_unknown_version_line_is_a_slurm_error(tmp_path):
    _fake(tmp_path, "sinfo", "echo 'something else'\n")
    with pytest.raises(SlurmError, match="cannot tell the Slurm release from 'something else'"):
        Slurm(bin_dir=str(tmp_path)).nodes()


def test_associations_without_tree_order_field_is_a_slurm_error(tmp_path):
    _fake(tmp_path, "sinfo", "echo 'slurm 24.11.5'\n")
    _fake(tmp_path, "scontrol", "echo 'ClusterName = stune'\n")
    _fake(tmp_path, "sacctmgr", "echo 'stune|physics||root|1||7'\n")  # an LFT number where Lineage belongs
    with pytest.raises(
        SlurmFormatError,
        match=r"^output of `sacctmgr -n -P show assoc format=Cluster,Account,User,"
        r"ParentName,Share,Partition,Lineage` from Slurm 24.11.5 .*"
        r"Lineage '7' is not a path",
    ):
        Slurm(bin_dir=str(tmp_path)).associations()


# ---- fuzz: any document is records or a SlurmError, never a traceback ---------------------------------------


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["RUNNING", "IDLE", "DRAIN", "n1", ""]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "set",
                    "infinite",
                    "number",
                    "name",
                    "state",
                    "job_state",
                    "job_id",
                    "priority",
                    "partitions",
                    "features",
                    "reason",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
JOB_KEYS = [
    "job_id",
    "job_state",
    "priority",
    "node_count",
    "submit_time",
    "name",
    "user_name",
    "nodes",
    "restart_cnt",
    "requeue",
]
NODE_KEYS = [
    "name",
    "state",
    "state_flags",
    "features",
    "active_features",
    "partitions",
    "reason",
    "reason_changed_at",
    "comment",
    "gres",
    "tres",
]


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(st.sampled_from(JOB_KEYS + NODE_KEYS), JSON_VALUES, max_size=8))
def test_fuzz_record_parsers_raise_only_record_errors(record):
    for parse in (job_from_json, node_from_v0038, node_from_data_parser):
        try:
            out = parse(record)
        except RECORD_ERRORS:
            continue
        assert isinstance(out.state, str)
        if hasattr(out, "job_id"):
            assert all(type(getattr(out, f)) is int for f in ("priority", "node_count", "submit_time"))


@pytest.fixture(scope="module")
def fuzz_slurm(tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("fuzzbin")
    _fake(bin_dir, "sinfo", "echo 'slurm 24.11.5'\n")
    return Slurm(bin_dir=str(bin_dir))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.binary(max_size=200)
    | st.builds(lambda v: json.dumps({"jobs": v}).encode(), JSON_VALUES)
    | st.builds(
        lambda v, w: json.dumps({"jobs": [], "errors": v, "meta": w}).encode(), JSON_VALUES, JSON_VALUES
    )
)
def test_fuzz_json_documents_are_records_or_slurm_errors(fuzz_slurm, data):
    text = data.decode("utf-8", "replace")
    try:
        records = fuzz_slurm._json(["squeue", "--json"], "jobs", text)
    except SlurmError:
        return
    assert isinstance(records, list) and all(isinstance(r, dict) for r in records)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=40))
def test_fuzz_version_lines(text):
    try:
        version = parse_version(text)
    except SlurmError as exc:
        assert "cannot tell the Slurm release" in str(exc)
        return
    assert version >= (0, 0) and version.release in text
