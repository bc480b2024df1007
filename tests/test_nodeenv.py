"""Node-side detection against sysfs fixture trees: ACTIVE fabric ports, the RoCE v2 GID index, the socket
interface; and what stune-task-prolog / stune-env print from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hwtrees
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw.sysfs import Sysfs
from slurm_tune.nodeenv.detect import Port, active_ports, ifname_matches, roce_v2_gid_index, socket_interfaces
from slurm_tune.nodeenv.managed import format_managed, parse_managed
from slurm_tune.nodeenv.taskenv import as_shell, as_taskprolog, node_exports, with_managed
from slurm_tune.profiles import load_profile
from slurm_tune.thisnode import job_context

BIN = os.path.dirname(sys.executable)
REPO = Path(__file__).resolve().parent.parent


def job(environ, profile=None):
    """The job context an entry point builds (tests pass the profile they loaded)."""
    return job_context(environ, profile=profile)


LL = hwtrees.link_local_gid(0x0A5C2FFFFE3B0000)
V4 = hwtrees.ipv4_mapped_gid("10.0.0.5")


def roce_tree(root: Path, table, **overrides) -> Sysfs:
    """An h100_roce node whose every HCA has `table` (a function of its netdev) as its GID table."""
    hca_overrides = {
        f"mlx5_{i}": dict(gids=table(f"eth{i + 1}"), **overrides.get(f"mlx5_{i}", {})) for i in range(8)
    }
    hwtrees.h100_roce(root, hca_overrides=hca_overrides)
    return Sysfs(str(root))


def issue_table(dev):
    """The issue's case: 1 is RoCE v1, 2 is RoCE v2 on fe80::, 3 is RoCE v2 on ::ffff:10.0.0.5 bound to the
    fabric netdev."""
    return [(LL, "IB/RoCE v1", dev), (V4, "IB/RoCE v1", dev), (LL, "RoCE v2", dev), (V4, "RoCE v2", dev)]


def test_the_issue_gid_table_picks_index_3(tmp_path):
    sysfs = roce_tree(tmp_path, issue_table)
    assert roce_v2_gid_index(sysfs, Port("mlx5_0", 1, "eth1")) == (3, "")


def test_a_roce_v2_gid_on_another_netdev_is_not_taken(tmp_path):
    # index 1: RoCE v2 and IPv4-mapped, but bound to a VLAN device, not the fabric netdev
    sysfs = roce_tree(
        tmp_path,
        lambda dev: [
            (LL, "IB/RoCE v1", dev),
            (hwtrees.ipv4_mapped_gid("192.168.7.5"), "RoCE v2", f"{dev}.100"),
            (V4, "RoCE v2", dev),
        ],
    )
    assert roce_v2_gid_index(sysfs, Port("mlx5_0", 1, "eth1")) == (2, "")


def test_no_roce_v2_ipv4_gid_says_why_instead_of_guessing(tmp_path):
    sysfs = roce_tree(
        tmp_path, lambda dev: [(LL, "IB/RoCE v1", dev), (LL, "RoCE v2", dev), (V4, "IB/RoCE v1", dev)]
    )
    index, why = roce_v2_gid_index(sysfs, Port("mlx5_0", 1, "eth1"))
    assert (
        index is None
        and "no RoCE v2 IPv4-mapped GID on eth1" in why
        and "0 (RoCE v2, not IPv4-mapped)" not in why
    )
    assert "1 (RoCE v2, not IPv4-mapped)" in why


def test_only_active_ports_and_never_the_storage_hca(tmp_path):
    hwtrees.dgx_a100_ib(tmp_path, hca_overrides={"mlx5_2": {"state": "1: DOWN", "phys_state": "3: Disabled"}})
    sysfs = Sysfs(str(tmp_path))
    profile = load_profile("hdr")
    ports = [Port(h.device, h.port, h.netdev) for h in profile.fabric.hcas] + [Port("mlx5_99", 1, None)]
    active, others = active_ports(sysfs, ports)
    assert [str(p) for p in active] == [f"mlx5_{i}:1" for i in (0, 1, 3, 4, 5, 6, 7)]
    assert others == {"mlx5_2:1": "DOWN", "mlx5_99:1": "missing"}
    exports, messages = node_exports(job({"SLURMD_NODENAME": "n7"}, profile), sysfs)
    assert exports["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
    assert "mlx5_8" not in exports["NCCL_IB_HCA"]
    assert messages == ["NCCL_IB_HCA narrowed to the ACTIVE ports; left out mlx5_2:1 DOWN"]


def test_no_active_port_unsets_the_hca_list_stune_set_and_says_so(tmp_path):
    down = {f"mlx5_{i}": {"state": "1: DOWN"} for i in range(9)}
    hwtrees.dgx_a100_ib(tmp_path, hca_overrides=down)
    sysfs = Sysfs(str(tmp_path))
    exports, messages = node_exports(job({"SLURMD_NODENAME": "n1"}, load_profile("hdr")), sysfs)
    assert "NCCL_IB_HCA" not in exports  # nothing to unset: stune had not set it
    assert messages[0].startswith("NCCL_IB_HCA unset: none of the fabric HCA ports is ACTIVE (mlx5_0:1 DOWN")
    stunes = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "STUNE_MANAGED": "NCCL_IB_HCA==mlx5_0:1%2Cmlx5_1:1"}
    exports, messages = node_exports(job(stunes, load_profile("hdr")), sysfs)
    assert exports["NCCL_IB_HCA"] is None
    assert messages[0].startswith("NCCL_IB_HCA unset: none of the fabric HCA ports is ACTIVE")
    assert "unset NCCL_IB_HCA\n" in as_taskprolog(with_managed(exports, stunes))
    yours = {"NCCL_IB_HCA": "=mlx5_8:1", "STUNE_MANAGED": "NCCL_IB_HCA==mlx5_0:1%2Cmlx5_1:1"}
    exports, messages = node_exports(job(yours, load_profile("hdr")), sysfs)
    assert "NCCL_IB_HCA" not in exports and messages[0].endswith("NCCL_IB_HCA is yours: left as you set it")


def test_a_missing_socket_interface_unsets_stunes_value(tmp_path):
    hwtrees.h100_roce(tmp_path)
    sysfs = Sysfs(str(tmp_path))
    d = tmp_path / "p"
    d.mkdir()
    (d / "t.yaml").write_text("partition: t\nfabric: {type: tcp, socket_ifname: bond0}\n")
    env = {
        "NCCL_SOCKET_IFNAME": "bond0",
        "GLOO_SOCKET_IFNAME": "bond0",
        "STUNE_MANAGED": "NCCL_SOCKET_IFNAME=bond0,GLOO_SOCKET_IFNAME=bond0",
    }
    exports, messages = node_exports(job(env, load_profile("t", d)), sysfs)
    assert exports["NCCL_SOCKET_IFNAME"] is None and exports["GLOO_SOCKET_IFNAME"] is None
    assert messages == [
        "NCCL_SOCKET_IFNAME unset: socket interface bond0 does not exist on this node "
        "(up: eth0, eth1, eth2, eth3, eth4, eth5, eth6, eth7, eth8): NCCL picks an interface "
        "itself"
    ]
    shell = as_shell(with_managed(exports, env))
    assert "unset NCCL_SOCKET_IFNAME\nunset GLOO_SOCKET_IFNAME\n" in shell
    assert "STUNE_MANAGED='=,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME'" in shell


def test_roce_node_exports_hcas_gid_index_and_socket_interface(tmp_path):
    sysfs = roce_tree(tmp_path, issue_table)
    exports, messages = node_exports(job({"SLURMD_NODENAME": "n1"}, load_profile("roce")), sysfs)
    assert exports == {
        "NCCL_IB_HCA": "=" + ",".join(f"mlx5_{i}:1" for i in range(8)),
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
    }
    assert messages == []


def test_ports_that_disagree_on_the_gid_index_are_named(tmp_path):
    tables = lambda dev: (
        issue_table(dev) if dev != "eth4" else [(LL, "IB/RoCE v1", dev), (V4, "RoCE v2", dev)]
    )
    sysfs = roce_tree(tmp_path, tables)
    exports, messages = node_exports(job({"SLURMD_NODENAME": "n1"}, load_profile("roce")), sysfs)
    assert exports["NCCL_IB_GID_INDEX"] == "3"
    assert len(messages) == 1 and "disagree" in messages[0] and "mlx5_3:1 use 1" in messages[0]


def test_user_values_are_left_alone_and_stunes_own_are_refined(tmp_path):
    sysfs = roce_tree(tmp_path, issue_table, mlx5_5={"state": "1: DOWN"})
    profile = load_profile("roce")
    mine = {
        "NCCL_IB_HCA": "=mlx5_0:1",
        "NCCL_IB_GID_INDEX": "7",
        "NCCL_SOCKET_IFNAME": "eth9",
        "GLOO_SOCKET_IFNAME": "eth9",
    }
    assert node_exports(job(mine, profile), sysfs)[0] == {}
    # stune set these values (recorded in STUNE_MANAGED), and they are unchanged: refined on this node
    stunes = {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_5:1",
        "NCCL_IB_GID_INDEX": "7",
        "NCCL_SOCKET_IFNAME": "eth9",
        "STUNE_MANAGED": "NCCL_IB_HCA==mlx5_0:1%2Cmlx5_5:1,NCCL_IB_GID_INDEX=7,NCCL_SOCKET_IFNAME=eth0",
    }
    exports, _ = node_exports(job(stunes, profile), sysfs)
    assert exports["NCCL_IB_GID_INDEX"] == "3" and "mlx5_5" not in exports["NCCL_IB_HCA"]
    assert "NCCL_SOCKET_IFNAME" not in exports  # eth9 is not the eth0 stune set: the script changed it
    assert exports["GLOO_SOCKET_IFNAME"] == "eth0"  # absent: stune's to set
    # a name without a value (stune detects it) is stune's only while absent
    assert (
        node_exports(job({"NCCL_IB_GID_INDEX": "5", "STUNE_MANAGED": "=,NCCL_IB_GID_INDEX"}, profile), sysfs)[
            0
        ].get("NCCL_IB_GID_INDEX")
        is None
    )
    out = with_managed({"NCCL_IB_HCA": "=x,y"}, {"STUNE_MANAGED": "A,B=1"})["STUNE_MANAGED"]
    assert out == "A,B=1,NCCL_IB_HCA==x%2Cy"


@pytest.mark.parametrize("value", ["", "a,b", "100%", "%2C", "x=y,z", "=mlx5_0:1,mlx5_1:1"])
def test_managed_values_round_trip(value):
    from slurm_tune.nodeenv.managed import format_managed, parse_managed

    managed = {"A": value, "B": None, "C": "plain"}
    assert parse_managed(format_managed(managed)) == managed


def test_the_old_form_of_stune_managed_keeps_the_node_side_refinement(tmp_path):
    """Issue 22 §3: a job an older stune-sbatch submitted (bare names: every one a variable stune set) still
    gets its HCAs narrowed and its GID index detected after an upgrade, and the new form is written back."""
    sysfs = roce_tree(tmp_path, issue_table, mlx5_5={"state": "1: DOWN"})
    old = {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_5:1",
        "NCCL_IB_GID_INDEX": "7",
        "NCCL_SOCKET_IFNAME": "eth0",
        "STUNE_MANAGED": "NCCL_IB_HCA,NCCL_IB_GID_INDEX,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,MASTER_ADDR",
    }
    exports, _ = node_exports(job(old, load_profile("roce")), sysfs)
    assert "mlx5_5" not in exports["NCCL_IB_HCA"] and exports["NCCL_IB_GID_INDEX"] == "3"
    written = parse_managed(with_managed(exports, old)["STUNE_MANAGED"])
    assert written["NCCL_IB_HCA"] == exports["NCCL_IB_HCA"] and written["MASTER_ADDR"] is None
    assert "=" in format_managed({"MASTER_ADDR": None})  # the new form never reads as the old one
    assert parse_managed(format_managed({"MASTER_ADDR": None, "X": None}), {"X": "1"}) == {
        "MASTER_ADDR": None,
        "X": None,
    }


def test_rendezvous_is_one_value_on_every_rank_of_a_step_that_did_not_inherit_it():
    """Issue 22 §3: under --export=NONE a step's tasks do not inherit the batch step's MASTER_ADDR; every rank
    (the first node's too) then takes the first node's name, never rank 0 an address and rank 1 a name."""
    from slurm_tune.nodeenv.taskenv import rendezvous

    env = {
        "SLURM_JOB_ID": "8123",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_STEP_ID": "0",
    }
    values = {
        rendezvous(job(dict(env, SLURMD_NODENAME=node)), ["eth0"], lambda i, node=node: f"10.1.2.{node[-1]}")[
            "MASTER_ADDR"
        ]
        for node in ("gpu07", "gpu08")
    }
    assert values == {"gpu07"}
    batch = dict(env, SLURM_STEP_ID="4294967294")
    assert rendezvous(job(batch), ["eth0"], lambda i: "10.1.2.7")["MASTER_ADDR"] == "10.1.2.7"


def test_rendezvous_once_per_job_on_the_first_node():
    from slurm_tune.nodeenv.taskenv import rendezvous

    env = {"SLURM_JOB_ID": "8123", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURMD_NODENAME": "gpu07"}
    assert rendezvous(job(env), ["eth0"], lambda ifname: "10.1.2.7") == {
        "MASTER_ADDR": "10.1.2.7",
        "MASTER_PORT": str(12000 + 8123 % 8000),
    }
    assert (
        rendezvous(job(env), ["eth0"], lambda ifname: None)["MASTER_ADDR"] == "gpu07"
    )  # no address: the name
    other = dict(env, SLURMD_NODENAME="gpu08")
    assert rendezvous(job(other), ["eth0"], lambda ifname: "10.1.2.8")["MASTER_ADDR"] == "gpu07"
    assert rendezvous(job(dict(env, MASTER_ADDR="x", MASTER_PORT="1")), ["eth0"], lambda i: "y") == {}


def test_a_fixed_gid_index_that_is_not_roce_v2_is_reported(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "r.yaml").write_text(
        "partition: r\nfabric:\n  type: roce\n  gid_index: 1\n  hcas:\n"
        "    - {device: mlx5_0, port: 1, netdev: eth1}\n"
    )
    sysfs = roce_tree(tmp_path / "node", issue_table)
    exports, messages = node_exports(job({"SLURMD_NODENAME": "n1"}, load_profile("r", d)), sysfs)
    assert "NCCL_IB_GID_INDEX" not in exports  # stune-sbatch sets the fixed one
    assert messages == ["fabric.gid_index 1 is not a RoCE v2 GID on mlx5_0:1"]


def test_socket_interface_must_exist_and_be_up(tmp_path):
    hwtrees.h100_roce(tmp_path)
    hwtrees.netdev(tmp_path, "eth0", operstate="down", flags="0x1002")
    sysfs = Sysfs(str(tmp_path))
    up, why = socket_interfaces(sysfs, "eth0")
    assert up == [] and why == "socket interface eth0: eth0 is not up"
    assert socket_interfaces(sysfs, "bond0")[1].startswith(
        "socket interface bond0 does not exist on this node (up:"
    )
    assert socket_interfaces(sysfs, "eth")[0][0] == "eth1"  # NCCL's prefix match
    assert socket_interfaces(sysfs, "=eth1")[0] == ["eth1"]


def test_nccl_ifname_syntax():
    assert ifname_matches("eth", "eth10") and not ifname_matches("=eth1", "eth10")
    assert ifname_matches("^docker,lo", "eth0") and not ifname_matches("^docker,lo", "docker0")
    assert ifname_matches("ib0,eth0", "eth0")


def test_output_forms():
    exports = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "ODD": "it's a b", "BAD": "two\nlines"}
    assert as_taskprolog(exports) == "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\nexport ODD=it's a b\n"
    script = as_shell(exports) + 'printf "%s|%s|%s" "$NCCL_IB_HCA" "$ODD" "$BAD"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout
    assert out == "=mlx5_0:1,mlx5_1:1|it's a b|two\nlines"


def run(cmd, env):
    return subprocess.run([os.path.join(BIN, cmd[0]), *cmd[1:]], capture_output=True, text=True, env=env)


def test_stune_env_prints_shell_exports_and_says_what_it_could_not_find(tmp_path):
    sysfs = roce_tree(tmp_path, issue_table, mlx5_2={"state": "1: DOWN"})
    env = dict(os.environ, SLURMD_NODENAME="n1")
    env.pop("SLURM_JOB_PARTITION", None)
    out = run(["stune-env", "-p", "roce", "--sysfs-root", sysfs.root], env)
    assert out.returncode == 0
    evaluated = subprocess.run(
        ["bash", "-c", out.stdout + 'echo "$NCCL_IB_HCA $NCCL_IB_GID_INDEX"'], capture_output=True, text=True
    ).stdout.strip()
    assert evaluated == "=mlx5_0:1,mlx5_1:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 3"
    assert out.stderr == "stune-env: n1: NCCL_IB_HCA narrowed to the ACTIVE ports; left out mlx5_2:1 DOWN\n"
    nopart = run(["stune-env"], env)
    assert nopart.returncode == 2 and "no partition" in nopart.stderr


def test_stune_env_takes_the_shared_options(tmp_path):
    """argparse with cli/options.py's spellings: --node names the node (its messages, %n in --sysfs-root),
    winning over $SLURMD_NODENAME; --partition=P and -p P alike; a bad option is a usage error (2)."""
    roce_tree(tmp_path / "n7", issue_table, mlx5_2={"state": "1: DOWN"})
    env = dict(os.environ, SLURMD_NODENAME="n1")
    env.pop("SLURM_JOB_PARTITION", None)
    out = run(["stune-env", "--partition=roce", "--node", "n7", "--sysfs-root", str(tmp_path / "%n")], env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "stune-env: n7: NCCL_IB_HCA narrowed to the ACTIVE ports; left out mlx5_2:1 DOWN\n"
    assert "export NCCL_IB_HCA='=mlx5_0:1,mlx5_1:1,mlx5_3:1" in out.stdout
    bad = run(["stune-env", "--bogus"], env)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr
    helped = run(["stune-env", "--help"], env)
    assert helped.returncode == 0 and "--sysfs-root DIR" in helped.stdout and "-p PARTITION" in helped.stdout
    from slurm_tune.nodeenv.envrules import NODE_NAMES

    assert all(
        f"\n  {name} (" in helped.stdout for name in NODE_NAMES
    )  # the table's node side, as it decides it


def test_stune_task_prolog_prints_export_lines_and_never_fails_the_task(tmp_path):
    sysfs = roce_tree(tmp_path, issue_table)
    env = dict(os.environ, SLURM_JOB_PARTITION="roce", SLURMD_NODENAME="n1", STUNE_SYSFS_ROOT=sysfs.root)
    out = run(["stune-task-prolog"], env)
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "export NCCL_IB_HCA==" + ",".join(f"mlx5_{i}:1" for i in range(8)),
        "export NCCL_IB_GID_INDEX=3",
        "export NCCL_SOCKET_IFNAME=eth0",
        "export GLOO_SOCKET_IFNAME=eth0",
        "export STUNE_MANAGED=NCCL_IB_HCA=="
        + "%2C".join(f"mlx5_{i}:1" for i in range(8))
        + ",NCCL_IB_GID_INDEX=3,NCCL_SOCKET_IFNAME=eth0,GLOO_SOCKET_IFNAME=eth0",
    ]
    assert run(["stune-task-prolog", "--help"], env).stdout.startswith("`stune-task-prolog`: the TaskProlog")
    # a partition without a profile, or a broken profile directory: nothing exported, the task runs
    assert run(["stune-task-prolog"], dict(env, SLURM_JOB_PARTITION="other")).returncode == 0
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.yaml").write_text("partition: [\n")
    out = run(["stune-task-prolog"], dict(env, STUNE_PARTITIONS=str(broken)))
    assert (out.returncode, out.stdout) == (0, "")


@pytest.mark.parametrize("kind", ["ib", "tcp"])
def test_other_fabrics(tmp_path, kind):
    if kind == "ib":
        hwtrees.dgx_a100_ib(tmp_path)
        exports, messages = node_exports(job({}, load_profile("hdr")), Sysfs(str(tmp_path)))
        assert set(exports) == {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} and messages == []
    else:
        hwtrees.vpc_tcp(tmp_path)
        exports, messages = node_exports(job({}, load_profile("vpc")), Sysfs(str(tmp_path)))
        assert exports == {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"} and messages == []


@settings(max_examples=2000, deadline=None)
@given(
    st.text(),
    st.dictionaries(
        st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1), st.one_of(st.none(), st.text())
    ),
)
def test_managed_parsing_never_fails_and_round_trips(garbage, managed):
    from slurm_tune.nodeenv.managed import format_managed, parse_managed

    parsed = parse_managed(garbage)  # whatever a user put in STUNE_MANAGED
    assert all(isinstance(k, str) and k for k in parsed)
    assert parse_managed(format_managed(managed)) == managed


# ---- one job context, one %n expander -------------------------------------------------------------------------


def outside_a_job(tmp_path, **extra) -> dict:
    """A login node's environment: no SLURM_* / SLURMD_NODENAME, no inherited STUNE_* setting."""
    from usage_helpers import hermetic_env

    env = hermetic_env(tmp_path, **extra)
    env.pop("SLURMD_NODENAME", None)
    return env


def test_stune_env_outside_a_job_stages_the_profiles_cache_stage(tmp_path):
    """`stune-env -p vpc` on a login node: the profile given with -p is the one staging uses (it used to look
    for $SLURM_JOB_PARTITION again further down, find none, and silently stage nothing)."""
    from test_stage_tier import make_tree, tree_digest

    from slurm_tune.stage import admin
    from slurm_tune.stage.tier import TierConfig

    dataset = make_tree(tmp_path / "datasets" / "imagenet", dirs=2, files=5)
    tier = tmp_path / f"{os.uname().nodename.split('.')[0]}-cache"  # %n outside a job: this host's name
    admin.init(TierConfig(str(tier), None, 0.9, 0.75, "fast"))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "vpc.yaml").write_text(
        "partition: vpc\nfabric: {type: tcp, socket_ifname: ens5}\n"
        f"cache:\n  path: {tmp_path}/%n-cache\n  quota: 1G\n  stage: ['{dataset}:IMAGENET']\n"
    )
    hwtrees.vpc_tcp(tmp_path / "node")
    env = outside_a_job(tmp_path, STUNE_PARTITIONS=profiles)
    out = run(["stune-env", "-p", "vpc", "--sysfs-root", str(tmp_path / "node")], env)
    assert out.returncode == 0, out.stderr
    staged = subprocess.run(
        ["bash", "-c", out.stdout + 'printf %s "$STUNE_STAGE_IMAGENET"'], capture_output=True, text=True
    ).stdout
    assert staged.startswith(str(tier) + "/"), (out.stdout, out.stderr)
    assert tree_digest(staged) == tree_digest(dataset)
    assert "NCCL_SOCKET_IFNAME='ens5'" in out.stdout


