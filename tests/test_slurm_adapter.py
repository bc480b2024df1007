"""The Slurm adapter's own mechanics: process handling, timeouts, errors and parsing.

Parsing is checked against stand-in commands that print what Slurm 22.05 prints; everything that talks to
a live controller is in test_cluster.py."""

from __future__ import annotations

import os
import re
import stat
import time

import pytest

from slurm_tune.errors import SlurmError, SlurmFormatError
from slurm_tune.slurm import Slurm
from slurm_tune.slurm.scontrol import parse_config, parse_records
from slurm_tune.slurm.spawn import spawn_capture


def fake_tool(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_spawn_capture_feeds_stdin_and_separates_streams():
    rc, out, err = spawn_capture(
        ["/bin/sh", "-c", "tr a-z A-Z; echo oops >&2; exit 3"], "hello\n" * 20000, dict(os.environ), 10
    )
    assert rc == 3
    assert out == "HELLO\n" * 20000  # bigger than a pipe buffer: written while read
    assert err == "oops\n"


def test_spawn_capture_kills_a_hung_command_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        spawn_capture(["/bin/sh", "-c", "sleep 30"], None, dict(os.environ), 0.5)
    assert time.monotonic() - start < 5


def test_a_failure_carries_command_exit_code_and_slurms_message(tmp_path):
    fake_tool(tmp_path, "scontrol", 'echo "scontrol: error: Invalid node name specified" >&2; exit 1\n')
    slurm = Slurm(bin_dir=str(tmp_path))
    with pytest.raises(SlurmError) as info:
        slurm.drain("n9", "stune: test")
    err = info.value
    assert err.command == ["scontrol", "update", "NodeName=n9", "State=DRAIN", "Reason=stune: test"]
    assert err.returncode == 1
    assert err.message == "scontrol: error: Invalid node name specified"
    assert str(err) == "scontrol failed (exit 1): scontrol: error: Invalid node name specified"


def test_a_timeout_is_a_slurm_error_without_exit_code(tmp_path):
    fake_tool(tmp_path, "squeue", "sleep 30\n")
    slurm = Slurm(bin_dir=str(tmp_path), timeout=0.3)
    with pytest.raises(SlurmError, match=r"timed out: no answer within 0\.3s") as info:
        slurm.jobs()
    assert info.value.returncode is None


def test_a_missing_binary_is_a_slurm_error(tmp_path):
    with pytest.raises(SlurmError, match="cannot run sinfo"):
        Slurm(bin_dir=str(tmp_path)).nodes()


def test_sacct_asks_free_text_last_and_keeps_pipes_inside_it(tmp_path):
    fake_tool(
        tmp_path,
        "sacct",
        'echo "$@" > "$(dirname "$0")/args"\n'
        'echo "17|COMPLETED|1700000000|stune:v1|a|b"\n'
        'echo "18|FAILED|1700000100|"\n',
    )
    rows = Slurm(bin_dir=str(tmp_path)).sacct(["JobID", "AdminComment", "State", "End"], start=1690000000)
    args = (tmp_path / "args").read_text().split()
    assert "--format=JobID,State,End,AdminComment" in args
    assert "-P" in args and "--starttime=1690000000" in args
    assert rows == [
        {"JobID": "17", "State": "COMPLETED", "End": "1700000000", "AdminComment": "stune:v1|a|b"},
        {"JobID": "18", "State": "FAILED", "End": "1700000100", "AdminComment": ""},
    ]


def test_sacct_refuses_two_free_text_fields():
    with pytest.raises(ValueError):
        Slurm().sacct(["JobName", "AdminComment"])


def test_time_format_is_epoch_seconds(tmp_path):
    fake_tool(
        tmp_path,
        "sinfo",
        '[ "$1" = --version ] && { echo "slurm-wlm 22.05.8"; exit 0; }\n'
        'echo "{\\"nodes\\": [], \\"errors\\": [], \\"fmt\\": \\"$SLURM_TIME_FORMAT\\"}"\n',
    )
    slurm = Slurm(bin_dir=str(tmp_path), conf="/x/slurm.conf")
    assert slurm.nodes() == []
    assert slurm.env()["SLURM_TIME_FORMAT"] == "%s"
    assert slurm.env()["SLURM_CONF"] == "/x/slurm.conf"


def test_json_errors_from_slurm_are_raised(tmp_path):
    fake_tool(
        tmp_path,
        "squeue",
        'echo \'{"jobs": [], "errors": [{"error": "Unable to contact slurm controller", "errno": 1}]}\'\n',
    )
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        Slurm(bin_dir=str(tmp_path)).jobs()


def test_garbled_json_is_a_slurm_error_not_a_traceback(tmp_path):
    fake_tool(
        tmp_path,
        "sinfo",
        '[ "$1" = --version ] && { echo "slurm-wlm 22.05.8"; exit 0; }\necho \'{"nodes": [ \'\n',
    )
    with pytest.raises(
        SlurmError,
        match=r"^output of `sinfo --json` from Slurm 22.05.8 is not in a format stune "
        r"knows: unreadable JSON: Expecting value",
    ):
        Slurm(bin_dir=str(tmp_path)).nodes()


def test_parse_records_keeps_spaces_inside_values():
    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN Reason=stune: mlx5_2/1 state DOWN "
        "[root@2026-11-29T19:00:00] Comment=(null)\n"
    )
    rec = parse_records(text)[0]
    assert rec["Reason"] == "stune: mlx5_2/1 state DOWN [root@2026-11-29T19:00:00]"
    assert rec["State"] == "IDLE+DRAIN" and rec["Comment"] == "(null)"


