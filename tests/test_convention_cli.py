"""One CLI convention (issue 14): shared options defined once, --json on every read command in one style, one
exit-status table that every command uses, one column-table helper, and the old spellings still accepted."""

from __future__ import annotations

import argparse
import ast
import configparser
import decimal
import json
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from slurm_tune import errors
from slurm_tune.cli import admin, fairshare, health, options, sampler, sbatch, stage, sweep, validate
from slurm_tune.output import json_text, table

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

PARSERS = {  # every argparse command: its parser, built as the command builds it
    "stune-admin": admin._parser,
    "stune-fairshare": fairshare._parser,
    "stune-gpu-sampler": sampler._parser,
    "stune-stage": stage._parser,
    "stune-sweep": sweep._parser,
    "stune-validate": validate._parser,
    "stune-sbatch history": sbatch._history_parser,
}
# The read commands the issue lists, and the others that print what they read: each takes --json.
READ_COMMANDS = {
    ("stune-admin", "check-profiles"),
    ("stune-admin", "doctor"),
    ("stune-gpu-sampler", "status"),
    ("stune-fairshare", "apply"),
    ("stune-fairshare", "report"),
    ("stune-fairshare", "explain"),
    ("stune-fairshare", "job"),
    ("stune-fairshare", "idle-policy"),
    ("stune-stage", "ls"),
    ("stune-stage", "status"),
    ("stune-sweep", "report"),
    ("stune-sweep", "history"),
    ("stune-validate", "run"),
    ("stune-validate", "report"),
    ("stune-validate", "show"),
    ("stune-sbatch history", ""),
}
DRY_RUN_COMMANDS = {
    ("stune-admin", "install"),
    ("stune-admin", "uninstall"),
    ("stune-fairshare", "apply"),
    ("stune-fairshare", "idle-policy"),
    ("stune-stage", "gc"),
    ("stune-sweep", "run"),
    ("stune-sweep", "judge"),
    ("stune-validate", "run"),
    ("stune-validate", "report"),
}


def subcommands(prog: str):
    """(subcommand name, its parser) for every subcommand; ("", parser) for a parser without any."""
    parser = PARSERS[prog]()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [("", parser)]
    seen = {}
    for name, sub in subs[0].choices.items():
        seen.setdefault(id(sub), (name, sub))  # an alias (`stage` for `fetch`) is the same parser
    return list(seen.values())


ALL_SUBCOMMANDS = [(prog, name, sub) for prog in PARSERS for name, sub in subcommands(prog)]


def flags_of(parser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


# ---- shared options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prog, name, parser", ALL_SUBCOMMANDS, ids=[f"{p} {n}" for p, n, _ in ALL_SUBCOMMANDS]
)
def test_a_shared_spelling_is_always_the_shared_option(prog, name, parser):
    """Wherever -p, --partition, --node, --sysfs-root, --json or --dry-run appears, it is options.add's option:
    all of its spellings, its dest, its kind (a flag or a value). `-n` is never dry-run again."""
    found = flags_of(parser)
    for shared, (spellings, takes_value, _) in options.SHARED.items():
        present = [f for f in spellings if f in found]
        if not present:
            continue
        action = found[present[0]]
        assert tuple(action.option_strings) == spellings, (
            f"{prog} {name}: {action.option_strings} != {spellings}"
        )
        assert action.dest == shared, f"{prog} {name}: {spellings[-1]} stores into {action.dest}"
        assert (action.nargs != 0) == takes_value, f"{prog} {name}: {spellings[-1]} flag/value mismatch"
    if "-n" in found and found["-n"].help != argparse.SUPPRESS:
        assert found["-n"].dest == "last" and found["-n"].type is not None, f"{prog} {name}: -n is a count"


@pytest.mark.parametrize("prog, name", sorted(READ_COMMANDS))
def test_every_read_command_takes_json(prog, name):
    parser = dict(subcommands(prog))[name]
    action = flags_of(parser).get("--json")
    assert action is not None and action.dest == "json" and action.help != argparse.SUPPRESS, f"{prog} {name}"


@pytest.mark.parametrize("prog, name", sorted(DRY_RUN_COMMANDS))
def test_every_command_that_changes_things_takes_dry_run(prog, name):
    assert flags_of(dict(subcommands(prog))[name]).get("--dry-run") is not None, f"{prog} {name}"


def test_stune_health_takes_the_shared_spellings_from_the_one_definition():
    for command in health.COMMANDS:
        allowed = health.allowed_options(command)
        for shared in health.SHARED_COMMON:
            for flag in options.flags(shared):
                assert allowed[flag] == (shared, options.takes_value(shared)), (command, flag)
    for command in ("check", "run", "status", "capture"):
        assert health.allowed_options(command)["--json"] == ("json", False)
    assert health.allowed_options("run")["--dry-run"] == ("dry_run", False)
    assert health.parse(["check", "-p", "hdr", "--snapshot", "s.json"]) == (
        "check",
        {"partition": "hdr", "snapshot": "s.json"},
    )
    assert health.parse(["run", "--partition=hdr", "--dry-run", "--json"]) == (
        "run",
        {"partition": "hdr", "dry_run": True, "json": True},
    )


