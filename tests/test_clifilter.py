"""The cli_filter's data and install, without a cluster: what it renders must be what stune-sbatch sets.

The filter's behaviour inside real sbatch/salloc/srun is tests/test_clifilter_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.cli.admin import main
from slurm_tune.clifilter import render

REPO = Path(__file__).resolve().parent.parent
BIN = os.path.dirname(sys.executable)
PARTITIONS = str(REPO / "partitions")


def dry_run_env(partition: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SBATCH_", "STUNE_MANAGED"))}
    out = subprocess.run(
        [os.path.join(BIN, "stune-sbatch"), "--dry-run", "--json", "-p", partition, "--wrap", "true"],
        capture_output=True,
        text=True,
        env=dict(env, STUNE_PARTITIONS=PARTITIONS),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["env"]


@pytest.mark.parametrize("partition", ["hdr", "roce", "vpc"])
def test_the_rendered_environment_is_stune_sbatchs(partition):
    """Every variable stune-sbatch --dry-run --json sets for a plain submission, with its value; STUNE_MANAGED
    is the TaskProlog's to write under the filter (an --export list cannot carry its commas)."""
    from slurm_tune.profilestore import load_profile

    entry = render.partition_entry(load_profile(partition, PARTITIONS))
    expected = dry_run_env(partition)
    expected.pop("STUNE_MANAGED")
    assert {item["name"]: item["value"] for item in entry["env"]} == expected
    node = {item["name"] for item in entry["env"] if item["node"]}
    assert node == {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"} & set(expected)
    assert all(" @ " in item["source"] for item in entry["env"]), "each variable names its profile key"


def test_the_options_are_stune_sbatchs_with_the_commands_that_take_them():
    from slurm_tune.profilestore import load_profile

    entry = render.partition_entry(load_profile("roce", PARTITIONS))
    by_option = {o["option"]: o for o in entry["options"]}
    assert by_option["--requeue"]["when"] == "always" and by_option["--requeue"]["commands"] == ["sbatch"]
    # the checkpoint signal only on request: bash exits on an untrapped USR1
    assert by_option["--signal"]["when"] == "opt-in" and by_option["--signal"]["value"] == "B:USR1@300"
    assert "--gpu-bind" not in by_option  # numa.bind: stune (site.yaml)


def test_slurm_binding_gives_gpu_bind_to_all_three_commands_and_srun_its_cpu_bind(tmp_path):
    from slurm_tune.profilestore import load_profile

    (tmp_path / "site.yaml").write_text((REPO / "partitions/site.yaml").read_text())
    (tmp_path / "vpc.yaml").write_text(
        (REPO / "partitions/vpc.yaml").read_text() + "numa:\n  bind: slurm\n  cpu_bind: sockets\n"
    )
    entry = render.partition_entry(load_profile("vpc", str(tmp_path)))
    gpu_bind = next(o for o in entry["options"] if o["option"] == "--gpu-bind")
    assert (gpu_bind["value"], gpu_bind["commands"], gpu_bind["when"]) == (
        "closest",
        ["sbatch", "salloc", "srun"],
        "always",
    )
    assert {"name": "SLURM_CPU_BIND", "value": "sockets"}.items() <= next(
        e for e in entry["env"] if e["name"] == "SLURM_CPU_BIND"
    ).items()


def test_lua_strings_escape_quotes_backslashes_and_control_bytes():
    assert render.lua_string('a"b\\c\nd\x01') == '"a\\"b\\\\c\\010d\\001"'
    assert render.lua_value({"k": [1, None, True, "x"]}) == '{["k"] = {1, nil, true, "x"}}'


def test_the_filter_never_starts_a_process():
    """It runs inside every sbatch, salloc and srun: no io.popen, os.execute or require of a C module."""
    source = render.lua_source()
    for forbidden in ("io.popen", "os.execute", "require", "loadstring", "dofile"):
        assert forbidden not in source, forbidden
    assert render.DATA_PLACEHOLDER in source
    for hook in ("slurm_cli_setup_defaults", "slurm_cli_pre_submit", "slurm_cli_post_submit"):
        assert re.search(rf"^function {hook}\(", source, re.M), f"Slurm requires {hook}"


def test_the_wheel_ships_the_lua_file():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["options.package_data"]["slurm_tune.clifilter"].split() == [render.LUA_FILE]
    assert (REPO / "slurm_tune/clifilter" / render.LUA_FILE).is_file()
    assert f"include slurm_tune/clifilter/{render.LUA_FILE}" in (REPO / "MANIFEST.in").read_text()


def run_admin(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_install_cli_filter_places_the_filter_beside_slurm_conf_and_prints_the_line(tmp_path, capsys):
    etc = tmp_path / "etc/slurm"
    etc.mkdir(parents=True)
    conf = etc / "slurm.conf"
    conf.write_text("ClusterName=c\nPartitionName=roce Nodes=n1 Default=YES\n")
    argv = (
        "install",
        "--prefix",
        str(tmp_path),
        "--slurm-conf",
        str(conf),
        "--role",
        "node",
        f"--set=STUNE_PARTITIONS={PARTITIONS}",
        "--cli-filter",
    )
    rc, out = run_admin(capsys, *argv)
    assert rc == 0, out
    lua = (etc / "cli_filter.lua").read_text()
    data_path = etc / "stune-cli-filter/data.lua"
    assert f'local DATA_PATH = "{data_path}"' in lua and render.DATA_PLACEHOLDER not in lua
    data = data_path.read_text()
    assert '["default_partition"] = "roce"' in data and '["NCCL_IB_TC"]' not in data
    assert '"NCCL_IB_TC", ["value"] = "106"' in data
    assert "\nCliFilterPlugins=cli_filter/lua" in out
    # idempotent; the line is not asked for once slurm.conf has it
    conf.write_text(conf.read_text() + "CliFilterPlugins=cli_filter/lua\n")
    rc, out = run_admin(capsys, *argv)
    assert rc == 0 and "nothing changed" in out and "CliFilterPlugins" not in out
    # uninstall keeps the filter while slurm.conf enables it: without its script every command refuses to run
    rc, out = run_admin(capsys, "uninstall", "--prefix", str(tmp_path), "--slurm-conf", str(conf))
    assert rc == 1 and f"{conf}:3 enables cli_filter/lua: take that line out first" in out
    assert (etc / "cli_filter.lua").exists() and len(out.strip().splitlines()) == 1
    conf.write_text(conf.read_text().replace("CliFilterPlugins=cli_filter/lua\n", ""))
    rc, out = run_admin(capsys, "uninstall", "--prefix", str(tmp_path), "--slurm-conf", str(conf))
    assert rc == 0, out
    assert not (etc / "cli_filter.lua").exists() and not data_path.exists()


def test_install_without_cli_filter_places_no_filter(tmp_path, capsys):
    rc, out = run_admin(
        capsys, "install", "--prefix", str(tmp_path), "--role", "node", f"--set=STUNE_PARTITIONS={PARTITIONS}"
    )
    assert rc == 0, out
    assert not (tmp_path / "etc/slurm/cli_filter.lua").exists() and "CliFilterPlugins" not in out


def test_an_invalid_profile_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "profiles"
    bad.mkdir()
    (bad / "x.yaml").write_text("partition: x\nfabric: {type: warp}\n")
    rc, out = run_admin(
        capsys,
        "install",
        "--prefix",
        str(tmp_path),
        "--role",
        "node",
        f"--set=STUNE_PARTITIONS={bad}",
        "--cli-filter",
    )
    assert rc != 0
    assert "x.yaml" in out and "fabric.type" in out and "Traceback" not in out
    assert not (tmp_path / "etc/slurm/cli_filter.lua").exists()


LUA_DRIVER = """
slurm = {SUCCESS = 0, ERROR = -1}
dofile(arg[1])
-- sbatch (the options Slurm gives sbatch have an export-file key), then srun starting a job (it has none)
for _, options in ipairs({{partition = "roce"}, {partition = "roce", ["export-file"] = "invalid-context"}}) do
  assert(slurm_cli_pre_submit(options, 0) == slurm.SUCCESS)
  print(tostring(options["export"]))
end
"""


@pytest.mark.parametrize("lua", ["lua5.1", "lua5.4"])
def test_the_filter_reads_its_data_on_lua_51_and_on_54(lua, tmp_path):
    """Debian's Slurm links Lua 5.1, RPM builds link 5.3/5.4 (no setfenv there): the data file is read in
    an empty environment either way, and a data path with a quote or a backslash stays one Lua string."""
    import shutil

    interpreter = shutil.which(lua)
    if interpreter is None:
        pytest.skip(f"{lua} is not installed (scripts/setup.sh installs it)")
    etc = tmp_path / 'etc "slurm" \\ x'
    etc.mkdir(parents=True)
    conf = etc / "slurm.conf"
    conf.write_text("PartitionName=roce Nodes=n1 Default=YES\n")
    for path, data in render.cli_filter_files(str(conf), PARTITIONS).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    (tmp_path / "driver.lua").write_text(LUA_DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "STUNE_", "SLURM_", "MASTER_"))}
    out = subprocess.run(
        [interpreter, str(tmp_path / "driver.lua"), str(etc / render.LUA_FILE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr
    sbatch, srun = out.stdout.splitlines()
    # sbatch's default --export stays ALL (a list would load the user's login environment): the TaskProlog
    # sets the environment; srun takes it as items
    assert sbatch == "nil", out.stdout
    assert srun.startswith("ALL,") and "NCCL_IB_TC=106" in srun, out.stdout  # the roce profile


def _site(tmp_path, conf_lines: str, data: bool = True) -> dict[str, str]:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "slurm.conf").write_text(conf_lines)
    if data:
        (etc / render.DATA_DIR).mkdir(exist_ok=True)
        (etc / render.DATA_DIR / render.DATA_FILE).write_text("return {format = 1, partitions = {}}\n")
    return {"SLURM_CONF": str(etc / "slurm.conf")}


@pytest.mark.parametrize(
    ("conf", "data", "enabled"),
    [
        ("ClusterName=c\nCliFilterPlugins=cli_filter/lua\n", True, True),
        ("clifilterplugins = cli_filter/syslog, cli_filter/lua  # both\n", True, True),
        ("CliFilterPlugins=cli_filter/lua\n", False, False),  # the filter's data is not on this host
        ("#CliFilterPlugins=cli_filter/lua\n", True, False),  # commented out: the plugin is off
        ("CliFilterPlugins=cli_filter/syslog\n", True, False),
        ("ClusterName=c\n", True, False),
    ],
)
def test_the_node_knows_whether_the_site_runs_the_filter(tmp_path, conf, data, enabled):
    assert render.enabled_here(_site(tmp_path, conf, data)) is enabled


def test_an_unreadable_slurm_conf_reads_as_not_enabled(tmp_path):
    env = _site(tmp_path, "CliFilterPlugins=cli_filter/lua\n")
    os.unlink(env["SLURM_CONF"])
    assert render.enabled_here(env) is False


def test_a_plain_sbatch_job_gets_stune_sbatchs_environment_from_the_taskprolog(tmp_path):
    """With the filter enabled, a job without STUNE_MANAGED gets on the node what stune-sbatch would have set
    at submission; a value the job has is kept; STUNE_MANAGED records what the node set."""
    from slurm_tune.nodeenv.managed import MANAGED_VAR, parse_managed
    from slurm_tune.nodeenv.taskenv import plain_job_exports, task_environment
    from slurm_tune.profiles import load_profile
    from slurm_tune.thisnode import job_context

    profile = load_profile("roce", PARTITIONS)
    site = _site(tmp_path, "CliFilterPlugins=cli_filter/lua\n")
    base = dict(
        site, SLURMD_NODENAME="n1", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1", STUNE_SYSFS_ROOT=str(tmp_path)
    )
    expected = render.plain_job_environment(profile)
    assert expected["NCCL_IB_TC"] == "106" and expected["NCCL_IB_TIMEOUT"] == "22"
    assert "NCCL_IB_HCA" not in expected, "the node decides it"

    got = plain_job_exports(job_context(dict(base, NCCL_IB_TIMEOUT="18"), profile=profile))
    assert got == {k: v for k, v in expected.items() if k != "NCCL_IB_TIMEOUT"}, "the job's own value is kept"
    exports, _ = task_environment(job_context(dict(base), profile=profile))
    assert {k: exports[k] for k in expected} == expected
    assert {k: v for k, v in parse_managed(exports[MANAGED_VAR]).items() if k in expected} == expected

    # a stune-sbatch job (STUNE_MANAGED), or a site without the filter: nothing from here
    assert (
        plain_job_exports(job_context(dict(base, **{MANAGED_VAR: "NCCL_IB_TC=106"}), profile=profile)) == {}
    )
    (tmp_path / "off").mkdir()
    off = dict(base, **_site(tmp_path / "off", "ClusterName=c\n"))
    assert plain_job_exports(job_context(off, profile=profile)) == {}


def test_the_filter_line_may_come_from_an_included_file(tmp_path):
    env = _site(tmp_path, "ClusterName=c\nInclude extra/*.conf\n")
    extra = tmp_path / "etc" / "extra"
    extra.mkdir()
    (extra / "a.conf").write_text("PartitionName=p Nodes=n1\n")
    assert render.enabled_here(env) is False
    (extra / "b.conf").write_text("CliFilterPlugins=cli_filter/lua\n")
    assert render.enabled_here(env) is True
    (extra / "a.conf").write_text("Include extra/a.conf\n")  # a loop ends at the file limit
    (extra / "b.conf").write_text("")
    assert render.enabled_here(env) is False
