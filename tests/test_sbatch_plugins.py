"""stune-sbatch with a site's SPANK plugin options (pyxis's --container-image ...), --stage checks at submit,
a partition without a profile, and --help without a Slurm config. No cluster: a fake Slurm answers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_tune.errors import SlurmError
from slurm_tune.sbatch import optable, options
from slurm_tune.sbatch.directives import parse_directives
from slurm_tune.sbatch.optable import parse_plugin_help
from slurm_tune.sbatch.options import LONG, NO, OPTIONAL, REQUIRED, parse_args

HELP = (Path(__file__).parent / "fixtures" / "sbatch" / "help-22.05-pyxis.txt").read_text()


@pytest.fixture(autouse=True)
def fresh_option_table(tmp_path, monkeypatch):
    """Learned options live in the module's table: each test starts from sbatch's own, with its own cache."""
    from slurm_tune.sbatch import optable

    monkeypatch.setattr(optable, "cache_path", lambda environ: str(tmp_path / "cache" / "sbatch-options.txt"))
    saved, short, keys = dict(LONG), dict(options.SHORT), set(options.PLUGIN_KEYS)
    yield
    options.SHORT.clear()
    options.SHORT.update(short)
    LONG.clear()
    LONG.update(saved)
    options.PLUGIN_KEYS.clear()
    options.PLUGIN_KEYS.update(keys)


class FakeSlurm:
    def __init__(self, help_text=HELP, help_rc=0, sbatch_rc=0):
        self.help_text, self.help_rc, self.sbatch_rc = help_text, help_rc, sbatch_rc
        self.ran, self.asked_help = [], 0

    def run_full(self, argv, timeout=None, env=None, input=None):
        assert argv == ["sbatch", "--help"]
        self.asked_help += 1
        return self.help_rc, self.help_text, ""

    def sbatch_passthrough(self, words, script, env):
        self.ran.append((words, dict(env)))
        return self.sbatch_rc, "Submitted batch job 7\n" if self.sbatch_rc == 0 else ""

    def default_partition(self):
        return "roce"


def test_plugin_options_are_read_from_sbatch_help():
    found = parse_plugin_help(HELP)
    assert found["container-image"] == (REQUIRED, "container-image")
    assert found["container-mounts"] == (REQUIRED, "container-mounts")
    assert found["container-writable"] == (NO, "container-writable")
    assert found["no-container-remap-root"] == (NO, "no-container-remap-root")
    assert found["example-level"] == (OPTIONAL, "example-level")
    assert "usage" not in found and "partition" not in found  # sbatch's own options are above the section
    assert len(found) == 13
    assert parse_plugin_help(HELP.split("Options provided by plugins:")[0]) == {}


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "Options provided by plugins:",
        "Options provided by plugins:\n--\n  --=x\n  --a b\n  --bad$name\n\x00\xff",
        "x" * 10000,
    ],
)
def test_plugin_help_garbage_is_no_options(garbage):
    assert all(all(c.isalnum() or c in "-_" for c in n) for n in parse_plugin_help(garbage))


def submit(argv, tmp_path, slurm, environ=None, stdin=None):
    from slurm_tune.sbatch import submit as sub

    env = {"STUNE_HISTORY": str(tmp_path / "h.jsonl"), **(environ or {})}
    return sub.run(argv, environ=env, slurm=slurm, stdin=stdin)


def test_a_container_image_keeps_stunes_settings_and_mounts_the_staged_data(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    fake = FakeSlurm()
    rc = submit(
        [
            "-p",
            "roce",
            "--container-image",
            "nvcr.io#nvidia/pytorch:24.05-py3",
            "--stage",
            f"{data}:DATA",
            "--container-writable",
            "--wrap",
            "python train.py",
        ],
        tmp_path,
        fake,
    )
    assert rc == 0 and fake.asked_help == 1
    words, env = fake.ran[0]
    assert words[:4] == ["-p", "roce", "--container-image", "nvcr.io#nvidia/pytorch:24.05-py3"]
    assert words[4:7] == ["--container-writable", "--wrap", "python train.py"]  # stune's come after (--wrap)
    assert f"--container-mounts=/local/nvme/stune-cache:/local/nvme/stune-cache,{data}:{data}" in words
    assert env["NCCL_IB_TC"] == "106" and env["STUNE_STAGE"].endswith(f"DATA={data}")
    assert "7" in (tmp_path / "h.jsonl").read_text()  # recorded in the history


def test_a_container_image_on_a_partition_without_a_cache_tier_mounts_the_sources(tmp_path, monkeypatch):
    """cache.path empty (no tier: the job reads the sources): the mounts are the sources alone."""
    import shutil

    profiles = tmp_path / "partitions"
    shutil.copytree(Path(__file__).resolve().parent.parent / "partitions", profiles)
    roce = profiles / "roce.yaml"
    roce.write_text(roce.read_text().replace("path: /local/nvme/stune-cache", "path: ~"))
    monkeypatch.setenv("STUNE_PARTITIONS", str(profiles))
    monkeypatch.setenv("STUNE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    fake = FakeSlurm()
    argv = ["-p", "roce", "--container-image", "img", "--stage", f"{data}:DATA", "--wrap", "true"]
    assert submit(argv, tmp_path, fake) == 0
    words, _ = fake.ran[0]
    assert f"--container-mounts={data}:{data}" in words


def test_the_users_own_container_mounts_are_kept_with_a_note(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    fake = FakeSlurm()
    submit(
        [
            "--dry-run",
            "-p",
            "roce",
            "--container-image=img",
            "--container-mounts=/a:/a",
            "--stage",
            f"{data}:DATA",
            "--wrap",
            "true",
        ],
        tmp_path,
        fake,
    )
    out = capsys.readouterr().out
    assert "sbatch -p roce --container-image=img --container-mounts=/a:/a --wrap true --requeue\n" in out
    assert "kept your --container-mounts=/a:/a (command line): add /local/nvme/stune-cache" in out
    assert "--container-image   <- a site plugin's option (learned from sbatch --help)" in out
    assert "refuse" not in out


def test_plugin_options_in_directives_are_learned_too(tmp_path, capsys):
    fake = FakeSlurm()
    script = b"#!/bin/sh\n#SBATCH --container-image img\n#SBATCH -p vpc\nsrun python train.py\n"
    rc = submit([], tmp_path, fake, stdin=_Stdin(script))
    assert rc == 0 and fake.asked_help == 1
    _words, env = fake.ran[0]
    assert env["NCCL_IB_DISABLE"] == "1"  # -p vpc after the plugin option was still read
    assert parse_directives(script.decode())[0][1].key == "partition"


def test_an_option_no_table_knows_warns_in_one_line_and_keeps_stunes_settings(tmp_path, capsys):
    """Issue 22 §1: before, the words went to sbatch with every setting dropped, exit 0, no word; and the dry
    run said "sbatch would refuse" (rc 2) for a line sbatch may accept."""
    fake = FakeSlurm(sbatch_rc=1)
    rc = submit(["--bogus", "-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert rc == 1 and fake.ran[0][0][:4] == ["--bogus", "-p", "roce", "--wrap"]
    assert fake.ran[0][1]["NCCL_IB_TC"] == "106" and "--requeue" in fake.ran[0][0]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "stune-sbatch: warning: '--bogus' (command line) is not in this Slurm's sbatch option table "
        "(sbatch --help): passed to sbatch as given; stune's settings still apply"
    ]
    assert fake.asked_help == 1
    submit(["--bogus", "-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 2  # the cached table did not know it: sbatch was asked afresh
    capsys.readouterr()
    assert (
        submit(["--dry-run", "--bogus", "-p", "roce", "--wrap", "true"], tmp_path, FakeSlurm(help_rc=1)) == 0
    )
    captured = capsys.readouterr()
    assert "'--bogus' (command line) is not in this Slurm's sbatch option table" in captured.out
    assert "refuse" not in captured.out + captured.err


def test_the_learned_table_is_cached_so_a_plain_submission_asks_once(tmp_path):
    fake = FakeSlurm()
    for _ in range(3):
        submit(["-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 1 and "container-image" in LONG  # learned once, then read from the cache
    cache = tmp_path / "cache" / "sbatch-options.txt"
    assert cache.stat().st_mode & 0o777 == 0o600 and "rp container-image" in cache.read_text()
    cache.write_text("garbage\n")  # garbage is a miss, never an option
    submit(["-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 2


def test_learned_options_take_part_in_abbreviation_like_sbatchs_getopt():
    optable.add_plugin_options(parse_plugin_help(HELP))
    assert parse_args(["--container-im=x", "job.sh"]).options[0].key == "container-image"
    assert parse_args(["--container-w", "job.sh"]).problems  # container-workdir / container-writable


class _Stdin:
    def __init__(self, data: bytes):
        self.data = data

    def read(self):
        return self.data


def test_a_partition_without_a_profile_still_exports_the_stage_variable(tmp_path, capsys):
    data = tmp_path / "ds"
    data.mkdir()
    fake = FakeSlurm()
    rc = submit(["-p", "debug", "--stage", f"{data}:DS", "--export=NONE", "--wrap", "true"], tmp_path, fake)
    words, env = fake.ran[0]
    assert rc == 0 and env["STUNE_STAGE_DS"] == str(data) and "--export=STUNE_STAGE_DS" in words
    assert "--stage" not in words
    err = capsys.readouterr().err
    assert "no cache tier for this partition: nothing is staged; STUNE_STAGE_DS=" in err
    submit(["--dry-run", "-p", "debug", "--stage", f"{data}:DS", "--wrap", "true"], tmp_path, fake)
    out = capsys.readouterr().out
    assert f"STUNE_STAGE_DS={data}" in out and "nothing is staged" in out


def test_a_stage_source_that_does_not_exist_is_warned_at_submit(tmp_path, capsys):
    fake = FakeSlurm()
    missing = tmp_path / "nope"
    submit(["-p", "roce", "--stage", f"{missing}:X", "--wrap", "true"], tmp_path, fake)
    err = capsys.readouterr().err
    assert f"warning: {missing} does not exist on this host" in err and "STUNE_STAGE_X will point at" in err
    submit(
        ["--dry-run", "-p", "roce", "--stage", f"{missing}:X", "--stage-required", "--wrap", "true"],
        tmp_path,
        fake,
    )
    out = capsys.readouterr().out
    assert "the job will fail (--stage-required)" in out
    assert "staged on each node into the cache tier: nothing" in out


def test_help_answers_with_exit_0_whatever_sbatch_does(tmp_path, capsys):
    """Issue 21 §10: without a Slurm config, --help exited 1 after four lines of sbatch errors."""

    class NoConfig(FakeSlurm):
        def run_full(self, argv, timeout=None, env=None, input=None):
            return 1, "", "sbatch: fatal: Could not establish a configuration source\n"

    assert submit(["--help"], tmp_path, NoConfig()) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Usage: stune-sbatch [sbatch options]") and err == ""
    assert "stune-sbatch options (everything else is sbatch's" in out

    class NoSbatch(FakeSlurm):
        def run_full(self, argv, timeout=None, env=None, input=None):
            raise SlurmError(["sbatch"], 127, "cannot run sbatch: No such file or directory")

    assert submit(["-p", "roce", "-h"], tmp_path, NoSbatch()) == 0
    assert "--checkpoint-signal" in capsys.readouterr().out
    assert submit(["--help"], tmp_path, FakeSlurm()) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: sbatch [OPTIONS(0)...]") and "--checkpoint-signal" in out


def test_history_records_a_digest_of_the_script_and_diff_says_it_changed(tmp_path):
    from slurm_tune.sbatch import historyview as history

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p roce\nsrun python train.py --lr 0.1\n")
    fake = FakeSlurm()
    env = {"STUNE_HISTORY": str(tmp_path / "h.jsonl")}
    submit([str(script)], tmp_path, fake, environ=env)
    submit([str(script)], tmp_path, fake, environ=env)
    script.write_text("#!/bin/sh\n#SBATCH -p roce\nsrun python train.py --lr 0.2\n")
    submit([str(script)], tmp_path, fake, environ=env)
    entries = history.load(env)
    assert len(entries) == 3 and all(len(e["script_sha256"]) == 16 for e in entries)
    assert history.diff(entries[0], entries[1]) == []
    assert history.diff(entries[1], entries[2]) == [
        f"script content changed: sha256 {entries[1]['script_sha256']} -> {entries[2]['script_sha256']} "
        f"({script})"
    ]


def test_the_history_keeps_the_submission_time_and_directory_of_a_waiting_sbatch(tmp_path, monkeypatch):
    """The entry is written after sbatch returns, which with --wait is when the job ends: its time and
    directory are still the submission's."""
    import time

    from slurm_tune.sbatch import historyview as history

    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    workdir, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    workdir.mkdir()
    elsewhere.mkdir()

    class Waiting(FakeSlurm):
        def sbatch_passthrough(self, words, script, env):
            clock[0] += 3600  # the job ran for an hour
            os.chdir(elsewhere)
            return 0, "Submitted batch job 7\n"

    env = {"STUNE_HISTORY": str(tmp_path / "h.jsonl")}
    monkeypatch.chdir(workdir)
    submit(["-p", "roce", "--wait", "--wrap", "true"], tmp_path, Waiting(), environ=env)
    (entry,) = history.load(env)
    assert entry["time"] == 1_800_000_000 and entry["cwd"] == str(workdir) and entry["job_id"] == "7"


