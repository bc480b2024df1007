"""The hooks and the command line on one node, without Slurm: prolog and epilog exit codes, the trust rule,
never draining by mistake, deadlines, outputs, capture and offline check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import healthkit as kit
import pytest

from slurm_tune.health import node as health_node
from slurm_tune.health import state as health_state

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture
def box(tmp_path, monkeypatch):
    """One node's world: a DGX-A100 sysfs tree, a GPU snapshot, a state dir, and the env a hook would get."""
    root = kit.tree(tmp_path / "root", "hdr")
    gpus = kit.gpu_file(tmp_path / "gpus.json")
    env = {
        "STUNE_SYSFS_ROOT": str(root),
        "STUNE_GPU_SNAPSHOT": str(gpus),
        "STUNE_STATE_DIR": str(tmp_path / "state"),
        "STUNE_HEALTH_PARTITION": "hdr",
        "SLURMD_NODENAME": "n7",
        "STUNE_PARTITIONS": str(REPO / "partitions"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {"root": root, "gpus": gpus, "state": tmp_path / "state", "env": env, "tmp": tmp_path}


def health(*args, env=None, check=False):
    full = dict(os.environ, **(env or {}))
    proc = subprocess.run([str(BIN / "stune-health"), *args], capture_output=True, text=True, env=full)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def port_down(box, hca="mlx5_2"):
    (box["root"] / f"sys/class/infiniband/{hca}/ports/1/state").write_text("1: DOWN\n")
    (box["root"] / f"sys/class/infiniband/{hca}/ports/1/phys_state").write_text("3: Disabled\n")


def test_a_healthy_prolog_passes_and_the_node_earns_trust_in_the_policy(box):
    proc = health("prolog")
    assert proc.returncode == 0, proc.stderr
    state, problem = health_state.read(str(box["state"]))
    assert problem is None and state["last"]["status"] == "ok" and state["last"]["mode"] == "prolog"
    policy = health_state.policy_digest(kit.profile("hdr"))
    assert state["trusted"] == [policy] and state["partition"] == "hdr" and state["node"] == "n7"
    assert not (box["state"] / "last-prolog.json").exists()  # a healthy prolog writes only its state


def test_a_hook_that_finds_something_leaves_its_full_report(box):
    port_down(box)
    assert health("prolog").returncode == 0
    doc = json.loads((box["state"] / "last-prolog.json").read_text())
    assert doc["status"] == "fail" and doc["node"] == "n7" and doc["counts"]["ok"] > 20
    assert doc["note"].startswith("not failing the job: this node has never passed policy")


def test_a_port_down_fails_the_prolog_once_the_policy_is_trusted(box):
    assert health("prolog").returncode == 0
    port_down(box)
    proc = health("prolog")
    assert proc.returncode == 10
    assert "mlx5_2/1 state DOWN" in proc.stderr
    state, _ = health_state.read(str(box["state"]))
    assert state["hook_fail"]["reason"] == "mlx5_2/1 state DOWN" and state["hook_fail"]["mode"] == "prolog"
    assert "prolog fail: mlx5_2/1 state DOWN; failing the job" in (box["state"] / "health.log").read_text()


def test_a_policy_the_node_never_passed_does_not_fail_jobs(box):
    port_down(box)
    proc = health("prolog")
    assert proc.returncode == 0
    assert "never passed policy" in proc.stderr
    state, _ = health_state.read(str(box["state"]))
    assert "hook_fail" not in state and state["trusted"] == []


def test_the_breaker_stops_hooks_from_failing_jobs(box):
    assert health("prolog").returncode == 0
    policy = health_state.policy_digest(kit.profile("hdr"))
    with health_state.Locked(str(box["state"])) as st:
        st.state["breaker"] = {"open": True, "policy": policy, "at": time.time(), "message": "x"}
        st.save()
    port_down(box)
    proc = health("prolog")
    assert proc.returncode == 0 and "circuit breaker is open" in proc.stderr


def test_a_broken_profile_or_a_bug_never_fails_a_hook(box, tmp_path):
    bad = kit.profile_dir(tmp_path / "bad", {"site.yaml": [("ib_timeout: 22", "ib_timout: 22")]})
    proc = health("prolog", env={"STUNE_PARTITIONS": str(bad)})
    assert proc.returncode == 0 and "ib_timout: unknown key" in proc.stderr
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = health("epilog", env={"STUNE_STATE_DIR": str(blocker / "state")})
    assert proc.returncode == 0 and "internal error, not judged" in proc.stderr
    proc = health("prolog", env={"STUNE_HEALTH_PARTITION": "nosuch"})
    assert proc.returncode == 0 and "no profile for partition 'nosuch'" in proc.stderr


def test_the_epilog_catches_what_the_job_left_behind(box):
    assert health("epilog").returncode == 0
    kit.gpu_file(box["gpus"], devices=kit.gpu_devices("a100", 8, gpu5={"ecc_uncorrected": 1}))
    proc = health("epilog")
    assert proc.returncode == 10 and "gpu5 1 uncorrected ECC" in proc.stderr


def test_a_hung_sysfs_read_does_not_hang_the_prolog(box, tmp_path, monkeypatch):
    from slurm_tune.hw.sysfs import Sysfs

    directory = kit.profile_dir(
        tmp_path / "p", {"site.yaml": [("probe_timeout_s: 5", "probe_timeout_s: 0.3")]}
    )
    monkeypatch.setenv("STUNE_PARTITIONS", str(directory))
    real = Sysfs.ib_device

    def stuck(self, device, **kw):
        if device == "mlx5_3":
            time.sleep(30)  # a wedged HCA driver blocks the read in the kernel
        return real(self, device, **kw)

    monkeypatch.setattr(Sysfs, "ib_device", stuck)
    start = time.monotonic()
    code, doc = health_node.hook("prolog", health_node.settings({}))
    assert time.monotonic() - start < 3
    assert code == 0 and doc["status"] == "unknown"
    stalled = [r for r in doc["results"] if r["subject"] == "mlx5_3/1"]
    assert stalled and "did not answer within 0.3s" in stalled[0]["message"]
    assert [r["status"] for r in doc["results"] if r["subject"] == "mlx5_0/1"] == ["ok", "ok", "ok"]


def test_the_shipped_hook_scripts_map_only_a_judged_failure_to_a_failed_prolog(box, tmp_path):
    defaults = tmp_path / "stune.env"
    defaults.write_text(
        "".join(f"{k}={v}\n" for k, v in box["env"].items() if k != "SLURMD_NODENAME")
        + f"STUNE_BIN={BIN}\nSTUNE_CACHE_DIR={tmp_path / 'cache'}\n"
    )
    hook_env = {"STUNE_ENV_FILE": str(defaults), "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42"}

    def hook(kind, env=hook_env):  # Slurm gives hooks a minimal environment
        return subprocess.run([str(REPO / kind / "10-stune-health")], capture_output=True, text=True, env=env)

    assert hook("prolog").returncode == 0 and hook("epilog").returncode == 0
    # root's hook loads its code by the path search only: no file of code in the cache directory (issue 23)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith("profiles")] == []
    port_down(box)
    assert hook("prolog").returncode == 1 and hook("epilog").returncode == 1
    defaults.write_text(defaults.read_text().replace(f"STUNE_BIN={BIN}", "STUNE_BIN=/nowhere"))
    missing = hook("prolog")
    assert missing.returncode == 0 and "stune-health not found" in missing.stderr
    crashing = tmp_path / "bin"
    crashing.mkdir()
    (crashing / "stune-health").write_text("#!/bin/sh\necho 'ImportError: no module' >&2\nexit 1\n")
    (crashing / "stune-health").chmod(0o755)
    defaults.write_text(defaults.read_text().replace("STUNE_BIN=/nowhere", f"STUNE_BIN={crashing}"))
    crashed = hook("prolog")
    assert crashed.returncode == 0 and "exited 1; not failing job 42" in crashed.stderr


def test_one_script_is_the_prolog_and_the_epilog_and_slurmd_says_which(box, tmp_path):
    assert (REPO / "epilog/10-stune-health").resolve() == (REPO / "prolog/10-stune-health").resolve()
    defaults = tmp_path / "stune.env"
    defaults.write_text(
        "".join(f"{k}={v}\n" for k, v in box["env"].items() if k != "SLURMD_NODENAME")
        + f"STUNE_BIN={BIN}\nSTUNE_CACHE_DIR={tmp_path / 'cache'}\n"
    )

    def hook(*args, **env):
        env = {"STUNE_ENV_FILE": str(defaults), "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42", **env}
        return subprocess.run(
            [str(REPO / "prolog/10-stune-health"), *args], capture_output=True, text=True, env=env
        )

    def last_mode():
        return health_state.read(str(box["state"]))[0]["last"]["mode"]

    assert hook(SLURM_SCRIPT_CONTEXT="epilog_slurmd").returncode == 0 and last_mode() == "epilog"
    assert hook(SLURM_SCRIPT_CONTEXT="prolog_slurmd").returncode == 0 and last_mode() == "prolog"
    assert hook("epilog").returncode == 0 and last_mode() == "epilog"  # by hand
    assert hook().returncode == 0 and last_mode() == "prolog"
    # the epilog's full checks: a GPU the job broke fails the epilog, the prolog does not look at NVML
    kit.gpu_file(box["gpus"], devices=kit.gpu_devices("a100", 8, gpu5={"ecc_uncorrected": 1}))
    assert hook(SLURM_SCRIPT_CONTEXT="prolog_slurmd").returncode == 0
    failed = hook(SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    assert failed.returncode == 1 and "gpu5 1 uncorrected ECC" in failed.stderr
    # in the controller's PrologSlurmctld by mistake: the controller is not judged as a node
    wrong = hook(SLURM_SCRIPT_CONTEXT="prolog_slurmctld")
    assert wrong.returncode == 0 and "not a node's Prolog or Epilog; nothing done" in wrong.stderr
    assert last_mode() == "epilog"


SHELL_HOOKS = [
    "prolog/20-stune-jobgpus",
    "prolog/stune-health-run",
    "epilog/20-stune-usage",
    "epilog/30-stune-stage",
    "epilog/stune-usage-slurmctld",
]


@pytest.mark.parametrize("hook", SHELL_HOOKS)
def test_every_root_shell_hook_takes_its_settings_through_the_one_preamble(hook, tmp_path):
    text = (REPO / hook).read_text()
    assert '. "$hook_env"' in text and "find" not in text and "STUNE_ENV_FILE" not in text
    # run from the tree it finds hooks/; a copy without the preamble does nothing and says so
    copy = tmp_path / "prolog.d" / "hook"
    copy.parent.mkdir()
    copy.write_text(text)
    copy.chmod(0o755)
    proc = subprocess.run(
        [str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "SLURM_JOB_ID": "5",
            "SLURM_JOB_GPUS": "0",
            "STUNE_ENV_FILE": "/dev/null",
            "STUNE_BIN": str(tmp_path / "nowhere"),
        },
    )
    assert proc.returncode == 0 and "stune-hook-env.sh not found; nothing done" in proc.stderr


def test_installed_shell_hooks_source_the_installed_preamble(tmp_path, capsys):
    from slurm_tune.cli.admin import main as admin

    assert admin(["install", "--prefix", str(tmp_path), "--role", "all"]) == 0, capsys.readouterr()
    etc = tmp_path / "etc/slurm"
    preamble = etc / "stune-hook-env.sh"
    assert preamble.read_bytes() == (REPO / "hooks/stune-hook-env.sh").read_bytes().replace(
        b"/etc/default/stune}", f"{tmp_path}/etc/default/stune}}".encode()
    )
    assert preamble.stat().st_mode & 0o777 == 0o644
    for hook in SHELL_HOOKS:
        placed = {
            "prolog/20-stune-jobgpus": etc / "prolog.d/20-stune-jobgpus",
            "epilog/20-stune-usage": etc / "epilog.d/20-stune-usage",
            "epilog/30-stune-stage": etc / "epilog.d/30-stune-stage",
        }.get(hook, etc / hook.split("/")[1])
        assert f'hook_env="{preamble}"' in placed.read_text(), placed
    # the installed prolog hook runs with the installed env file's settings (STUNE_USAGE_DIR under the prefix)
    proc = subprocess.run(
        [str(etc / "prolog.d/20-stune-jobgpus")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "2,3"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "var/lib/stune/usage/jobs/7").read_text() == "2,3\n"


# ---- capture and offline check -----------------------------------------------------------------------------


def test_capture_then_check_offline(box, tmp_path):
    out = tmp_path / "n7.json"
    proc = health("capture", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(out.read_text())
    assert snap["node"] == "n7" and len(snap["gpus"]["devices"]) == 8 and snap["ib"]["answered"]
    assert snap["ib"]["devices"]["mlx5_0"]["ports"]["1"]["gids"], "a triage capture keeps the GID tables"
    ok = health("check", "--snapshot", str(out), "--partition", "hdr")
    assert (
        ok.returncode == 0
        and ok.stdout.startswith("n7 (hdr, policy ")
        and ": OK" in ok.stdout.splitlines()[0]
    )
    port_down(box, "mlx5_7")
    health("capture", "-o", str(tmp_path / "later.json"))
    bad = health("check", "--snapshot", str(tmp_path / "later.json"), "--partition", "hdr")
    assert bad.returncode == 6
    lines = bad.stdout.splitlines()
    assert lines[0].endswith(": FAIL - mlx5_7/1 state DOWN")
    assert lines[1].split()[:3] == ["fail", "ib.link", "mlx5_7/1:"]


def test_check_with_a_previous_snapshot_judges_counter_increases(box, tmp_path):
    health("capture", "-o", str(tmp_path / "before.json"))
    (box["root"] / "sys/class/infiniband/mlx5_1/ports/1/counters/link_downed").write_text("5\n")
    health("capture", "-o", str(tmp_path / "after.json"))
    alone = health("check", "--snapshot", str(tmp_path / "after.json"), "--partition", "hdr")
    assert alone.returncode == 0  # first sight: a total is history
    both = health(
        "check",
        "--snapshot",
        str(tmp_path / "after.json"),
        "--previous",
        str(tmp_path / "before.json"),
        "--partition",
        "hdr",
        "--json",
    )
    assert both.returncode == 6
    doc = json.loads(both.stdout)
    assert doc["reason"] == "mlx5_1/1 link_downed +5" and doc["status"] == "fail"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"format": "stune-snapshot/1",\n "ib": [,]}', ":2: not JSON"),
        ("[]", "not a stune snapshot"),
    ],
)
def test_a_garbled_snapshot_is_one_line_and_exit_1(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = health("check", "--snapshot", str(path), "--partition", "hdr")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"stune-health: {path}") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_check_needs_a_partition_when_there_are_several_profiles():
    proc = health(
        "check",
        "--snapshot",
        str(REPO / "tests/fixtures/snapshots/vpc-a10g.json"),
        env={"STUNE_HEALTH_PARTITION": ""},
    )
    assert proc.returncode == 1 and "say which with --partition" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["check", "--snapshot"], "--snapshot needs a value"),
        (["check"], "--snapshot FILE is required"),
        (["run", "--verbose"], "unknown option '--verbose'"),
        (["clear"], "say what to forget"),
    ],
)
def test_usage_errors(args, message):
    proc = health(*args)
    assert proc.returncode == 2 and message in proc.stderr


