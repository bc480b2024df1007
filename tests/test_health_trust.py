"""Issue 10, robust code paths under the checks: root loads nothing (env file, profiles, profile cache, node
state, GPU snapshot) that someone else can write, writes its cache through an exclusive temporary, and the
fast JSON path survives a changed private `_json` API. Run as root (the hooks are), with the test users."""

from __future__ import annotations

import json
import marshal
import os
import pwd
import subprocess
import sys
from pathlib import Path

import healthkit as kit
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune import profiles as stune_profiles
from slurm_tune import profilestore
from slurm_tune.health import prologhook
from slurm_tune.safeio import UnsafePathError

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="root's trust rules apply to root only")


def alice() -> int:
    """The uid of the dev cluster's test user stune-alice, made when missing (as the cluster makes it)."""
    from stune_dev.host import ensure_unix_users

    try:
        return pwd.getpwnam("stune-alice").pw_uid
    except KeyError:
        if os.geteuid() != 0:
            pytest.skip("the test user stune-alice does not exist, and making it takes root")
        ensure_unix_users()
        return pwd.getpwnam("stune-alice").pw_uid


@pytest.fixture
def node(tmp_path, monkeypatch):
    """One node's world for the hooks, under a root-owned 0755 directory."""
    base = tmp_path / "node"
    base.mkdir(mode=0o755)
    profiles = kit.profile_dir(base / "partitions")
    env = {
        "STUNE_SYSFS_ROOT": str(kit.tree(base / "root", "hdr")),
        "STUNE_STATE_DIR": str(base / "state"),
        "STUNE_GPU_SNAPSHOT": str(kit.gpu_file(base / "gpus.json")),
        "STUNE_HEALTH_PARTITION": "hdr",
        "SLURMD_NODENAME": "n7",
        "STUNE_PARTITIONS": str(profiles),
        "STUNE_CACHE_DIR": str(base / "cache"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {"base": base, "profiles": profiles, "env": env, "cache": base / "cache", "state": base / "state"}


def health(*args, env=None):
    proc = subprocess.run(
        [str(BIN / "stune-health"), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# ---- profiles and their cache ---------------------------------------------------------------------------------


@as_root
@pytest.mark.parametrize(
    "spoil, what",
    [
        (lambda n: n["profiles"].chmod(0o777), "partitions: is writable by group and others (mode 0777)"),
        (lambda n: n["profiles"].chmod(0o775), "partitions: is writable by group (mode 0775)"),
        (lambda n: os.chown(n["profiles"] / "hdr.yaml", alice(), 0), "hdr.yaml: is owned by uid"),
        (lambda n: (n["profiles"] / "site.yaml").chmod(0o666), "site.yaml: is writable by group and others"),
        (lambda n: n["base"].chmod(0o777), "is writable by group and others (mode 0777)"),
    ],
)
def test_root_refuses_profiles_someone_else_can_write(node, spoil, what):
    spoil(node)
    proc = health("prolog")
    assert proc.returncode == 0  # a hook never fails a job for this: it says so and does not judge
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "prolog: not judged: " in lines[0] and what in lines[0], proc.stderr
    assert "root does not load it" in lines[0]
    with pytest.raises(UnsafePathError, match="root does not load it"):
        stune_profiles.load_profile("hdr", node["profiles"])


@as_root
def test_a_forged_cache_in_a_shared_cache_dir_is_never_loaded(node):
    assert health("prolog").returncode == 0  # writes the cache
    (cache,) = node["cache"].glob("profiles*.marshal")
    fingerprint, real = marshal.loads(cache.read_bytes())  # each profile marshalled on its own
    forged = marshal.loads(real["hdr"])
    forged["fabric"]["hcas"] = [{"device": "mlx5_9", "port": 1, "netdev": None}]  # would fail the node
    cache.write_bytes(marshal.dumps((fingerprint, dict(real, hdr=marshal.dumps(forged)))))
    assert (
        stune_profiles.load_profile("hdr", node["profiles"]).fabric.hcas[0].device == "mlx5_9"
    )  # trusted: it is root's
    node["cache"].chmod(0o777)  # an admin "shares" the cache directory
    os.chown(cache, alice(), 0)
    proc = health("prolog")
    assert proc.returncode == 0 and "not using the profile cache" in proc.stderr and str(cache) in proc.stderr
    state = json.loads((node["state"] / "state.json").read_text())
    assert state["last"]["status"] == "ok"  # judged by the real profiles, not the forged ones
    assert os.stat(cache).st_uid == alice()  # and root did not write into the shared directory


@as_root
def test_crafted_marshal_data_or_a_fifo_as_the_cache_cannot_stop_the_prolog(node):
    assert health("prolog").returncode == 0
    (cache,) = node["cache"].glob("profiles*.marshal")
    cache.write_bytes(b"\xe3" + os.urandom(64))  # garbage: ignored, the profiles re-validated
    assert stune_profiles.load_profile("hdr", node["profiles"]).partition == "hdr"
    cache.unlink()
    os.mkfifo(cache)
    assert stune_profiles.load_profile("hdr", node["profiles"]).partition == "hdr"  # not blocked on the FIFO
    cache.unlink()
    cache.symlink_to(node["base"] / "elsewhere")
    assert stune_profiles.load_profile("hdr", node["profiles"]).partition == "hdr"
    assert not (node["base"] / "elsewhere").exists()


def test_the_cache_is_written_through_an_exclusive_random_temporary(node, monkeypatch):
    from slurm_tune import safeio

    written = []
    real = safeio.write_atomic
    monkeypatch.setattr(
        safeio, "write_atomic", lambda path, data, **kw: written.append((path, kw)) or real(path, data, **kw)
    )
    (node["cache"]).mkdir(mode=0o700)
    predictable = [
        node["cache"] / f"{profilestore._cache_path(str(node['profiles'])).rsplit('/', 1)[1]}.{pid}"
        for pid in range(os.getpid() - 2, os.getpid() + 3)
    ]
    victim = node["base"] / "victim"
    victim.write_text("keep me\n")
    for name in predictable:  # the old code's temporary names: planted links to a root file
        name.symlink_to(victim)
    stune_profiles.load_profile("hdr", node["profiles"])
    assert [p for p, _ in written] == [profilestore._cache_path(str(node["profiles"]))] and written[0][1][
        "mode"
    ] == 0o600
    assert victim.read_text() == "keep me\n"


# ---- node state and the GPU snapshot ------------------------------------------------------------------------


@as_root
def test_root_refuses_a_state_dir_someone_else_can_write(node):
    node["state"].mkdir(mode=0o755)
    os.chown(node["state"], alice(), 0)
    proc = health("prolog")
    assert proc.returncode == 0 and "not judged" in proc.stderr and "state: is owned by uid" in proc.stderr
    assert list(node["state"].iterdir()) == []  # nothing read, nothing written: no lock, no log
    node["state"].rmdir()
    node["base"].chmod(0o777)  # the state dir does not exist yet: where root would create it counts
    proc = health("epilog")
    assert proc.returncode == 0 and "its parent" in proc.stderr and not node["state"].exists()


@as_root
def test_a_gpu_snapshot_someone_else_can_write_is_not_replayed(node):
    os.chown(node["env"]["STUNE_GPU_SNAPSHOT"], alice(), 0)
    proc = health("epilog")
    assert proc.returncode == 0
    doc = json.loads((node["state"] / "last-epilog.json").read_text())
    (nvml,) = [r for r in doc["results"] if r["check"] == "gpu.nvml"]
    assert nvml["status"] == "unknown" and "root does not load it" in nvml["message"]


# ---- the env file the shell hooks source -----------------------------------------------------------------------


@as_root
@pytest.mark.parametrize(
    "hook", ["prolog/10-stune-health", "epilog/10-stune-health", "prolog/stune-health-run"]
)
@pytest.mark.parametrize("spoil", ["file 0666", "file alice's", "dir 0777", "dir 1777 but file 0646"])
def test_the_hooks_never_source_an_env_file_someone_else_can_write(node, hook, spoil):
    etc = node["base"] / "etc"
    etc.mkdir(mode=0o755)
    env_file = etc / "stune"
    marker = node["base"] / "sourced"
    env_file.write_text(
        f"touch {marker}\n" + "".join(f"{k}={v}\n" for k, v in node["env"].items()) + f"STUNE_BIN={BIN}\n"
    )
    env_file.chmod(0o644)
    _kind, _mode = spoil.split(" ", 1)
    if spoil == "file 0666":
        env_file.chmod(0o666)
    elif spoil == "file alice's":
        os.chown(env_file, alice(), 0)
    elif spoil == "dir 0777":
        etc.chmod(0o777)
    else:
        etc.chmod(0o1777)
        env_file.chmod(0o646)
    proc = subprocess.run(
        [str(REPO / hook)],
        capture_output=True,
        text=True,
        env={"STUNE_ENV_FILE": str(env_file), "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "3"},
    )
    assert proc.returncode == 0 and not marker.exists(), proc.stderr
    assert f"{env_file}: not sourced: writable by someone other than root" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@as_root
def test_a_root_only_env_file_is_sourced_even_under_a_sticky_tmp(node):
    env_file = node["base"] / "stune.env"  # /tmp/... is 1777: allowed above, as for sshd
    marker = node["base"] / "sourced"
    env_file.write_text(
        f"touch {marker}\n" + "".join(f"{k}={v}\n" for k, v in node["env"].items()) + f"STUNE_BIN={BIN}\n"
    )
    env_file.chmod(0o600)
    proc = subprocess.run(
        [str(REPO / "prolog/10-stune-health")],
        capture_output=True,
        text=True,
        env={"STUNE_ENV_FILE": str(env_file), "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "3"},
    )
    assert proc.returncode == 0 and marker.exists(), proc.stderr
    assert json.loads((node["state"] / "state.json").read_text())["last"]["mode"] == "prolog"


# ---- fastjson: CPython's private _json may change ---------------------------------------------------------------


@pytest.mark.parametrize(
    "patch",
    [
        "_json.make_encoder = lambda *a: (_ for _ in ()).throw(TypeError('make_encoder() takes 10 arguments'))",
        "_json.make_encoder = lambda *a: (lambda obj, level: iter(['[]']))",  # answers, but wrongly
        "del _json.make_encoder; del _json.make_scanner",  # gone
        "_json.make_scanner = lambda ctx: (lambda text, idx: ('x', 1))",  # a scanner that lies
        "import sys; sys.modules['_json'] = None",  # no C accelerator at all
    ],
)
def test_fastjson_falls_back_to_json_when_the_private_api_is_not_as_expected(patch):
    # json is imported first: in a real upgrade json and _json change together, only fastjson's use is stale
    code = f"""
import json
import _json
{patch}
from slurm_tune import fastjson
value = {{"b": [1, 2.5, None, True, "\\u00e9"], "a": {{"nested": [{{}}]}}}}
assert fastjson.dumps(value) == json.dumps(value, sort_keys=True, separators=(",", ":")), fastjson.dumps(value)
assert fastjson.loads(' {{"x": [1, 2]}} ') == {{"x": [1, 2]}}
try:
    fastjson.loads("[1,")
except ValueError:
    pass
else:
    raise AssertionError("bad JSON accepted")
print(fastjson._encode is None, fastjson._scan is None)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    encode_off, scan_off = proc.stdout.split()
    assert encode_off == "True" or "make_scanner" in patch
    assert scan_off == "True" or ("make_encoder" in patch and "make_scanner" not in patch)


def test_the_hooks_still_judge_when_the_private_api_changed(node, tmp_path):
    """The failure mode the issue names: a changed _json must not make every hook 'internal error, exit 0'."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import json, _json\n"  # json and _json change together in an upgrade: only fastjson's call is stale
        "_json.make_encoder = lambda *a: (_ for _ in ()).throw(TypeError('new signature'))\n"
    )
    (node["base"] / "root/sys/class/infiniband/mlx5_2/ports/1/state").write_text("1: DOWN\n")
    proc = health("prolog", env={"PYTHONPATH": str(shim)})
    assert proc.returncode == 0 and "internal error" not in proc.stderr
    assert "mlx5_2/1 state DOWN" in proc.stderr  # judged (not enforced: the node never passed this policy)


# ---- the prolog hook exports the env file as `set -a; . FILE` would ---------------------------------------


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: (
        n not in ("PWD", "OLDPWD", "SHLVL", "_", "IFS", "PS1", "PS2", "PS4", "OPTIND", "PPID", "HOME", "PATH")
    )
)
PLAIN = st.text(alphabet="abcXYZ019/._-%:,=+@", max_size=20)
LINES = st.lists(
    st.one_of(
        st.tuples(NAMES, PLAIN).map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.tuples(NAMES, PLAIN).map(lambda kv: f"export {kv[0]}={kv[1]}"),
        st.tuples(NAMES, st.text(alphabet="abc /%$;|&*", max_size=12).filter(lambda v: "'" not in v)).map(
            lambda kv: f"{kv[0]}='{kv[1]}'"
        ),
        st.tuples(NAMES, PLAIN).map(lambda kv: f'{kv[0]}="{kv[1]}"  # a comment'),
        st.just("# a comment"),
        st.just(""),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(LINES)
def test_the_hook_reads_plain_env_files_exactly_as_sh_sources_them(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("env") / "stune"
    path.write_text("\n".join(lines) + "\n")
    parsed = prologhook.simple_assignments(path.read_text())
    assert parsed is not None
    by_shell = prologhook.shell_assignments(str(path))
    assert {k: by_shell.get(k) for k in parsed} == parsed


def test_an_env_file_a_shell_must_evaluate_goes_through_sh(tmp_path):
    path = tmp_path / "stune"
    path.write_text("BASE=/opt/stune\nSTUNE_BIN=$BASE/bin\nX=`echo hi`\n")
    assert prologhook.simple_assignments(path.read_text()) is None
    got = prologhook.shell_assignments(str(path))
    assert (got["STUNE_BIN"], got["X"]) == ("/opt/stune/bin", "hi")
