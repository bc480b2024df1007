"""`stune-sbatch --dry-run` says what the submission does (issue 22 §3, issue 21 §11): the variable a staged job
reads, a heterogeneous job's nodes, binding advice only where there is a GPU, MASTER_ADDR through an --export
list, and a script sbatch cannot open. No cluster: profiles from partitions/ or a temp directory."""

from __future__ import annotations

import json
import textwrap

import pytest
from test_sbatch_plan import FakeSlurm, plan_for, setting

from slurm_tune.profiles import load_profile
from slurm_tune.sbatch.plan import NOTE


@pytest.fixture(autouse=True)
def own_option_cache(tmp_path, monkeypatch):
    from slurm_tune.sbatch import optable

    monkeypatch.setattr(optable, "cache_path", lambda environ: str(tmp_path / "cache" / "sbatch-options.txt"))


def dry_run(argv, tmp_path, capsys):
    from slurm_tune.sbatch import submit

    rc = submit.run(["--dry-run", *argv], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=FakeSlurm())
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_dry_run_names_the_variable_a_staged_job_reads(tmp_path, capsys):
    data = tmp_path / "imagenet"
    data.mkdir()
    rc, out, _ = dry_run(["-p", "roce", "--stage", f"{data}:DS", "--wrap", "true"], tmp_path, capsys)
    assert rc == 0
    row = next(line for line in out.splitlines() if line.lstrip().startswith("STUNE_STAGE_DS"))
    assert f"your job reads $STUNE_STAGE_DS: on each node, the staged copy of {data}" in row
    rc, out, _ = dry_run(
        ["--json", "-p", "roce", "--stage", f"{data}:DS", "--wrap", "true"], tmp_path, capsys
    )
    doc = json.loads(out)
    assert doc["staged_variables"] == ["STUNE_STAGE_DS"]
    assert any(s["name"] == "STUNE_STAGE_DS" and s["kind"] == "staged" for s in doc["settings"])
    assert "STUNE_STAGE_DS" not in doc["env"]["STUNE_MANAGED"]  # set by the TaskProlog, never refined


def test_a_two_node_heterogeneous_job_is_not_called_single_node(tmp_path, capsys):
    rc, out, _ = dry_run(["-p", "roce", "-N1", ":", "-N1", "--wrap", "srun true"], tmp_path, capsys)
    assert rc == 0
    assert "nodes       multi-node: a heterogeneous job: each component gets nodes of its own" in out
    script = tmp_path / "het.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p roce -N1\n#SBATCH hetjob\n#SBATCH -N1\nsrun true\n")
    rc, out, _ = dry_run([str(script)], tmp_path, capsys)
    assert "multi-node: a heterogeneous job" in out


def test_binding_advice_names_a_gpu_only_where_the_job_has_one(tmp_path):
    d = tmp_path / "partitions"
    d.mkdir()
    (d / "cpu.yaml").write_text(
        textwrap.dedent("""\
        partition: cpu
        fabric: {type: tcp, socket_ifname: eth0}
        numa: {bind: stune}
        gpu: {count: 0}
        """)
    )
    profile = load_profile("cpu", d)
    plan, _ = plan_for(["-p", "cpu"], profile=profile)
    note = setting(plan, "binding", NOTE).note
    assert "GPU's NUMA node" not in note and "no GPU" in note and "--cpu-bind" in note
    plan, _ = plan_for(["-p", "cpu", "--gpus=1"], profile=profile)  # gpu.count 0 only skips checks
    assert "GPU's NUMA node" in setting(plan, "binding", NOTE).note
    (d / "cpus.yaml").write_text(
        "partition: cpus\nfabric: {type: tcp, socket_ifname: eth0}\nnuma: {bind: slurm}\n"
    )
    plan, _ = plan_for(["-p", "cpus"], profile=load_profile("cpus", d))
    assert not any(o.startswith("--gpu-bind") for o in plan.options) and "SLURM_CPU_BIND" in plan.env


@pytest.mark.parametrize("export", ["NONE", "FOO=1", "PATH,FOO=1"])
def test_an_export_list_names_the_rendezvous_so_every_step_gets_the_batch_steps(export):
    """Under --export=NONE or a list, srun steps inherit only the listed variables: MASTER_ADDR/MASTER_PORT must
    be listed, or each step's ranks detect their own (rank 0 an address, rank 1 a node name)."""
    plan, _ = plan_for(["-p", "roce", "-N2", f"--export={export}", "--wrap", "srun true"])
    names = plan.export_option.removeprefix("--export=").split(",")
    assert {"MASTER_ADDR", "MASTER_PORT", "NCCL_IB_HCA", "STUNE_MANAGED"} <= set(names)
    assert (
        "MASTER_ADDR" not in plan.env
    )  # listed by name: the value is the batch step's, set on the first node
    plan, _ = plan_for(["-p", "roce", "-N2", "--wrap", "srun true"])
    assert plan.export_option is None


def test_a_script_sbatch_cannot_open_is_refused_by_the_dry_run(tmp_path, capsys):
    """Issue 21 §11: `--dry-run nosuch.sh` printed a whole plan and exited 0."""
    rc, out, err = dry_run(["-p", "roce", str(tmp_path / "nosuch.sh")], tmp_path, capsys)
    assert rc == 2 and out == ""
    assert err == (
        f"stune-sbatch: sbatch would refuse this command line: cannot open the batch script "
        f"'{tmp_path / 'nosuch.sh'}': No such file or directory\n"
    )


def test_directives_sbatch_refuses_are_refused_by_the_dry_run_and_said_at_submission(tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH -p roce\n#SBATCH --clus=x\ntrue\n"
    )  # cluster, clusters, ...: ambiguous
    rc, out, err = dry_run([str(script)], tmp_path, capsys)
    assert (
        rc == 2
        and out == ""
        and err
        == ("stune-sbatch: sbatch would refuse this script's #SBATCH lines: option '--clus' is ambiguous\n")
    )
    from slurm_tune.sbatch import submit

    fake = FakeSlurm()
    submit.run([str(script)], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake)
    assert fake.ran[0][0] == [str(script)] and "STUNE_MANAGED" not in fake.ran[0][1]
    assert capsys.readouterr().err == (
        "stune-sbatch: warning: sbatch will refuse this script's #SBATCH lines "
        "(option '--clus' is ambiguous): passed to it as given, without stune's "
        "settings\n"
    )