def test_sprio_and_sshare_rows_are_typed(tmp_path):
    fake_tool(
        tmp_path, "sprio", 'echo "          12|stune-bob|   11234|    1234|     0|  10000|1.0000000|hdr"\n'
    )
    fake_tool(
        tmp_path,
        "sshare",
        'echo "physics||1|0.333333|3600|0.25|0.25||0.5"\n'
        'echo " physics|stune-alice|1|1.000000|3600|0.25|1.000000|0.5|1.0"\n',
    )
    slurm = Slurm(bin_dir=str(tmp_path))
    prio = slurm.sprio()[0]
    assert (prio.job_id, prio.user, prio.priority, prio.site, prio.fairshare_norm) == (
        12,
        "stune-bob",
        11234,
        1234,
        1.0,
    )
    rows = slurm.sshare()
    assert rows[0].account == "physics" and rows[0].user == "" and rows[0].fairshare is None
    assert rows[1].user == "stune-alice" and rows[1].fairshare == 0.5 and rows[1].raw_usage == 3600.0


def test_pending_jobs_are_read_from_one_plain_squeue_listing(tmp_path):
    """The accountant's pending jobs: (id, account, user) per line of `squeue -o %A|%a|%u`, not --json."""
    fake_tool(
        tmp_path,
        "squeue",
        '[ "$*" = "-h -t PENDING -o %A|%a|%u" ] || exit 3\n'
        'echo "12|physics|stune-bob"\necho "  13|biology|stune-alice"\necho ""\n',
    )
    assert Slurm(bin_dir=str(tmp_path)).pending_jobs() == [
        (12, "physics", "stune-bob"),
        (13, "biology", "stune-alice"),
    ]


SSHARE_ARGV = (
    "sshare -P -n -a -l --format=Account,User,RawShares,NormShares,RawUsage,NormUsage,EffectvUsage,"
    "FairShare,LevelFS"
)


