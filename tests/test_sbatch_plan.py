"""What stune-sbatch adds for a job, and why: NCCL per fabric, the user's own values, --export, binding,
recovery, placement. Pure: profiles from partitions/ or a temp directory, no Slurm."""

from __future__ import annotations

import os
import textwrap

import pytest

from slurm_tune.nodeenv.managed import parse_managed
from slurm_tune.profiles import load_profile
from slurm_tune.sbatch.directives import parse_directives
from slurm_tune.sbatch.dryrun import explain
from slurm_tune.sbatch.export import export_with, parse_export, user_value
from slurm_tune.sbatch.options import Effective, Opt, parse_args
from slurm_tune.sbatch.plan import ENV, NODE, NOTE, OPTION, build_plan
from slurm_tune.sbatch.submit import sbatch_words


@pytest.fixture(autouse=True)
def own_option_cache(tmp_path, monkeypatch):
    from slurm_tune.sbatch import optable

    monkeypatch.setattr(optable, "cache_path", lambda environ: str(tmp_path / "cache" / "sbatch-options.txt"))


def plan_for(
    argv,
    *,
    environ=None,
    script="",
    profile=None,
    degraded=(),
    partition=None,
    stage=(),
    required=False,
    checkpoint_signal=False,
):
    parsed = parse_args(argv)
    directives, het = parse_directives(script)
    environ = {} if environ is None else environ
    eff = Effective(parsed.options, directives, environ)
    partition = partition or eff.get("partition").value
    calls = []

    def degraded_nodes():
        calls.append(partition)
        return list(degraded)

    plan = build_plan(
        partition=partition,
        partition_source="test",
        profile=profile or load_profile(partition),
        eff=eff,
        environ=environ,
        cwd="/home/u/run",
        stage_args=list(stage),
        stage_required=required,
        degraded_nodes=degraded_nodes,
        het=het or parsed.het,
        script=eff.get("wrap").value if eff.get("wrap") else script,
        checkpoint_signal=checkpoint_signal,
    )
    return plan, calls


def setting(plan, name, kind=None):
    found = [s for s in plan.settings if s.name == name and (kind is None or s.kind == kind)]
    assert len(found) == 1, (name, plan.settings)
    return found[0]


def test_ib_sets_the_fabric_hcas_in_exact_match_form_without_the_storage_hca():
    plan, _ = plan_for(["-p", "hdr"])
    assert plan.env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert "mlx5_8" not in plan.env["NCCL_IB_HCA"]
    assert plan.env["NCCL_IB_TIMEOUT"] == "22" and plan.env["NCCL_IB_RETRY_CNT"] == "7"
    assert plan.env["NCCL_NET_GDR_LEVEL"] == "PHB" and plan.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "NCCL_IB_DISABLE" not in plan.env and "NCCL_IB_GID_INDEX" not in plan.env
    source = setting(plan, "NCCL_IB_HCA").source
    assert "fabric.hcas @ " in source and source.endswith("hdr.yaml:7")
    assert setting(plan, "NCCL_IB_TIMEOUT").source.endswith("site.yaml:5")


def test_roce_leaves_the_gid_index_to_each_node_and_passes_nccl_env_verbatim():
    plan, _ = plan_for(["-p", "roce"])
    gid = setting(plan, "NCCL_IB_GID_INDEX")
    assert gid.kind == NODE and gid.value is None and "NCCL_IB_GID_INDEX" not in plan.env
    assert plan.env["NCCL_IB_TC"] == "106" and plan.env["NCCL_IB_QPS_PER_CONNECTION"] == "2"
    assert "NCCL_IB_GID_INDEX" in parse_managed(plan.env["STUNE_MANAGED"])


def test_tcp_disables_ib_and_gdr_and_names_the_socket_interface():
    plan, _ = plan_for(["-p", "vpc"])
    assert plan.env["NCCL_IB_DISABLE"] == "1" and plan.env["NCCL_NET_GDR_LEVEL"] == "0"
    assert plan.env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert "NCCL_IB_HCA" not in plan.env and "NCCL_IB_TIMEOUT" not in plan.env
    assert setting(plan, "NCCL_IB_DISABLE").source.startswith("rule: fabric.type tcp")