def test_the_dev_cluster_node_names_resolve_through_a_hosts_line(tmp_path):
    from stune_dev.devcluster import NODES, ensure_node_names_resolve

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.2 n2  # a site's own entry is left alone")
    ensure_node_names_resolve(hosts)
    ensure_node_names_resolve(hosts)  # idempotent
    lines = hosts.read_text().splitlines()
    assert lines[1] == "10.0.0.2 n2  # a site's own entry is left alone"
    assert lines[2].split("#")[0].split() == ["127.0.0.1"] + [n for n in NODES if n != "n2"]
    assert len(lines) == 3


def test_devcluster_env_prints_the_profile_directory(tmp_path, capsys, monkeypatch):
    from stune_dev import devcluster

    monkeypatch.setenv("STUNE_PARTITIONS", str(tmp_path))
    assert devcluster.main(["env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("export SLURM_CONF=") and out[1] == f"export STUNE_PARTITIONS={tmp_path}"


# A newer release's help: the 22.05 capture above its plugin section, plus lines for options 24.11 and 26.05
# add, written by hand in the layout sbatch prints (no 24.11/26.05 `sbatch --help` capture is available here;
# the cluster corpus test, tests/test_sbatch_corpus.py, runs against whatever real sbatch the suite has).
NEWER_HELP = (
    HELP.split("Options provided by plugins:")[0].rstrip("\n")
    + """
      --tres-per-task=list    list of tres required per task
      --oom-kill-step[=0|1]   set the OOMKillStep behaviour for the job's steps
      --mem-update=interval   update the job's memory limit every interval
      --container-type=type   the container runtime to use
"""
)


@pytest.mark.parametrize(
    "words",
    [
        ["--tres-per-task=gres/gpu:1"],
        ["--tres-per-task", "gres/gpu:1"],
        ["--oom-kill-step"],
        ["--oom-kill-step=1"],
        ["--mem-update=30"],
        ["--container-type", "oci"],
        ["--tres-per-t", "cpu:2"],
    ],
)
def test_options_of_a_newer_release_are_learned_not_warned(words, tmp_path, capsys):
    """Issue 22 §1: with a newer sbatch's table, its options are options: stune's settings, no warning, and the
    words reach sbatch as given (before the script)."""
    fake = FakeSlurm(help_text=NEWER_HELP)
    rc = submit(["-p", "roce", *words, "--wrap", "true"], tmp_path, fake)
    assert rc == 0 and capsys.readouterr().err == ""
    sent, env = fake.ran[0]
    assert sent[: 2 + len(words)] == ["-p", "roce", *words] and env["NCCL_IB_TC"] == "106"
    assert submit(["--dry-run", "-p", "roce", *words, "--wrap", "true"], tmp_path, fake) == 0
    captured = capsys.readouterr()
    assert "option table" not in captured.out + captured.err and "refuse" not in captured.err
    # the same words under the 22.05 table (another release: another sbatch binary, so another cache key):
    # warned in one line, the settings still there
    (tmp_path / "cache" / "sbatch-options.txt").unlink()
    fake = FakeSlurm()
    submit(["-p", "roce", *words, "--wrap", "true"], tmp_path / "old", fake)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is not in this Slurm's sbatch option table" in err[0]
    assert fake.ran[0][1]["NCCL_IB_TC"] == "106"


def test_the_cache_key_follows_the_sbatch_binary_slurm_conf_and_the_plugin_stack(tmp_path):
    from slurm_tune.sbatch import optable
    from slurm_tune.slurm.commands import SlurmCommands

    help_file = tmp_path / "help.txt"
    help_file.write_text(HELP)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f"#!/bin/sh\ncat {help_file}\n")
    (bindir / "sbatch").chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=x\n")
    slurm = SlurmCommands(conf=str(etc / "slurm.conf"), bin_dir=str(bindir))
    environ = {"SLURM_CONF": str(etc / "slurm.conf"), "PATH": os.environ["PATH"]}
    assert optable.learn(slurm, environ) == "asked" and "container-image" in LONG
    assert optable.learn(slurm, environ) == "cached"
    (etc / "plugstack.conf").write_text("required /usr/lib/pyxis/spank_pyxis.so\n")  # a plugin added
    assert optable.learn(slurm, environ) == "asked"
    assert optable.learn(slurm, environ) == "cached"
    (bindir / "sbatch").write_text(f"#!/bin/sh\n# an upgrade\ncat {help_file}\n")
    assert optable.learn(slurm, environ) == "asked"
    (etc / "slurm.conf").write_text("ClusterName=x\nPlugStackConfig=/elsewhere\n")
    assert optable.learn(slurm, environ) == "asked"
    help_file.write_text("sbatch: fatal: Could not establish a configuration source\n")
    assert optable.learn(slurm, environ, fresh=True) == "built-in"  # not sbatch's help: the built-in table


def test_an_sbatch_that_cannot_answer_is_asked_once_in_a_while_not_per_submission(tmp_path, monkeypatch):
    from slurm_tune.sbatch import optable

    fake = FakeSlurm(help_rc=1)  # no Slurm configuration reachable for `sbatch --help`
    for _ in range(3):
        submit(["-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 1 and fake.ran[-1][1]["NCCL_IB_TC"] == "106"  # the built-in table still reads
    monkeypatch.setattr(optable, "UNANSWERED_TTL_S", 0)
    submit(["-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 2


def test_help_without_any_slurm_config_exits_0_in_one_piece(tmp_path):
    """Issue 21 §10, as a user meets it: the real sbatch, a slurm.conf that does not exist."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "STUNE_"))}
    env.update(SLURM_CONF=str(tmp_path / "no-slurm.conf"), STUNE_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "stune-sbatch"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert (
        out.stdout.startswith("Usage: stune-sbatch [sbatch options]") and "--checkpoint-signal" in out.stdout
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="root's rule: the cache must be writable by root alone")
def test_root_neither_reads_nor_writes_a_table_cache_others_could_write(tmp_path, monkeypatch):
    from slurm_tune.sbatch import optable

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a cache directory anyone can write: a planted table must not be read by root
    monkeypatch.setattr(optable, "cache_path", lambda environ: str(shared / "sbatch-options.txt"))
    fake = FakeSlurm()
    for _ in range(2):
        submit(["-p", "roce", "--wrap", "true"], tmp_path, fake)
    assert fake.asked_help == 2 and not (shared / "sbatch-options.txt").exists()