def test_staging_takes_the_profile_from_the_context_not_the_environment(tmp_path):
    """Below the entry point nothing reloads the profile from $SLURM_JOB_PARTITION: a job environment that
    names another (unknown) partition changes nothing, and a context without a profile says why."""
    from slurm_tune.stage.jobenv import resolve
    from slurm_tune.stage.spec import StageRequest, encode_requests

    profiles = tmp_path / "p"
    profiles.mkdir()
    (profiles / "t.yaml").write_text(
        "partition: t\nfabric: {type: tcp, socket_ifname: eth0}\n"
        f"cache:\n  path: {tmp_path}/tier-%n\n  stage: ['/data/a:A']\n"
    )
    env = {
        "SLURM_JOB_PARTITION": "elsewhere",
        "SLURMD_NODENAME": "n3",
        "SLURM_JOB_ID": "77",
        "STUNE_STAGE": encode_requests([StageRequest("/data/b", "B")], False),
    }
    context = job_context(env, partition="t").with_profile(lambda name: load_profile(name, profiles))
    assert (context.node, context.partition, context.job_id) == ("n3", "t", "77")
    stage = resolve(context)
    assert [r.name for r in stage.requests] == ["A", "B"] and stage.problem is None
    assert stage.config.root == f"{tmp_path}/tier-n3" and stage.job_id == "77"
    missing = job_context(env).with_profile(lambda name: load_profile(name, profiles))
    assert missing.profile is None and "elsewhere" in str(missing.profile_error)
    assert "no cache tier for partition 'elsewhere'" in str(resolve(missing).problem)
    nothing = resolve(job_context({"STUNE_STAGE": env["STUNE_STAGE"]}))
    assert "SLURM_JOB_PARTITION is not set" in str(nothing.problem)