def test_a_variable_the_user_exported_is_kept_and_the_explanation_says_so():
    plan, _ = plan_for(["-p", "roce"], environ={"NCCL_IB_HCA": "=mlx5_3:1", "NCCL_IB_GID_INDEX": "5"})
    hca = setting(plan, "NCCL_IB_HCA")
    assert not hca.applied and "NCCL_IB_HCA" not in plan.env
    assert (
        "kept your NCCL_IB_HCA==mlx5_3:1 (your environment)" in hca.note
        and "stune would set =mlx5_0:1" in hca.note
    )
    gid = setting(plan, "NCCL_IB_GID_INDEX")
    assert not gid.applied and "NCCL_IB_GID_INDEX" not in parse_managed(plan.env["STUNE_MANAGED"])
    assert "NCCL_IB_HCA" not in parse_managed(plan.env["STUNE_MANAGED"])
    text = explain(plan, ["-p", "roce"], "job.sh")
    assert "kept as you set them" in text and "kept your NCCL_IB_HCA==mlx5_3:1" in text


def test_a_value_a_parent_stune_job_set_is_not_taken_for_the_users():
    environ = {"NCCL_IB_HCA": "=mlx5_0:1", "STUNE_MANAGED": "NCCL_IB_HCA"}
    plan, _ = plan_for(["-p", "hdr"], environ=environ)
    assert setting(plan, "NCCL_IB_HCA").applied


def test_export_none_becomes_a_list_of_stunes_variables():
    plan, _ = plan_for(["-p", "hdr", "--export=NONE"], environ={"NCCL_IB_HCA": "=mlx5_9:1"})
    # NONE: the user's environment does not reach the job, so stune's value applies
    assert setting(plan, "NCCL_IB_HCA").applied
    names = plan.export_option.removeprefix("--export=").split(",")
    assert "NONE" not in names and {"NCCL_IB_HCA", "NCCL_IB_TIMEOUT", "STUNE_MANAGED"} <= set(names)
    assert plan.options[-1] == plan.export_option


def test_an_export_list_keeps_the_users_names_and_values_and_adds_stunes():
    environ = {"NCCL_SOCKET_IFNAME": "eth9", "NCCL_IB_TIMEOUT": "3"}
    plan, _ = plan_for(["-p", "roce", "--export=HOME,NCCL_SOCKET_IFNAME,NCCL_IB_HCA=mine"], environ=environ)
    assert not setting(plan, "NCCL_SOCKET_IFNAME").applied  # listed by name: the environment's value goes
    assert not setting(plan, "NCCL_IB_HCA").applied  # given a value in the list
    assert setting(plan, "NCCL_IB_TIMEOUT").applied  # in the environment but not listed: not exported
    assert plan.export_option.startswith("--export=HOME,NCCL_SOCKET_IFNAME,NCCL_IB_HCA=mine,")
    assert "NCCL_IB_TIMEOUT" in plan.export_option


def test_export_all_needs_no_rewrite_and_sbatch_export_counts_like_the_option():
    plan, _ = plan_for(["-p", "roce", "--export=ALL,FOO=1"])
    assert plan.export_option is None
    plan, _ = plan_for(["-p", "roce"], environ={"SBATCH_EXPORT": "NONE"})
    assert plan.export_option and "NONE" not in plan.export_option
    plan, _ = plan_for(["-p", "roce"], script="#!/bin/sh\n#SBATCH --export=NONE\ntrue\n")
    assert plan.export_option is not None


def test_parse_export_forms():
    assert parse_export(None).mode == "all"
    spec = parse_export(Opt("export", "ALL,A=1,B", "command line"))
    assert (spec.mode, spec.names, spec.assigned) == ("all", ("B",), {"A": "1"})
    assert parse_export(Opt("export", "none", "x")).mode == "none"
    assert parse_export(Opt("export", "A,B=2", "x")).mode == "list"
    assert user_value("A", parse_export(Opt("export", "A", "x")), {"A": "9"}, {}) == ("9", "your environment")
    assert user_value("A", parse_export(Opt("export", "NONE", "x")), {"A": "9"}, {}) is None
    assert user_value("A", parse_export(None), {}, {"A": "f"}) == ("f", "--export-file")


def test_export_with_adds_stunes_names_only_where_the_user_narrowed_the_export():
    env = {"NCCL_IB_HCA": "=mlx5_0:1", "MASTER_PORT": "1"}
    assert export_with(parse_export(None), env) is None  # ALL: the job inherits them anyway
    assert export_with(parse_export(Opt("export", "ALL,A=1", "x")), env) is None
    assert (
        export_with(parse_export(Opt("export", "A,B=2", "x")), env)
        == "--export=A,B=2,MASTER_PORT,NCCL_IB_HCA"
    )
    assert export_with(parse_export(Opt("export", "NONE", "x")), env) == "--export=MASTER_PORT,NCCL_IB_HCA"
    assert export_with(parse_export(Opt("export", "NONE", "x")), {}) is None