def test_the_xid_table_is_printed():
    proc = health("xids")
    assert (
        proc.returncode == 0 and "  79  drain    -      reboot  GPU has fallen off the bus\n" in proc.stdout
    )
    assert "  13  count    -      -       graphics engine exception" in proc.stdout


def test_clear_forgets_held_xids(box):
    with health_state.Locked(str(box["state"])) as st:
        st.state["xid_sticky"] = [{"seq": 1, "xid": 79, "pci": "0000:47:00", "text": ""}]
        st.save()
    assert health("clear", "--xid").returncode == 0
    assert health_state.read(str(box["state"]))[0]["xid_sticky"] == []


# ---- outputs ------------------------------------------------------------------------------------------------


def test_prometheus_textfile_and_json_outputs(box, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    port_down(box)
    prom, js = tmp_path / "tf" / "stune_health.prom", tmp_path / "verdict.json"
    proc = health("epilog", env={"STUNE_HEALTH_PROM": str(prom), "STUNE_HEALTH_JSON": str(js)})
    assert proc.returncode == 0  # first sight of this policy: judged, not enforced
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    (status,) = families["stune_health_status"].samples
    assert (
        status.value == 3
        and status.labels["node"] == "n7"
        and status.labels["reason"] == "mlx5_2/1 state DOWN"
    )
    checks = {
        (s.labels["check"], s.labels["subject"]): s.value
        for s in families["stune_health_check_status"].samples
    }
    assert checks[("ib.link", "mlx5_2/1")] == 3 and checks[("ib.link", "mlx5_0/1")] == 0
    assert families["stune_health_breaker_open"].samples[0].value == 0
    doc = json.loads(js.read_text())
    assert doc["status"] == "fail" and doc["mode"] == "epilog" and not doc["enforced"]
    assert {
        "check": "ib.link",
        "subject": "mlx5_2/1",
        "status": "fail",
        "reason": "mlx5_2/1 state DOWN",
        "message": "state DOWN (1: DOWN), phys_state 3: Disabled; expected ACTIVE and LinkUp",
    } in doc["results"]


def test_state_survives_garbage(box):
    box["state"].mkdir(parents=True, exist_ok=True)
    (box["state"] / "state.json").write_text("{not json")
    proc = health("prolog")
    assert proc.returncode == 0
    assert "unreadable, starting over" in (box["state"] / "health.log").read_text()
    assert health_state.read(str(box["state"]))[0]["last"]["status"] == "ok"


def test_a_process_with_a_hung_probe_still_exits_at_once():
    code = (
        "import time; from slurm_tune.hw.deadline import run_probe; "
        "r = run_probe('stuck', lambda p: time.sleep(60), 0.2); print(r.status, r.message)"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - start < 10
    assert proc.returncode == 0 and proc.stdout.strip() == "timeout stuck did not answer within 0.2s"


def test_which_profile_a_node_uses(box, monkeypatch):
    monkeypatch.delenv("STUNE_HEALTH_PARTITION")
    cfg = health_node.settings({})
    assert cfg.partition is None
    profile, how = health_node.resolve_profile(cfg, {}, "prolog", {"SLURM_JOB_PARTITION": "roce"})
    assert (profile.partition, how) == ("roce", "the job's partition roce")
    profile, how = health_node.resolve_profile(
        cfg, {"partition": "vpc"}, "prolog", {"SLURM_JOB_PARTITION": "roce"}
    )
    assert (profile.partition, how) == (
        "vpc",
        "used by this node before",
    )  # one profile per node, once chosen
    profile, how = health_node.resolve_profile(
        health_node.settings({"partition": "hdr"}), {"partition": "vpc"}, "prolog", {}
    )
    assert (profile.partition, how) == ("hdr", "set for this node")
    from slurm_tune.errors import ConfigError

    with pytest.raises(ConfigError, match="no profile applies to node n7: set STUNE_HEALTH_PARTITION"):
        health_node.resolve_profile(cfg, {}, "prolog", {})


def test_a_dry_run_changes_nothing_on_the_node(box):
    from slurm_tune.slurm import Slurm

    slurm = Slurm(conf="/nonexistent/slurm.conf")
    code, doc = health_node.run(health_node.settings({}), slurm, dry_run=True)
    assert (code, doc["status"], doc["sync"], doc["dry_run"]) == (0, "ok", "the verdict changed", True)
    assert slurm.calls == [] and not (box["state"] / "state.json").exists()


def test_unknown_earns_no_trust(box):
    (box["root"] / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("garbage\n")
    assert health("prolog").returncode == 0
    state, _ = health_state.read(str(box["state"]))
    assert state["last"]["status"] == "unknown" and state["trusted"] == []
