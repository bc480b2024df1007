"""Reading sbatch's command line and #SBATCH directives the way Slurm 22.05's sbatch does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_tune.sbatch.directives import parse_directives, split_directive
from slurm_tune.sbatch.options import (
    AMBIGUOUS,
    LONG,
    SHORT,
    Effective,
    Opt,
    lookup_long,
    node_range,
    parse_args,
)
from slurm_tune.sbatch.submit import job_id_from, sbatch_words


def keys(parsed):
    return [(o.key, o.value) for o in parsed.options]


def test_long_options_with_equals_or_separate_value_and_flags():
    p = parse_args(
        ["--partition=roce", "--nodes", "2", "--requeue", "--job-name", "x y", "job.sh", "a", "-p", "b"]
    )
    assert keys(p) == [("partition", "roce"), ("nodes", "2"), ("requeue", None), ("job-name", "x y")]
    assert p.script_index == 6 and not p.problems


def test_short_options_glued_separate_and_clustered():
    p = parse_args(["-N2", "-p", "vpc", "-HQn", "4", "-J-dashed", "run.sh"])
    assert keys(p) == [
        ("nodes", "2"),
        ("partition", "vpc"),
        ("hold", None),
        ("quiet", None),
        ("ntasks", "4"),
        ("job-name", "-dashed"),
    ]
    assert p.script_index == 6


def test_a_value_that_looks_like_an_option_is_still_the_value():
    p = parse_args(["-J", "--dry-run", "-p", "--requeue", "job.sh"])
    assert keys(p) == [("job-name", "--dry-run"), ("partition", "--requeue")]
    assert p.stune == [] and p.script_index == 4


def test_optional_arguments_only_attach_with_equals_or_glued():
    p = parse_args(["--exclusive", "--exclusive=user", "-k", "--nice", "job.sh"])
    assert keys(p) == [("exclusive", None), ("exclusive", "user"), ("no-kill", None), ("nice", None)]
    assert p.script_index == 4


def test_unique_prefixes_resolve_like_getopt_long():
    assert lookup_long("part") == LONG["partition"]
    assert lookup_long("clus") is AMBIGUOUS  # cluster, clusters and cluster-constraint: ambiguous
    assert lookup_long("cluste") is AMBIGUOUS
    assert lookup_long("no-such-option") is None
    assert lookup_long("clusters") == LONG["clusters"]
    assert lookup_long("cluster") == LONG["clusters"]  # an alias of --clusters
    assert lookup_long("tasks-per") == (LONG["tasks-per-node"][0], "ntasks-per-node")


def test_problems_sbatch_would_reject():
    assert parse_args(["--clus=x", "job.sh"]).problems == ["option '--clus' is ambiguous"]
    assert parse_args(["-p"]).problems == ["option requires an argument -- 'p'"]
    assert parse_args(["--partition"]).problems == ["option '--partition' requires an argument"]
    assert parse_args(["--requeue=yes"]).problems == ["option '--requeue' doesn't allow an argument"]


def test_a_word_the_table_cannot_classify_is_unknown_not_a_refusal(tmp_path):
    """Issue 22 §1: an option of a newer release or an unlisted plugin is read, said, and never a refusal."""
    p = parse_args(["--tres-per-task=gres/gpu:1", "-p", "roce", "job.sh"])
    assert not p.problems and p.insert_at is None and p.script_index == 3
    assert p.unknown == [
        "'--tres-per-task=gres/gpu:1' (command line) is not in this Slurm's sbatch option table "
        "(sbatch --help): passed to sbatch as given"
    ]
    assert keys(p) == [("partition", "roce")]
    # followed by a word and then a script: the word is its value; stune's options go before the option
    argv = ["-N", "2", "--container-image", "img", "-p", "roce", "job.sh", "--lr", "1"]
    p = parse_args(argv)
    assert keys(p) == [("nodes", "2"), ("partition", "roce")] and p.script_index == 6 and p.insert_at == 2
    assert "read 'img' as its value" in p.unknown[0]
    assert sbatch_words(argv, p, ["--requeue"]) == [
        "-N",
        "2",
        "--requeue",
        "--container-image",
        "img",
        "-p",
        "roce",
        "job.sh",
        "--lr",
        "1",
    ]
    # followed by an existing file and nothing that could be a script: a flag, and the file the script
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    p = parse_args(["--oom-kill-step", str(script)])
    assert p.script_index == 1 and p.insert_at is None and "read as a flag" in p.unknown[0]
    # an unknown short option: its value may be glued on
    p = parse_args(["-y3", "-p", "vpc", "job.sh"])
    assert keys(p) == [("partition", "vpc")] and p.script_index == 3 and p.unknown and not p.problems


def test_options_stop_at_the_script_and_at_double_dash():
    p = parse_args(["-p", "roce", "--", "--weird-name.sh", "-N", "3"])
    assert keys(p) == [("partition", "roce")] and p.dashdash == 2 and p.script_index == 3
    p = parse_args(["-p", "roce", "train.sh", "--nodes", "4"])
    assert keys(p) == [("partition", "roce")] and p.script_index == 2


def test_stune_options_are_exact_and_removed_from_what_sbatch_sees():
    argv = [
        "--dry-run",
        "-p",
        "roce",
        "--stage",
        "/data/x.tar:X",
        "--stage=/d/y",
        "--stage-required",
        "job.sh",
        "--dry-run",
    ]
    p = parse_args(argv)
    assert [(o.key, o.value) for o in p.stune] == [
        ("stune:dry-run", None),
        ("stune:stage", "/data/x.tar:X"),
        ("stune:stage", "/d/y"),
        ("stune:stage-required", None),
    ]
    assert sbatch_words(argv, p, []) == ["-p", "roce", "job.sh", "--dry-run"]
    # stune's additions go right before the script; the script's own arguments stay after it
    assert sbatch_words(argv, p, ["--requeue"]) == ["-p", "roce", "--requeue", "job.sh", "--dry-run"]
    assert parse_args(["--dry"]).unknown and not parse_args(["--dry"]).stune  # no abbreviation of stune's


def test_additions_go_before_double_dash_or_at_the_end_for_wrap_and_stdin():
    p = parse_args(["-p", "x", "--", "job.sh"])
    assert sbatch_words(["-p", "x", "--", "job.sh"], p, ["--requeue"]) == [
        "-p",
        "x",
        "--requeue",
        "--",
        "job.sh",
    ]
    p = parse_args(["--wrap", "hostname"])
    assert sbatch_words(["--wrap", "hostname"], p, ["--requeue"]) == ["--wrap", "hostname", "--requeue"]


def test_heterogeneous_job_separator_is_noticed():
    p = parse_args(["-N1", ":", "-N2", "job.sh"])
    assert p.het and p.script_index == 3


def test_directive_words_follow_sbatch_quoting_escapes_and_comments():
    assert split_directive(' --job-name="a b" -p roce # -N 3') == ["--job-name=a b", "-p", "roce"]
    assert split_directive(r" --comment=it\'s") == ["--comment=it's"]
    # as in sbatch's _get_argument, white space ends a word even after a backslash
    assert split_directive(r" --comment=a\ b") == ["--comment=a", "b"]
    assert split_directive(" --comment='# not a comment'") == ["--comment=# not a comment"]
    assert split_directive("   ") == []


def test_directives_stop_at_the_first_command_and_need_column_zero():
    script = (
        "#!/bin/bash\n\n# a comment\n  #SBATCH -p ignored\n#SBATCH -p roce\n#SBATCH --nodes=2 -J x\n"
        "#SLURM --requeue\nsrun hostname\n#SBATCH -p too-late\n"
    )
    opts, het = parse_directives(script)
    assert [(o.key, o.value, o.where) for o in opts] == [
        ("partition", "roce", "script line 5"),
        ("nodes", "2", "script line 6"),
        ("job-name", "x", "script line 6"),
        ("requeue", None, "script line 7"),
    ]
    assert not het


def test_directives_of_a_het_job_are_read_for_its_first_component():
    opts, het = parse_directives("#!/bin/sh\n#SBATCH -p roce\n#SBATCH hetjob\n#SBATCH -p vpc\ntrue\n")
    assert [(o.key, o.value) for o in opts] == [("partition", "roce")] and het


def test_precedence_command_line_then_environment_then_script():
    script = [Opt("partition", "vpc", "script line 2")]
    cmd = [Opt("partition", "hdr", "command line")]
    assert Effective(cmd, script, {"SBATCH_PARTITION": "roce"}).get("partition").value == "hdr"
    env_wins = Effective([], script, {"SBATCH_PARTITION": "roce"}).get("partition")
    assert (env_wins.value, env_wins.where) == ("roce", "$SBATCH_PARTITION")
    assert Effective([], script, {}).get("partition").where == "script line 2"
    assert Effective([], [], {}).get("partition") is None
    # the last of several occurrences wins, as sbatch overwrites the value
    two = [Opt("partition", "a", "command line"), Opt("partition", "b", "command line")]
    assert Effective(two, [], {}).get("partition").value == "b"


def test_node_ranges():
    assert node_range("2") == (2, 2)
    assert node_range("1-4") == (1, 4)
    assert node_range("2k") == (2048, 2048)
    assert node_range("two") is None and node_range(None) is None


def test_job_id_from_sbatch_output_forms():
    assert job_id_from("Submitted batch job 42\n") == ("42", None)
    assert job_id_from("Submitted batch job 42 on cluster east\n") == ("42", "east")
    assert job_id_from("42\n") == ("42", None)
    assert job_id_from("42;east\n") == ("42", "east")
    assert job_id_from("") == (None, None)


def test_the_table_agrees_with_itself():
    for letter, (has_arg, key) in SHORT.items():
        assert LONG[key][0] == has_arg, letter


_WORDS = st.sampled_from(
    [
        "-p",
        "roce",
        "--partition=vpc",
        "-N2",
        "--nodes",
        "3",
        "-HQ",
        "--requeue",
        "--export=NONE",
        "-J",
        "name",
        "--wrap",
        "true",
        "--dry-run",
        "--stage",
        "/d/x",
        ":",
        "--",
        "job.sh",
        "arg",
        "-x",
        "n1",
        "--exclusive",
        "--bogus",
    ]
)


@given(st.lists(_WORDS, max_size=12))
def test_parsing_never_raises_and_indices_are_consistent(argv):
    p = parse_args(argv)
    assert p.script_index is None or 0 <= p.script_index < len(argv)
    assert all(0 <= i < len(argv) for i in p.stune_words)
    words = sbatch_words(argv, p, ["--requeue"])
    kept = [w for i, w in enumerate(argv) if i not in p.stune_words]
    assert words.count("--requeue") == kept.count("--requeue") + 1
    if p.script_index is not None:  # the script and its arguments are untouched, in order, at the end
        tail = argv[p.script_index :]
        assert words[len(words) - len(tail) :] == tail


@pytest.mark.parametrize("script", ["", "\n\n", "#!/bin/sh\n#SBATCH", "#SBATCH '\n", "#SBATCH \\"])
def test_odd_scripts_do_not_break_the_reader(script):
    """Empty scripts, a bare magic word, a lone quote or backslash: no options, not a het job, nothing for
    sbatch to refuse (it reads no word there either)."""
    problems: list[str] = []
    assert parse_directives(script, problems) == ([], False)
    assert problems == []


@pytest.mark.parametrize(
    "script, want, het",
    [
        ("#!/bin/sh\n#SBATCH -N 2\n\n#SBATCH -p vpc\n", [("nodes", "2", 2), ("partition", "vpc", 4)], False),
        ("#!/bin/sh\necho hi\n#SBATCH -p late\n", [], False),  # after the first command: ignored
        ("#SBATCH -p a\n#SBATCH hetjob\n#SBATCH -p b\n", [("partition", "a", 1)], True),  # first component
        ("#SBATCH -J 'two words' # a comment\n", [("job-name", "two words", 1)], False),
    ],
)
def test_directives_around_the_odd_ones_are_still_read(script, want, het):
    options, is_het = parse_directives(script)
    assert [(o.key, o.value, int(o.where.rsplit(" ", 1)[1])) for o in options] == want
    assert is_het is het


def test_the_options_in_effect_are_read_once_when_made():
    """Effective resolves command line > SBATCH_* > #SBATCH once: a later get() is a lookup, not another
    walk of the environment."""
    environ = {"SBATCH_PARTITION": "roce", "SBATCH_SIGNAL": "USR2@60"}
    eff = Effective(
        parse_args(["-N", "2", "--signal=USR1", "x.sh"]).options,
        parse_directives("#SBATCH -p hdr\n#SBATCH -t 5\n#SBATCH -t 10\n")[0],
        environ,
    )
    environ.clear()
    assert (eff.get("partition").value, eff.get("partition").where) == ("roce", "$SBATCH_PARTITION")
    assert (
        eff.get("signal").value == "USR1" and eff.get("time").value == "10" and eff.get("nodes").value == "2"
    )
    assert eff.given("no-requeue", "nodes").key == "nodes" and eff.get("wrap") is None


def test_what_the_user_asked_is_one_request_read_once(tmp_path):
    """request.read_request: the command line, the script and its directives, stune's own options, read once
    into one Request that the later stages (plan, dry run, submission, history) take."""
    import io

    from slurm_tune.sbatch.request import read_request

    class NoSbatch:  # sbatch cannot answer --help: the built-in table
        def executable(self, name):
            return "/nonexistent/sbatch"

        def run_full(self, *a, **k):
            from slurm_tune.errors import SlurmError

            raise SlurmError(["sbatch"], 1, "no")

    environ = {"STUNE_CACHE_DIR": str(tmp_path), "SBATCH_PARTITION": "vpc"}
    script = b"#!/bin/sh\n#SBATCH -N 2\n#SBATCH hetjob\ntrap 'x' USR1\n"
    req = read_request(
        ["--dry-run", "--json", "--stage", "/a", "--stage=/b:B", "--node-summary", "-t", "5"],
        environ,
        io.BytesIO(script),
        NoSbatch(),
    )
    assert req.refusal is None and req.dry_run and req.as_json and req.node_summary and not req.stage_required
    assert req.stage_args == ["/a", "/b:B"] and req.label == "<stdin>" and req.stdin_bytes == script
    assert (
        req.het and req.eff.get("nodes").where == "script line 2" and req.eff.get("partition").value == "vpc"
    )
    assert req.script == script.decode()
    refused = read_request(["--nodes"], environ, None, NoSbatch())
    assert refused.refusal.what == "this command line" and refused.refusal.problems and refused.eff is None
    wrapped = read_request(["--json", "--wrap", "trap x USR1"], environ, None, NoSbatch())
    assert not wrapped.as_json and wrapped.script == "trap x USR1" and wrapped.label == "--wrap"