def test_recovery_defaults_unless_the_user_gave_their_own():
    plan, _ = plan_for(["-p", "roce", "--wrap", "trap 'touch stop' USR1; srun train & wait"])
    assert "--requeue" in plan.options and "--signal=B:USR1@300" in plan.options
    plan, _ = plan_for(["-p", "roce", "--no-requeue", "--signal=B:TERM@60"])
    assert "--requeue" not in plan.options and not any(o.startswith("--signal") for o in plan.options)
    assert "kept your --no-requeue (command line)" in setting(plan, "--requeue").note
    plan, _ = plan_for(["-p", "roce"], script="#!/bin/sh\n#SBATCH --signal=USR2@90\n")
    assert "kept your --signal=USR2@90 (script line 2)" in setting(plan, "--signal").note
    plan, _ = plan_for(["-p", "roce"], environ={"SBATCH_REQUEUE": ""})
    assert "--requeue" not in plan.options


def write_profiles(tmp_path, body: str):
    d = tmp_path / "partitions"
    d.mkdir()
    (d / "gpu.yaml").write_text(textwrap.dedent(body))
    return d


def test_slurm_binding_adds_gpu_bind_and_cpu_bind_default(tmp_path):
    d = write_profiles(
        tmp_path,
        """\
        partition: gpu
        fabric: {type: ib, hcas: [{device: mlx5_0, port: 1}]}
        numa: {bind: slurm, cpu_bind: sockets}
        gpu: {count: 8}
        """,
    )
    profile = load_profile("gpu", d)
    plan, _ = plan_for(["-p", "gpu"], profile=profile)
    assert "--gpu-bind=closest" in plan.options and plan.env["SLURM_CPU_BIND"] == "sockets"
    assert setting(plan, "SLURM_CPU_BIND").source.endswith("gpu.yaml:3")
    plan, _ = plan_for(
        ["-p", "gpu", "--gpu-bind=single:1"], profile=profile, environ={"SLURM_CPU_BIND": "none"}
    )
    assert not any(o.startswith("--gpu-bind") for o in plan.options) and "SLURM_CPU_BIND" not in plan.env


def test_stune_binding_is_advice_only():
    plan, _ = plan_for(["-p", "hdr"])
    assert "srun stune-bind" in setting(plan, "binding", NOTE).note
    assert not any(o.startswith("--gpu-bind") for o in plan.options)


def test_switches_and_degraded_exclusion_only_for_multi_node_jobs():
    plan, calls = plan_for(["-p", "hdr", "-N", "1"], degraded=["n2"])
    assert calls == [] and not any(o.startswith(("--switches", "--exclude")) for o in plan.options)
    assert "single-node job" in setting(plan, "placement", NOTE).note
    plan, calls = plan_for(["-p", "hdr", "-N", "2-4"], degraded=["n2"])
    assert calls == ["hdr"]
    assert "--switches=1@0:10:00" in plan.options and "--exclude=n2" in plan.options
    assert "nodes marked stune_degraded: n2" in setting(plan, "--exclude").note


def test_tasks_without_a_node_count_may_spread_so_they_count_as_multi_node():
    plan, calls = plan_for(["-p", "hdr", "-n", "16"], degraded=[])
    assert plan.multi_node and calls == ["hdr"]
    assert "no node of the partition is marked" in setting(plan, "placement", NOTE).note


def test_exclusion_merges_with_the_users_exclude_and_spares_nodes_they_asked_for():
    plan, _ = plan_for(["-p", "hdr", "-N", "3", "-x", "n9", "-w", "n[1-2]"], degraded=["n1", "n3"])
    assert "--exclude=n9,n3" in plan.options
    kept = [s for s in plan.settings if s.kind == NOTE and not s.applied]
    assert kept and "kept n1: your --nodelist asks for them" in kept[0].note


def test_user_switches_are_kept():
    plan, _ = plan_for(["-p", "hdr", "-N", "4"], script="#!/bin/sh\n#SBATCH --switches=2@5\n")
    assert not any(o.startswith("--switches") for o in plan.options)
    assert "kept your --switches=2@5 (script line 2)" in setting(plan, "--switches").note