def console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return dict(
        line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    )


WORDS_IN_HELP = {  # the options each command's own --help must show (subcommand: words)
    "stune-admin": {"check-profiles": ["--json"], "doctor": ["--json"], "install": ["--dry-run"]},
    "stune-fairshare": {
        "apply": ["--dry-run", "--json"],
        "report": ["--json", "--format"],
        "idle-policy": ["--dry-run", "--node", "--json"],
    },
    "stune-gpu-sampler": {"status": ["--json"], "run": ["--gpu-snapshot"]},
    "stune-stage": {
        "ls": ["-p PARTITION, --partition PARTITION", "--node", "--json"],
        "gc": ["--dry-run"],
        "epilog": ["--partition"],
    },
    "stune-sweep": {"report": ["-p PARTITION, --partition PARTITION", "--json"], "judge": ["--dry-run"]},
    "stune-validate": {
        "run": ["-p PARTITION, --partition PARTITION", "--json", "--dry-run"],
        "show": ["--json"],
    },
    "stune-health": {
        "check": ["-p, --partition", "--json", "--node", "--sysfs-root"],
        "run": ["--dry-run", "--json"],
        "status": ["--json"],
    },
    "stune-devcluster": {"status": ["--json"]},
    "stune-sbatch": {"history": ["-n N, --last N", "--json"]},
}