@pytest.mark.parametrize(
    "command, lines, read, argv, problem",
    [
        # a release that adds a column (or drops one): every row has another width
        (
            "sshare",
            ["physics||1|0.333333|3600|0.25|0.25||0.5|extra"],
            "sshare",
            SSHARE_ARGV,
            r"line 1 has 10 columns, expected 9: 'physics\|\|1",
        ),
        # one row of the right width among rows of another: the layout is not known, not a row less
        (
            "sshare",
            ["physics||1|0.333333|3600|0.25|0.25||0.5", "physics|stune-alice|1|1.0"],
            "sshare",
            SSHARE_ARGV,
            r"line 2 has 4 columns, expected 9",
        ),
        (
            "sshare",
            ["physics|stune-alice|1|1.000000|3600|0.25|1.000000|high|1.0"],
            "sshare",
            SSHARE_ARGV,
            r"line 1: 'high' is not a number",
        ),
        (
            "sshare",
            ["|stune-alice|1|1.000000|3600|0.25|1.000000|0.5|1.0"],
            "sshare",
            SSHARE_ARGV,
            r"line 1 has no account",
        ),
        (
            "sprio",
            ["JOBID|USER|PRIORITY|SITE|AGE|FAIRSHARE|FAIRSHARE_NORM|PARTITION"],
            "sprio",
            r"sprio -h -o %i|%u|%Y|%S|%A|%F|%f|%r",
            r"line 1: job id 'JOBID' is not a number",
        ),
        (
            "sprio",
            ["12|stune-bob|11234|1234|0|10000|1.0|hdr|normal"],
            "sprio",
            r"sprio -h -o %i|%u|%Y|%S|%A|%F|%f|%r",
            r"line 1 has 9 columns, expected 8",
        ),
        (
            "sprio",
            ["12|stune-bob|11234|1234|0|10000|1.0|hdr", "13|stune-bob|high|1234|0|10000|1.0|hdr"],
            "sprio",
            r"sprio -h -o %i|%u|%Y|%S|%A|%F|%f|%r",
            r"line 2: invalid literal for int\(\) with base 10: 'high'",
        ),
        (
            "squeue",
            ["12_[1-3]|physics|stune-bob"],
            "pending",
            "squeue -h -t PENDING -o %A|%a|%u",
            r"line 1: job id '12_\[1-3\]' is not a number",
        ),
        (
            "squeue",
            ["12|physics"],
            "pending",
            "squeue -h -t PENDING -o %A|%a|%u",
            r"line 1 has 2 columns, expected 3",
        ),
        (
            "sacctmgr",
            ["normal|1.000000", "gold"],
            "qos",
            "sacctmgr -n -P show qos format=Name,UsageFactor",
            r"line 2 has 1 columns, expected 2: 'gold'",
        ),
        (
            "sacctmgr",
            ["normal|1.000000", "gold|double"],
            "qos",
            "sacctmgr -n -P show qos format=Name,UsageFactor",
            r"line 2: 'double' is not a number",
        ),
        (
            "sacct",
            ["1|COMPLETED", "2"],
            "sacct",
            "sacct -P --noconvert -n --allusers --format=JobID,State -X",
            r"line 2 has 1 fields, expected 2: '2'",
        ),
        (
            "sbatch",
            ["Submitted batch job 12"],
            "submit",
            "sbatch --parsable --wrap=true",
            r"no job id in 'Submitted batch job 12'",
        ),
    ],
)
def test_an_unknown_layout_is_a_format_error_naming_the_whole_command_and_release(
    tmp_path, command, lines, read, argv, problem
):
    """A changed layout fails the read: never fewer rows, a QOS at the default factor or a traceback."""
    fake_tool(tmp_path, "sinfo", 'echo "slurm 26.05.5"\n')
    fake_tool(tmp_path, command, "".join(f"echo '{line}'\n" for line in lines))
    slurm = Slurm(bin_dir=str(tmp_path))
    call = {
        "sshare": slurm.sshare,
        "sprio": slurm.sprio,
        "qos": slurm.qos_usage_factors,
        "pending": slurm.pending_jobs,
        "sacct": lambda: slurm.sacct(["JobID", "State"]),
        "submit": lambda: slurm.submit(["--wrap=true"]),
    }[read]
    with pytest.raises(SlurmFormatError) as info:
        call()
    text = str(info.value)
    assert text.startswith(f"output of `{argv}` from Slurm 26.05.5 is not in a format stune knows: "), text
    assert re.search(problem, text), text
    assert "failed (exit" not in text and "\n" not in text


def test_what_slurm_leaves_empty_is_none_and_a_parent_share_is_no_error(tmp_path):
    fake_tool(tmp_path, "sshare", 'echo "physics||parent|0.333333|3600|0.25|0.25||inf"\necho ""\n')
    fake_tool(tmp_path, "sacctmgr", 'echo "normal|1.000000"\necho "free|"\n')
    slurm = Slurm(bin_dir=str(tmp_path))
    row = slurm.sshare()[0]
    assert (row.raw_shares, row.fairshare, row.level_fs) == (None, None, float("inf"))
    assert slurm.qos_usage_factors() == {"normal": 1.0}