def test_a_het_job_gets_the_environment_only():
    plan, calls = plan_for(["-p", "hdr", "-N", "2", ":", "-N", "1", "job.sh"], degraded=["n1"])
    assert plan.options == [] and calls == [] and plan.env["NCCL_IB_HCA"].startswith("=mlx5_0:1")


def test_stage_requests_become_stune_stage_relative_to_the_job_directory():
    plan, _ = plan_for(
        ["-p", "vpc", "-D", "exp1"], stage=["data/imagenet.tar.gz", "/lustre/coco:COCO"], required=True
    )
    value = plan.env["STUNE_STAGE"]
    assert value == "v1;required;IMAGENET=/home/u/run/exp1/data/imagenet.tar.gz;COCO=/lustre/coco"
    assert "STUNE_STAGE" in parse_managed(plan.env["STUNE_MANAGED"])


def test_a_bad_stage_request_is_refused_with_a_clear_error():
    from slurm_tune.errors import StuneError

    with pytest.raises(StuneError, match="--stage"):
        plan_for(["-p", "vpc"], stage=["../up/and/away"])


def test_explain_names_command_environment_and_origins():
    plan, _ = plan_for(["-p", "hdr", "-N", "2"], degraded=["n3"], script="#!/bin/bash\ntrap ckpt USR1\n")
    words = sbatch_words(
        ["-p", "hdr", "-N", "2", "job.sh"], parse_args(["-p", "hdr", "-N", "2", "job.sh"]), plan.options
    )
    text = explain(plan, words, "job.sh")
    assert "sbatch -p hdr -N 2 --requeue --signal=B:USR1@300 --switches=1@0:10:00 --exclude=n3 job.sh" in text
    assert "NCCL_IB_HCA==mlx5_0:1" in text and "fabric.hcas @ " in text and "hdr.yaml:7" in text
    assert "recovery.requeue @ " in text and "site.yaml:13" in text
    assert "placement.switches @ " in text


def test_small_helpers():
    assert os.path.basename(load_profile("hdr").source) == "hdr.yaml"
    assert {s.kind for s in plan_for(["-p", "roce", "-N2"])[0].settings} >= {ENV, NODE, OPTION, NOTE}


class FakeSlurm:
    """Records what would have been run instead of talking to Slurm (for paths that must not plan)."""

    def __init__(self):
        self.ran = []

    def run_full(self, argv, timeout=None, env=None, input=None):
        return 1, "", "sbatch: fatal: Could not establish a configuration source\n"  # the built-in table

    def sbatch_passthrough(self, words, script, env):
        self.ran.append((words, dict(env)))
        return 0, "Submitted batch job 7\n"

    def default_partition(self):
        return "roce"


def test_a_bug_while_planning_submits_unchanged_with_a_warning(monkeypatch, capsys, tmp_path):
    from slurm_tune.sbatch import submit

    def broken(*a, **k):
        raise KeyError("boom")

    monkeypatch.setattr(submit, "make_plan", broken)
    fake = FakeSlurm()
    rc = submit.run(
        ["-p", "roce", "--wrap", "true"], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake
    )
    assert rc == 0 and fake.ran[0][0] == ["-p", "roce", "--wrap", "true"]
    assert "internal error: KeyError" in capsys.readouterr().err
    with pytest.raises(KeyError):
        submit.run(["--dry-run", "-p", "roce", "--wrap", "true"], environ={}, slurm=fake)


def test_a_partition_without_a_profile_is_submitted_unchanged_with_a_note(capsys, tmp_path):
    from slurm_tune.sbatch import submit

    fake = FakeSlurm()
    rc = submit.run(
        ["-p", "debug", "--wrap", "true"], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake
    )
    words, env = fake.ran[0]
    assert rc == 0 and words == ["-p", "debug", "--wrap", "true"] and "NCCL_IB_HCA" not in env
    assert "partition 'debug' has no stune profile" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