@pytest.mark.parametrize("command", sorted(console_scripts()))
def test_every_console_script_answers_help_with_the_shared_options(command):
    """Walks every console script of setup.cfg: `--help` on each subcommand that WORDS_IN_HELP names exits 0 and
    shows the shared options, old spellings stay hidden, and no help is a traceback."""
    assert (BIN / command).exists(), f"{command} is not installed: run scripts/setup.sh"
    if (
        command == "stune-sbatch"
    ):  # its bare --help is sbatch's own (needs a slurm.conf): its history is stune's
        runs = [("history", ["history", "--help"])]
    else:
        runs = [("", ["--help"])] + [(sub, [sub, "--help"]) for sub in WORDS_IN_HELP.get(command, {})]
    for sub, argv in runs:
        proc = subprocess.run([str(BIN / command), *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == errors.EXIT_OK, (command, argv, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout.strip(), (command, argv)
        for word in WORDS_IN_HELP.get(command, {}).get(sub, []):
            assert word in proc.stdout, f"`{command} {sub} --help` lacks {word}"
        for old in ("--snapshot FILE", "--epilog", "-n, --dry-run", "--dry-run, -n"):
            if command != "stune-health":  # stune-health's --snapshot is a node snapshot, as documented
                assert old not in proc.stdout, f"`{command} {sub} --help` shows the old spelling {old}"


# ---- the old spellings ---------------------------------------------------------------------------------------


def test_old_spellings_still_work_with_a_note(capsys):
    args = stage._parser().parse_args(["gc", "-n"])
    assert args.dry_run is True
    assert "stune-stage: note: -n is deprecated; use --dry-run" in capsys.readouterr().err
    assert stage._parser().parse_args(["gc"]).dry_run is False
    args = stage._parser().parse_args(["release", "--epilog", "--job", "5"])
    assert args.epilog is True and args.job == "5" and "use `stune-stage epilog`" in capsys.readouterr().err
    args = stage._parser().parse_args(["epilog"])
    assert args.cmd == "epilog" and args.epilog is True and capsys.readouterr().err == ""
    args = sampler._parser().parse_args(["run", "--snapshot", "g.json"])
    assert (
        args.gpu_snapshot == "g.json"
        and "note: --snapshot is deprecated; use --gpu-snapshot" in capsys.readouterr().err
    )
    assert sampler._parser().parse_args(["run", "--gpu-snapshot", "g.json"]).gpu_snapshot == "g.json"
    assert capsys.readouterr().err == ""


def test_history_n_is_a_count_and_diff_takes_negative_run_numbers(tmp_path, monkeypatch, capsys):
    history = tmp_path / "h.jsonl"
    history.write_text(
        "".join(
            json.dumps(
                {
                    "v": 1,
                    "time": 1700000000 + i,
                    "job_id": str(10 + i),
                    "partition": "hdr",
                    "argv": ["-p", "hdr", f"s{i}.sh"],
                    "env": {"A": str(i)},
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    monkeypatch.setenv("STUNE_HISTORY", str(history))
    monkeypatch.setenv("STUNE_SLURM_BIN", str(tmp_path / "no-slurm"))  # no sacct: the throughput is '?'
    assert sbatch.main(["history", "-n", "2"]) == errors.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    header = ["when", "job", "partition", "digest", "samples/s", "data", "wait", "command"]
    assert lines[0].split() == header and len(lines) == 3
    assert [line.split()[2] for line in lines[1:]] == ["11", "12"]
    assert sbatch.main(["history", "--last", "1", "--json"]) == errors.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert [e["job_id"] for e in doc] == ["12"]
    assert sbatch.main(["history", "diff", "-2", "-1", "--json"]) == errors.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"]["job_id"] == "11" and doc["b"]["job_id"] == "12" and doc["differences"]
    with pytest.raises(SystemExit) as exc:
        sbatch.main(["history", "-n", "x"])
    assert exc.value.code == errors.EXIT_USAGE


# ---- stune-sbatch --dry-run --json ---------------------------------------------------------------------------


class FakeSlurm:
    def __init__(self):
        self.ran = []

    def sbatch_passthrough(self, words, script, env):
        self.ran.append(words)
        return 0, "Submitted batch job 7\n"

    def run_full(self, argv, timeout=None, env=None):
        return 0, "Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n", ""

    def default_partition(self):
        return "roce"

    def degraded_nodes(self):
        return []


def test_sbatch_dry_run_json_is_the_explanation_as_data(capsys, tmp_path, monkeypatch):
    from slurm_tune.sbatch import submit

    monkeypatch.setenv("STUNE_PARTITIONS", str(REPO / "partitions"))
    fake = FakeSlurm()
    rc = submit.run(["--dry-run", "--json", "-p", "roce", "--wrap", "true"], environ={}, slurm=fake)
    out = capsys.readouterr().out
    assert rc == 0 and fake.ran == []
    doc = json.loads(out)
    assert out == json_text(doc)  # the one style
    assert doc["submitted"] is False and doc["partition"] == "roce" and doc["profile"]["fabric"] == "roce"
    assert doc["sbatch"][0] == "sbatch" and "--json" not in doc["sbatch"] and "--wrap" in doc["sbatch"]
    assert any(s["name"] == "NCCL_IB_GID_INDEX" or s["name"].startswith("NCCL_") for s in doc["settings"])
    assert all(set(s) == {"kind", "name", "value", "source", "applied", "note"} for s in doc["settings"])
    assert all(
        doc["env"][s["name"]] == s["value"] for s in doc["settings"] if s["kind"] == "env" and s["applied"]
    )
    # the plain dry run says the same things, in words
    submit.run(["--dry-run", "-p", "roce", "--wrap", "true"], environ={}, slurm=fake)
    text = capsys.readouterr().out
    assert (
        text.startswith("stune-sbatch --dry-run: nothing was submitted") and doc["profile"]["digest"] in text
    )


def test_sbatch_json_without_dry_run_is_left_to_sbatch(tmp_path, capsys):
    from slurm_tune.sbatch import submit

    fake = FakeSlurm()
    submit.run(
        ["--json", "-p", "roce", "--wrap", "true"], environ={"STUNE_HISTORY": str(tmp_path / "h")}, slurm=fake
    )
    assert fake.ran and "--json" in fake.ran[0]  # sbatch's to accept or refuse, in its own words


# ---- one exit-status table -----------------------------------------------------------------------------------


def test_the_exit_table_is_consistent_and_readme_shows_it():
    codes = [code for _, code, _, _ in errors.TABLE]
    names = [name for name, _, _, _ in errors.TABLE]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)
    assert all(getattr(errors, name) == code for name, code, _, _ in errors.TABLE)
    assert set(errors.EXIT_BY_STATUS.values()) <= set(codes)
    defined = {n for n in vars(errors) if n.startswith("EXIT_") and isinstance(getattr(errors, n), int)}
    assert defined == set(names), "an EXIT_ name outside the table"
    assert errors.markdown_table() in (REPO / "README.md").read_text(), "README's exit-status table is stale"


def entry_modules():
    return [*sorted((REPO / "slurm_tune" / "cli").glob("*.py")), REPO / "stune_dev" / "devcluster.py"]


@pytest.mark.parametrize("path", entry_modules(), ids=lambda p: p.name)
def test_commands_return_the_tables_names_never_bare_numbers(path):
    tree = ast.parse(path.read_text(), str(path))
    table_names = {name for name, _, _, _ in errors.TABLE} | {"EXIT_BY_STATUS"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int)
            and not isinstance(node.value.value, bool)
        ):
            pytest.fail(f"{path.name}:{node.lineno}: return {node.value.value}: use the EXIT_ name")
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) in ("exit", "_exit")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int)
        ):
            pytest.fail(f"{path.name}:{node.lineno}: exit({node.args[0].value}): use the EXIT_ name")
        if isinstance(node, ast.Name) and node.id.startswith("EXIT_"):
            assert node.id in table_names, f"{path.name}:{node.lineno}: {node.id} is not in errors.TABLE"
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets
        ):
            pytest.fail(f"{path.name}:{node.lineno}: an exit status defined outside errors.py")


def test_no_exit_status_is_defined_outside_the_table():
    for path in (REPO / "slurm_tune").rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets
            ):
                pytest.fail(f"{path}:{node.lineno}: define exit statuses in errors.TABLE")