def test_the_job_context_reads_slurms_variables_once():
    env = {"SLURM_JOB_PARTITION": "gpu,cpu", "SLURMD_NODENAME": "gpu07", "SLURM_JOB_ID": "12"}
    job = job_context(env)
    assert (job.node, job.partition, job.job_id, job.environ) == ("gpu07", "gpu", "12", env)
    job = job_context(env, partition="vpc", node="x")
    assert (job.node, job.partition) == ("x", "vpc")
    assert job_context(dict(env, SLURM_JOB_ID="1\u00b2")).job_id is None  # not ASCII digits: no job
    assert job_context({}).node == os.uname().nodename.split(".")[0] and job_context({}).partition == ""
    assert (
        job_context({}).with_profile(lambda name: pytest.fail("no partition: nothing to load")).profile
        is None
    )
    from slurm_tune.thisnode import job_partition  # the health prolog's rule too

    assert (
        job_partition(env) == "gpu"
        and job_partition({}) == ""
        and job_partition({"SLURM_JOB_PARTITION": ""}) == ""
    )


@pytest.mark.parametrize(
    "template, node, expected",
    [
        ("/srv/%n/sysfs", "n2", "/srv/n2/sysfs"),
        ("/srv/100%%/%n", "n2", "/srv/100%/n2"),
        ("/srv/%%n/%n", "n2", "/srv/%n/n2"),
        ("/srv/plain", "n2", "/srv/plain"),
        ("/a%n%n", "n1", "/an1n1"),
        ("/srv/%%%n", "n2", "/srv/%n2"),
        ("/srv/%x", "n2", "/srv/%x"),
    ],
)
def test_one_percent_n_expander_at_every_site(template, node, expected, tmp_path):
    """hw/sysfs.resolve_root, health/state.state_dir, health/node.settings (the GPU snapshot) and
    stage/tier.expand_path all expand `%n` and `%%` through thisnode.expand: the same answer everywhere."""
    from slurm_tune.health import node as health_node
    from slurm_tune.health.state import state_dir
    from slurm_tune.hw.sysfs import resolve_root
    from slurm_tune.stage.tier import expand_path
    from slurm_tune.thisnode import expand, uses_node

    env = {"SLURMD_NODENAME": node}
    assert expand(template, node) == expected == expand(template, environ=env)
    assert (
        resolve_root(template, {}, node)
        == expected
        == resolve_root(None, dict(env, STUNE_SYSFS_ROOT=template))
    )
    assert state_dir(template, {}, node) == expected == state_dir(None, dict(env, STUNE_STATE_DIR=template))
    settings = health_node.settings(
        {"node": node, "gpu_snapshot": template, "sysfs_root": template, "state_dir": template},
        {"SLURMD_NODENAME": "other"},
    )
    assert (settings.gpu_snapshot, settings.root, settings.state_dir) == (expected,) * 3
    assert expand_path(template, node) == os.path.normpath(expected)
    assert uses_node(template) == ("%n" in template.replace("%%", ""))