def test_an_unprofiled_partition_is_told_by_its_type_not_its_words(capsys, tmp_path, monkeypatch):
    """NoProfileError means "stune does not tune this partition"; a profile error that merely reads the same
    is an error of the profile, said as a warning (and a dry run refuses)."""
    from slurm_tune import profilestore
    from slurm_tune.errors import ConfigError, NoProfileError
    from slurm_tune.sbatch import submit

    with pytest.raises(NoProfileError) as info:
        load_profile("debug")
    assert info.value.partition == "debug" and isinstance(info.value, ConfigError) and info.value.key == ""

    def lookalike(partition, directory=None):
        raise ConfigError(
            "/etc/stune/partitions", None, "", f"no profile for partition {partition!r} (a lookalike)"
        )

    monkeypatch.setattr(profilestore, "load_profile", lookalike)
    fake = FakeSlurm()
    rc = submit.run(
        ["-p", "roce", "--wrap", "true"], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake
    )
    err = capsys.readouterr().err
    assert rc == 0 and fake.ran[0][0] == ["-p", "roce", "--wrap", "true"]
    assert (
        "warning: /etc/stune/partitions: no profile for partition 'roce' (a lookalike); submitting without"
        in err
    )
    assert "has no stune profile" not in err
    with pytest.raises(ConfigError):
        submit.run(["--dry-run", "-p", "roce", "--wrap", "true"], environ={}, slurm=fake)


def test_the_default_partition_is_asked_only_when_nothing_names_one(tmp_path):
    from slurm_tune.sbatch import submit

    class Counting(FakeSlurm):
        asked = 0

        def default_partition(self):
            Counting.asked += 1
            return "roce"

    fake = Counting()
    submit.run(["--wrap", "true"], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake)
    assert Counting.asked == 1 and fake.ran[0][1]["NCCL_IB_TC"] == "106"
    submit.run(
        ["--wrap", "true"],
        environ={"STUNE_HISTORY": str(tmp_path / "h"), "SBATCH_PARTITION": "vpc"},
        slurm=fake,
    )
    assert Counting.asked == 1 and fake.ran[1][1]["NCCL_IB_DISABLE"] == "1"


def test_a_submission_asks_slurm_through_the_adapter_on_its_own_handle(tmp_path):
    """The commands alone (a plain submission's handle) become the whole adapter only on the rare path that
    asks Slurm something, on the same cluster, with its calls recorded on the submission's handle."""
    from slurm_tune.sbatch.submit import _queries
    from slurm_tune.slurm import Slurm
    from slurm_tune.slurm.adapter import queries_on
    from slurm_tune.slurm.commands import SlurmCommands

    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "PartitionName=a Default=NO"\necho "PartitionName=b Default=YES"\n')
    scontrol.chmod(0o755)
    commands = SlurmCommands(conf="/etc/x/slurm.conf", timeout=5, bin_dir=str(tmp_path))
    full = _queries(commands)
    assert isinstance(full, Slurm) and (full.conf, full.timeout, full.bin_dir) == (
        "/etc/x/slurm.conf",
        5,
        str(tmp_path),
    )
    assert full.default_partition() == "b"
    assert commands.calls == [["scontrol", "show", "partition", "-o"]]
    assert queries_on(full) is full and _queries(full) is full
    fake = FakeSlurm()  # a test's stand-in answers the queries itself
    assert _queries(fake) is fake


@pytest.mark.parametrize(
    "script, line",
    [
        ("#!/bin/bash\n#SBATCH -t 10\ntrap 'echo got it; touch ckpt' USR1\nsrun train &\nwait\n", "line 3"),
        ("#!/bin/bash\nset -e\ntrap checkpoint SIGUSR1 TERM\n", "line 3"),
        ("#!/bin/bash\nf() { :; }; trap f 10\n", "line 2"),
        ("#!/bin/bash\nsetup && trap -- 'kill -USR1 $pid' usr1\n", "line 2"),
    ],
)
def test_the_signal_goes_to_a_script_that_traps_it(script, line):
    plan, _ = plan_for(["-p", "roce"], script=script)
    assert "--signal=B:USR1@300" in plan.options
    assert f"your script traps it ({line})" in setting(plan, "--signal").note


@pytest.mark.parametrize(
    "script",
    [
        "#!/bin/bash\nsrun sleep 100\n",
        "#!/bin/bash\ntrap - USR1\nsrun sleep 100\n",  # back to the default action: bash exits
        "#!/bin/bash\ntrap -p USR1\n",
        "#!/bin/bash\ntrap cleanup EXIT TERM\n",
        "#!/bin/bash\necho 'trap USR1 later'\n",
        "",
    ],
)
def test_no_signal_for_a_script_that_does_not_trap_it(script):
    """bash's default action for SIGUSR1 is to exit: sending it would fail a job that plain sbatch completes."""
    plan, _ = plan_for(["-p", "roce"], script=script)
    assert not any(o.startswith("--signal") for o in plan.options)
    note = setting(plan, "signal", NOTE)
    assert "does not trap USR1" in note.note and "--checkpoint-signal" in note.note
    assert "recovery.signal_when @ " in note.source