def test_the_boundary_maps_outcomes_to_the_table():
    from slurm_tune.cli.common import guarded

    def raise_(exc):
        def func(argv):
            raise exc

        return func

    assert guarded("t", raise_(errors.StuneError("bad")), []) == errors.EXIT_ERROR
    assert guarded("t", raise_(KeyError("bug")), []) == errors.EXIT_INTERNAL
    assert guarded("t", raise_(KeyError("bug")), [], internal_exit=errors.EXIT_OK) == errors.EXIT_OK
    assert guarded("t", raise_(KeyboardInterrupt()), []) == errors.EXIT_INTERRUPTED
    proc = subprocess.run(
        [str(BIN / "stune-stage"), "no-such-command"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == errors.EXIT_USAGE
    proc = subprocess.run(
        [str(BIN / "stune-health"), "check", "--no-such-option"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == errors.EXIT_USAGE and "unknown option" in proc.stderr


# ---- one table helper, one JSON style ------------------------------------------------------------------------


def test_table_aligns_columns_and_leaves_no_trailing_blanks():
    text = table([("a", None, 3), ("long-name", "x", "")], ("NAME", "V", "N"))
    assert text == "NAME       V  N\na             3\nlong-name  x\n"
    assert table([]) == "" and table([], ("A", "B")) == "A  B\n"
    assert table([("a",), ("b", "c")]) == "a\nb  c\n"  # ragged rows keep their own cells


def test_the_hand_built_tables_are_gone():
    """The tables of doctor, the sweep report, the sbatch history and stune-stage ls are output.table's."""
    for path in (REPO / "slurm_tune").rglob("*.py"):
        if path.name == "output.py":
            continue
        text = path.read_text()
        assert ".ljust(" not in text and ".rjust(" not in text, (
            f"{path}: a hand-built table (use output.table)"
        )
    from slurm_tune.active import report
    from slurm_tune.sbatch import historyview as history

    assert (
        report.table([{"check": "nccl", "value": 1.5}, {"check": "fio", "value": None}], ("check", "value"))
        == "CHECK  VALUE\nnccl   1.5\nfio\n"
    )
    listing = history.format_list([{"time": 0, "job_id": "7", "partition": "hdr", "argv": ["a.sh"]}])
    assert listing.splitlines()[0] == "when                 job  partition  digest  command"
    assert listing.splitlines()[1].endswith("7    hdr        -       stune-sbatch a.sh")


def test_json_text_is_the_one_style():
    Row = namedtuple("Row", "b a")
    np = pytest.importorskip("numpy")
    doc = {
        "z": Row(1, {"y": 2}),
        "a": {3, 1},
        "n": np.float64(0.5),
        "i": np.int64(4),
        "d": decimal.Decimal("1.5"),
    }
    text = json_text(doc)
    assert text.endswith("}\n") and text.count("\n") > 1
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    assert json.loads(text) == {"a": [1, 3], "d": 1.5, "i": 4, "n": 0.5, "z": {"a": {"y": 2}, "b": 1}}
    assert list(json.loads(text)) == sorted(json.loads(text))
    with pytest.raises(TypeError):
        json_text({"x": object()})


def test_json_outputs_are_written_in_the_one_style(tmp_path):
    """A few read commands run for real: their stdout is exactly json_text of what it holds."""
    env = {"PATH": "/usr/bin:/bin", "STUNE_PARTITIONS": str(REPO / "partitions"), "HOME": str(tmp_path)}
    for argv in (
        ["stune-admin", "check-profiles", "--json"],
        [
            "stune-gpu-sampler",
            "status",
            "--local-dir",
            str(tmp_path),
            "--json",
            "--config",
            str(tmp_path / "none.yaml"),
        ],
        ["stune-sweep", "history", "-p", "hdr", "--store", str(tmp_path / "store"), "--json"],
    ):
        (tmp_path / "none.yaml").write_text("")
        proc = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, env=env, timeout=60
        )
        assert proc.returncode == errors.EXIT_OK, (argv, proc.stderr)
        assert proc.stdout == json_text(json.loads(proc.stdout)), argv
    doc = json.loads(
        subprocess.run(
            [str(BIN / "stune-admin"), "check-profiles", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).stdout
    )
    assert doc["profiles"]["hdr"]["fabric"] == "ib" and len(doc["profiles"]["hdr"]["hcas"]) == 8