def test_a_task_with_nothing_to_stage_or_say_never_loads_the_stage_package(tmp_path):
    """The TaskProlog runs before every task: the job log and the staging code load only when used."""
    from importcheck import loaded_by

    hwtrees.h100_roce(tmp_path / "node")
    env = dict(
        outside_a_job(tmp_path),
        SLURM_JOB_PARTITION="roce",
        SLURMD_NODENAME="n1",
        SLURM_JOB_ID="5",
        STUNE_SYSFS_ROOT=str(tmp_path / "node"),
        STUNE_PARTITIONS=str(REPO / "partitions"),
        STUNE_CACHE_DIR=str(tmp_path / "cache"),
    )
    code = "from slurm_tune.cli.taskprolog import _main\nassert _main([]) == 0"
    quiet = loaded_by(code, env)
    assert "slurm_tune.nodeenv.taskenv" in quiet and not any(m.startswith("slurm_tune.stage") for m in quiet)
    staging = loaded_by(code, dict(env, STUNE_STAGE="v1;optional;DS=/nonexistent/ds"))
    assert "slurm_tune.stage.jobenv" in staging


@pytest.mark.parametrize(
    "step_id, shown",
    [
        (None, "batch"),
        ("4294967294", "batch"),
        ("-5", "batch"),
        ("4294967291", "batch"),
        ("0", "0"),
        ("12", "12"),
    ],
)
def test_the_task_summary_names_the_batch_step_on_every_release(step_id, shown):
    """22.05 and 24.11 give the batch step's TaskProlog SLURM_STEP_ID=4294967294, 26.05 gives -5."""
    from slurm_tune.cli.taskprolog import summary_line

    job = job_context({"SLURMD_NODENAME": "n1", **({"SLURM_STEP_ID": step_id} if step_id else {})})
    assert summary_line(job, {}).startswith(f"stune: n1 step {shown}: ")