def test_the_signal_by_opt_in_on_the_command_line_or_in_the_profile(tmp_path):
    plan, _ = plan_for(["-p", "roce"], script="#!/bin/sh\nsrun x\n", checkpoint_signal=True)
    assert "--signal=B:USR1@300" in plan.options and "--checkpoint-signal" in setting(plan, "--signal").note
    d = write_profiles(
        tmp_path,
        "partition: gpu\nfabric: {type: tcp, socket_ifname: eth0}\nrecovery: {signal_when: always, "
        "signal_seconds: 120}\n",
    )
    plan, _ = plan_for(["-p", "gpu"], profile=load_profile("gpu", str(d)), script="#!/bin/sh\nsrun x\n")
    assert "--signal=B:USR1@120" in plan.options
    assert "recovery.signal_when: always" in setting(plan, "--signal").note


@pytest.mark.parametrize(
    "limit, warned",
    [
        ("2", True),
        ("5", True),
        ("5:01", False),
        ("0:04:59", True),
        ("1-0", False),
        ("10", False),
        ("INFINITE", False),
    ],
)
def test_a_time_limit_not_longer_than_the_signals_lead_is_warned(limit, warned):
    plan, _ = plan_for(["-p", "roce", "-t", limit], script="#!/bin/bash\ntrap ckpt USR1\n")
    assert bool(plan.warnings) == warned
    if warned:
        assert "is not longer than the 300s of --signal=B:USR1@300" in plan.warnings[0]
        assert "warnings (also printed at submission):" in explain(plan, [], "x")
    plan, _ = plan_for(["-p", "roce", "-t", limit], script="#!/bin/bash\nsrun x\n")
    assert plan.warnings == []  # no signal, nothing to warn about


def test_the_users_own_signal_is_checked_against_the_time_limit_too():
    plan, _ = plan_for(["-p", "roce", "-t", "1", "--signal=B:USR1@90"])
    assert plan.warnings and "your --signal=B:USR1@90" in plan.warnings[0]
    plan, _ = plan_for(["-p", "roce", "-t", "3", "--signal=USR1"])  # Slurm's default lead: 60 s
    assert plan.warnings == []


def test_time_limit_formats():
    from slurm_tune.sbatch.recovery import time_limit_seconds

    assert [time_limit_seconds(t) for t in ("7", "7:30", "1:00:00", "2-0", "2-3", "2-3:04", "2-3:04:05")] == [
        420,
        450,
        3600,
        172800,
        183600,
        183840,
        183845,
    ]
    assert [time_limit_seconds(t) for t in ("", "x", "1:2:3:4", "a-1", "UNLIMITED")] == [None] * 5


def test_a_value_changed_inside_a_parent_stune_job_is_the_users():
    environ = {"NCCL_IB_HCA": "=mlx5_3:1", "STUNE_MANAGED": "NCCL_IB_HCA==mlx5_0:1%2Cmlx5_1:1"}
    plan, _ = plan_for(["-p", "hdr"], environ=environ)
    assert not setting(plan, "NCCL_IB_HCA").applied
    managed = parse_managed(plan_for(["-p", "roce"])[0].env["STUNE_MANAGED"])
    assert managed["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert managed["NCCL_IB_GID_INDEX"] is None and managed["MASTER_ADDR"] is None


def test_a_parent_jobs_per_node_values_are_not_passed_to_a_nested_job():
    """Submitted from inside a stune job: MASTER_ADDR and the detected GID index are the parent's."""
    environ = {
        "MASTER_ADDR": "10.0.0.9",
        "MASTER_PORT": "12001",
        "NCCL_IB_GID_INDEX": "5",
        "MY_VAR": "x",
        "STUNE_MANAGED": "MASTER_ADDR,MASTER_PORT,NCCL_IB_GID_INDEX",
    }
    plan, _ = plan_for(["-p", "roce"], environ=environ)
    assert set(plan.unset) == {"MASTER_ADDR", "MASTER_PORT", "NCCL_IB_GID_INDEX"}
    mine = {"MASTER_ADDR": "10.0.0.9", "STUNE_MANAGED": "NCCL_IB_HCA"}  # the user's own: kept
    plan, _ = plan_for(["-p", "roce"], environ=mine)
    assert "MASTER_ADDR" not in plan.unset and not setting(plan, "MASTER_ADDR").applied