def test_a_release_newer_than_the_newest_tested_is_said_once_on_stderr(tmp_path, capfd):
    from slurm_tune.slurm import reader, version

    for release, newer in (("26.05.9", False), ("26.11.0", True), ("27.05.1", True)):
        bin_dir = tmp_path / release
        bin_dir.mkdir()
        fake_tool(bin_dir, "sinfo", f'echo "slurm {release}"\n')
        for _ in range(2):  # two handles, one process
            assert Slurm(bin_dir=str(bin_dir)).version().release == release
        err = capfd.readouterr().err
        if newer:
            assert err == (
                f"stune: Slurm {release} is newer than 26.05, the newest release stune is tested on; "
                "an output stune does not know is reported as an error naming the command\n"
            )
        else:
            assert err == ""
    # once per process, even when the release is read afresh (another PATH, a cleared cache)
    reader._VERSIONS.clear()
    assert Slurm(bin_dir=str(tmp_path / "26.11.0")).version().release == "26.11.0"
    assert capfd.readouterr().err == ""
    assert version.NEWEST_TESTED == (26, 5)


def test_every_call_is_recorded_for_rpc_counting(tmp_path):
    fake_tool(tmp_path, "scontrol", "exit 0\n")
    slurm = Slurm(bin_dir=str(tmp_path))
    slurm.resume(["n1", "n2"])
    slurm.set_site_factor(5, 100)
    assert slurm.calls == [
        ["scontrol", "update", "NodeName=n1,n2", "State=RESUME"],
        ["scontrol", "update", "JobId=5", "SiteFactor=100"],
    ]


def test_parse_config_reads_key_value_lines_under_the_header():
    conf = parse_config(
        "Configuration data as of 2026-11-30T12:00:00\nAccountingStorageType   = accounting_storage/slurmdbd\n"
        "PriorityDecayHalfLife   = 7-00:00:00\nPriorityWeightFairshare = 10000\nCgroup Support Configuration:\n"
    )
    assert conf == {
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "PriorityDecayHalfLife": "7-00:00:00",
        "PriorityWeightFairshare": "10000",
    }


def test_the_job_log_finds_the_jobs_stderr_through_the_adapter(tmp_path):
    from slurm_tune.stage.jobenv import JobLog
    from slurm_tune.thisnode import host_name

    log_file = tmp_path / f"slurm-{host_name()}.err"
    log_file.write_text("")
    fake_tool(
        tmp_path,
        "scontrol",
        '[ "$4" = 42 ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; '
        "exit 1; }\n"
        f'echo "JobId=42 JobName=x StdErr={tmp_path}/slurm-%N.err StdOut=/dev/null"\n',
    )
    slurm = Slurm(bin_dir=str(tmp_path))
    # slurmd expands %N to its short host name, not the NodeName (src/slurmd/common/fname.c: conf->hostname),
    # so a NodeName that differs (several slurmd on one host, NodeHostname=) must not name the file
    log = JobLog({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "not-this-host"}, slurm=slurm)
    log.write("stune: staged\n")
    log.close()
    assert slurm.calls == [["scontrol", "show", "job", "-o", "42"]]  # Slurm.job_record, one call
    assert log_file.read_text() == "stune: staged\n"
    unknown = JobLog({"SLURM_JOB_ID": "43"}, slurm=slurm)
    assert unknown.path() is None and unknown.write("dropped") == len("dropped")


def test_the_job_log_needs_only_the_adapters_job_record():
    from slurm_tune.stage.jobenv import JobLog

    class OnlyJobRecord:  # no run(): the JobLog must not build Slurm commands itself
        def job_record(self, job_id):
            return {"StdErr": "", "StdOut": f"/scratch/job-{job_id}.out"} if job_id == "7" else {}

    assert JobLog({"SLURM_JOB_ID": "7"}, slurm=OnlyJobRecord()).path() == "/scratch/job-7.out"
    assert JobLog({"SLURM_JOB_ID": "8"}, slurm=OnlyJobRecord()).path() is None
    from slurm_tune.stage.spec import LOG_VAR

    assert JobLog({"SLURM_JOB_ID": "7", LOG_VAR: "/x/log"}, slurm=OnlyJobRecord()).path() == "/x/log"
    assert LOG_VAR == "STUNE_STAGE_LOG"  # the name users and docs/stage.md know