def test_the_task_summary_lists_datasets_but_not_the_stage_log():
    """STUNE_STAGE_LOG shares the STUNE_STAGE_ prefix but names the log file (stage.spec.LOG_VAR), not a dataset."""
    from slurm_tune.cli.taskprolog import summary_line
    from slurm_tune.stage.spec import LOG_VAR

    job = job_context({"SLURMD_NODENAME": "n2", LOG_VAR: "/x/log", "STUNE_STAGE_DATA": "/cache/d"})
    line = summary_line(job, {})
    assert line.startswith("stune: n2 step batch: ") and "STUNE_STAGE_DATA=/cache/d" in line
    assert LOG_VAR not in line


# ---- the one rule table (nodeenv/envrules.py) --------------------------------------------------------------


def test_docs_show_the_rule_table_the_code_reads():
    from slurm_tune.nodeenv.envrules import markdown_table

    assert markdown_table() in (REPO / "docs/sbatch.md").read_text()


@pytest.mark.parametrize("partition", ["hdr", "roce", "vpc"])
def test_the_plan_sets_exactly_the_tables_rows_for_a_profile(partition):
    """Every NCCL/gloo/rendezvous setting of the plan is a row of the table that applies, decided where the
    row says: a `submit` row's value in the job's environment, a `node` row left to the node."""
    from slurm_tune.nodeenv.envrules import NODE, RULES
    from slurm_tune.sbatch.options import Effective
    from slurm_tune.sbatch.plan import ENV as PLAN_ENV
    from slurm_tune.sbatch.plan import NODE as PLAN_NODE
    from slurm_tune.sbatch.plan import build_plan

    profile = load_profile(partition)
    plan = build_plan(
        partition=partition,
        partition_source="test",
        profile=profile,
        eff=Effective([], [], {}),
        environ={},
        cwd="/",
        stage_args=[],
        stage_required=False,
        degraded_nodes=list,
        het=False,
    )
    expected = [
        (name, PLAN_NODE if r.decided == NODE else PLAN_ENV, value)
        for r in RULES
        if r.when(profile)
        for name, value, _ in r.values(profile)
    ]
    rule_names = {name for name, _, _ in expected}
    got = [
        (s.name, s.kind, s.value)
        for s in plan.settings
        if s.name in rule_names and s.kind in (PLAN_ENV, PLAN_NODE)
    ]
    assert got == expected
    if profile.fabric.type != "tcp":
        hca = next(v for n, _, v in got if n == "NCCL_IB_HCA")
        assert hca == "=" + ",".join(f"{h.device}:{h.port}" for h in profile.fabric.hcas)


def test_the_node_sets_only_the_tables_node_rows(tmp_path):
    """What node_exports may set on a node is what the table decides there (rows `node` or `submit, node`),
    and the rendezvous (set once per job) is what STUNE_MANAGED records by name only."""
    from slurm_tune.nodeenv.envrules import NODE_NAMES, ONCE, REFINED_NAMES, RULES
    from slurm_tune.nodeenv.managed import RENDEZVOUS

    assert tuple(r.name for r in RULES if r.user == ONCE) == RENDEZVOUS
    assert REFINED_NAMES == ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
    profile = load_profile("roce")
    sysfs = roce_tree(tmp_path, issue_table)
    exports, _ = node_exports(
        job({"SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}, profile), sysfs
    )
    assert set(exports) <= set(NODE_NAMES) and {"NCCL_IB_HCA", "MASTER_ADDR", "MASTER_PORT"} <= set(exports)
    assert list(NODE_NAMES) == [
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "STUNE_STEPS_FILE",
        "HCCL_IF_IP",
        "ASCEND_RT_VISIBLE_DEVICES",
        "RANK_TABLE_FILE",
    ]