@pytest.mark.parametrize(
    "tres, key, value, count",
    [
        ("billing=2,cpu=2,gres/gpu=4,node=2", "gres/gpu", "4", 4.0),
        (
            "cpu=2,gres/gpu:a100=4,gres/gpu=4",
            "gres/gpu",
            "4",
            4.0,
        ),  # the typed entry counts the same GPUs again
        ("cpu=2,mem=10G", "gres/gpu", None, 0.0),
        ("", "cpu", None, 0.0),
        ("gres/gpu=1K", "gres/gpu", "1K", 1.0),
        ("gres/gpu=x", "gres/gpu", "x", 0.0),
    ],
)
def test_tres_value_and_count(tres, key, value, count):
    from slurm_tune.slurm.tres import tres_count, tres_value

    assert tres_value(tres, key) == value and tres_count(tres, key) == count


def test_importing_the_adapter_loads_no_records_or_collections():
    """The adapter reads no records when imported: the namedtuples (collections), associations and version
    load on first use, and the commands alone (a submission's) load neither the queries nor their parsers.
    The public names still import from the package."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"import sys; sys.path.insert(0, {root!r})\nfrom slurm_tune.slurm import SlurmCommands\n"
        "def loaded(): return ' '.join(sorted(m for m in sys.modules if m.startswith('slurm_tune.slurm.') "
        "or m == 'collections'))\n"
        "print(loaded())\nfrom slurm_tune.slurm import Slurm\nprint(loaded())\n"
        "from slurm_tune.slurm.adapter import queries_on\n"
        "assert isinstance(queries_on(SlurmCommands()), Slurm)\n"
        "from slurm_tune.slurm import Association, Job, Node, SlurmVersion, INFINITE\n"
        "print(Node.__module__, Association.__module__, SlurmVersion.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    commands, first, second = out.splitlines()
    assert commands.split() == ["slurm_tune.slurm.commands", "slurm_tune.slurm.spawn"]
    assert first.split() == [
        "slurm_tune.slurm.accounting",
        "slurm_tune.slurm.adapter",
        "slurm_tune.slurm.commands",
        "slurm_tune.slurm.reader",
        "slurm_tune.slurm.sacctargs",
        "slurm_tune.slurm.scontrol",
        "slurm_tune.slurm.spawn",
    ]
    assert second.split() == [
        "slurm_tune.slurm.records",
        "slurm_tune.slurm.associations",
        "slurm_tune.slurm.version",
    ]


def test_maintenance_reservations_go_through_the_adapter(tmp_path):
    fake_tool(
        tmp_path,
        "scontrol",
        'echo "$@" >> "$(dirname "$0")/args"\n'
        'if [ "$2" = reservation ] && [ "$3" = maint-1 ]; then\n'
        '  echo "ReservationName=maint-1 StartTime=1796046112 Nodes=n[1-2] NodeCnt=2 '
        'Users=root Flags=MAINT,IGNORE_JOBS"; fi\n',
    )
    slurm = Slurm(bin_dir=str(tmp_path))
    slurm.create_reservation("maint-1", ["n1", "n2"], minutes=15, users="root")
    assert slurm.reservation("maint-1")["Nodes"] == "n[1-2]"
    assert slurm.reservation("other") == {}
    slurm.delete_reservation("maint-1")
    assert (tmp_path / "args").read_text().splitlines() == [
        "create reservation ReservationName=maint-1 Nodes=n1,n2 StartTime=now Duration=15 Users=root "
        "Flags=maint,ignore_jobs",
        "show reservation maint-1 -o",
        "show reservation other -o",
        "delete ReservationName=maint-1",
    ]
    fake_tool(tmp_path, "scontrol", 'echo "Reservation maint-1 not found" >&2; exit 1\n')
    slurm.delete_reservation("maint-1")  # already gone: no error
