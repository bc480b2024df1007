"""The hot launchers' code cache (slurm_tune/codecache.py): served only while current, rewritten when not,
never a traceback for a bad file, and never loaded by root from a file someone else could have written.

Each test runs a fresh interpreter against a copy of the package (so a test can edit a source) with its own
cache directory.
"""
from __future__ import annotations

import json
import marshal
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune import codecache, codecache_writer

REPO = Path(__file__).resolve().parent.parent
MODULES = ["slurm_tune.sbatch.options", "slurm_tune.sbatch.history", "slurm_tune.slurm"]
DRIVER = """
import json, sys
sys.path.insert(0, {root!r})
from slurm_tune.codecache import CodeCache, save_installed
CodeCache.install("test")
import {modules}
mods = {mods!r}
print(json.dumps({{"loaders": {{m: type(sys.modules[m].__loader__).__name__ for m in mods}},
                  "files": {{m: [sys.modules[m].__file__, sys.modules[m].__cached__] for m in mods}},
                  "mark": getattr(sys.modules[mods[0]], "MARK", None)}}))
save_installed()
"""


@pytest.fixture
def pkg(tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(REPO / "slurm_tune", root / "slurm_tune", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    return {"root": root, "cache": cache, "env": _env(cache)}


def _env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUNE_", "PYTHON"))}
    return dict(env, STUNE_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")


def run(pkg, modules=MODULES, user: str | None = None) -> dict:
    code = DRIVER.format(root=str(pkg["root"]), modules=", ".join(modules), mods=modules)
    argv = [sys.executable, "-I", "-S", "-c", code]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=pkg["env"], timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def cache_file(pkg) -> Path:
    files = list(pkg["cache"].glob("code-test*.marshal"))
    assert len(files) == 1, files
    return files[0]


def served(result: dict) -> set[str]:
    return {m for m, loader in result["loaders"].items() if loader == "CodeCache"}


def test_the_second_run_imports_from_the_cache_and_rewrites_nothing(pkg):
    assert served(run(pkg)) == set()
    path = cache_file(pkg)
    form, magic, package_dir, table = codecache.unpack(path.read_bytes())
    assert package_dir == str(pkg["root"] / "slurm_tune") and set(MODULES) <= set(table)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    stamp = path.stat().st_mtime_ns
    assert served(run(pkg)) == set(MODULES)
    assert served(run(pkg)) == set(MODULES)
    assert path.stat().st_mtime_ns == stamp, "a run that found everything rewrote the cache"


def test_served_modules_have_the_path_loaders_file_and_cached(pkg):
    first = run(pkg)
    second = run(pkg)
    assert served(second) == set(MODULES) and second["files"] == first["files"]
    assert second["files"]["slurm_tune.slurm"][1].endswith(f"/__pycache__/__init__.{sys.implementation.cache_tag}.pyc")


def test_asking_for_a_stune_module_that_does_not_exist_rewrites_nothing(pkg):
    """A miss of a name no source has: the file is checked against what was imported, and stays as it was."""
    modules = MODULES + ["slurm_tune.sbatch.dryrun"]
    run(pkg, modules)
    stamp = cache_file(pkg).stat().st_mtime_ns
    code = DRIVER.format(root=str(pkg["root"]), modules=", ".join(modules), mods=modules).replace(
        "save_installed()", "try:\n    import slurm_tune.no_such_module\nexcept ImportError:\n    pass\nsave_installed()")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, env=pkg["env"])
    assert proc.returncode == 0, proc.stderr
    assert served(json.loads(proc.stdout)) == set(modules)
    assert cache_file(pkg).stat().st_mtime_ns == stamp


def test_runs_that_take_different_paths_share_the_file(pkg):
    run(pkg, MODULES + ["slurm_tune.sbatch.dryrun"])
    stamp = cache_file(pkg).stat().st_mtime_ns
    assert served(run(pkg)) == set(MODULES)  # a run without the dry run's module
    assert served(run(pkg, MODULES + ["slurm_tune.sbatch.dryrun"])) == set(MODULES) | {"slurm_tune.sbatch.dryrun"}
    assert cache_file(pkg).stat().st_mtime_ns == stamp, "the runs rewrote the file in turn"
    run(pkg, MODULES + ["slurm_tune.nodestate"])  # one more path: added, the others kept
    _, _, _, table = codecache.unpack(cache_file(pkg).read_bytes())
    assert {"slurm_tune.sbatch.dryrun", "slurm_tune.nodestate"} <= set(table)


def test_only_stune_and_future_are_cached(pkg):
    run(pkg, MODULES + ["json", "slurm_tune.safeio"])
    _, _, _, table = codecache.unpack(cache_file(pkg).read_bytes())
    assert not {"json", "json.decoder", "re"} & set(table)
    assert "__future__" in table and "slurm_tune.safeio" in table
    # the launcher imports trust.py by the path search (root judges the file with it): never served; the
    # writer is no command's module
    assert "slurm_tune.trust" not in table and "slurm_tune.codecache_writer" not in table


@pytest.mark.parametrize("edit", ["longer", "same size, newer"])
def test_an_edited_source_runs_fresh_and_the_cache_follows(pkg, edit):
    run(pkg)
    source = pkg["root"] / "slurm_tune/sbatch/options.py"
    text = source.read_text()
    if edit == "longer":
        source.write_text(text + "\nMARK = 'edited'\n")
    else:  # the same length: a top-level comment line becomes the assignment; only the mtime tells
        lines = text.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.startswith("#") and len(line) > 20)
        head = "MARK = 'edited'  #"
        lines[at] = head + lines[at][len(head):]
        source.write_text("".join(lines))
        assert source.stat().st_size == len(text.encode())
        stat = source.stat()
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    first = run(pkg)
    assert first["mark"] == "edited" and "slurm_tune.sbatch.options" not in served(first)
    second = run(pkg)  # the file was rewritten with the fresh code
    assert second["mark"] == "edited" and served(second) == set(MODULES)


def _rewrite(path: Path, change) -> None:
    path.write_bytes(codecache_writer.pack(*change(*codecache.unpack(path.read_bytes()))))


@pytest.mark.parametrize("damage", ["truncated", "truncated header", "garbage", "empty", "other python", "other format",
                                    "other install", "not a table", "damaged entry", "malformed entry"])
def test_a_damaged_or_foreign_file_falls_back_to_the_normal_import(pkg, damage):
    run(pkg)
    path = cache_file(pkg)
    data = path.read_bytes()
    if damage == "truncated":  # the entries that lie beyond the end are left out
        path.write_bytes(data[: len(data) // 2])
    elif damage == "truncated header":
        path.write_bytes(data[:40])
    elif damage == "garbage":
        path.write_bytes(b"\xff\x00garbage" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other python":
        _rewrite(path, lambda f, m, p, t: (f, b"\x00\x00\r\n", p, t))
    elif damage == "other format":
        _rewrite(path, lambda f, m, p, t: (f + 1, m, p, t))
    elif damage == "other install":
        _rewrite(path, lambda f, m, p, t: (f, m, "/elsewhere/slurm_tune", t))
    elif damage == "not a table":
        path.write_bytes(len(marshal.dumps((1, 2, 3, [1, 2]))).to_bytes(4, "little") + marshal.dumps((1, 2, 3, [1, 2])))
    elif damage == "damaged entry":  # the file reads, one module's code does not: compiled from its source
        _rewrite(path, lambda f, m, p, t: (f, m, p, dict(t, **{MODULES[0]: t[MODULES[0]][:4] + (b"\xff\x01",) + t[MODULES[0]][5:]})))
    elif damage == "malformed entry":
        header = marshal.dumps((codecache.FORMAT, codecache.MAGIC, str(pkg["root"] / "slurm_tune"),
                                {MODULES[0]: ("x", 1), MODULES[1]: ("x", True, 1, 1, 0, 1, None)}))
        path.write_bytes(len(header).to_bytes(4, "little") + header)
    result = run(pkg)
    if damage not in ("damaged entry", "truncated"):
        assert served(result) == set()
    assert served(run(pkg)) == set(MODULES), "the damaged file was not replaced"


def test_a_removed_source_falls_back(pkg):
    run(pkg)
    (pkg["root"] / "slurm_tune/sbatch/history.py").unlink()
    code = DRIVER.format(root=str(pkg["root"]), modules="slurm_tune.sbatch.history", mods=["x"])
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          env=pkg["env"], timeout=60)
    assert "ModuleNotFoundError" in proc.stderr  # the normal import's answer, not stale code


def test_tracebacks_show_the_source(pkg):
    run(pkg)
    code = (f"import sys\nsys.path.insert(0, {str(pkg['root'])!r})\nfrom slurm_tune.codecache import CodeCache\n"
            "CodeCache.install('test')\nimport slurm_tune.sbatch.options as o, traceback\n"
            "assert type(o.__loader__).__name__ == 'CodeCache'\n"
            "try:\n    o.parse_args(None)\nexcept TypeError:\n    traceback.print_exc()\n")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          env=pkg["env"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "sbatch/options.py" in proc.stderr and "def parse_args" not in proc.stderr
    assert any(line.startswith("    ") for line in proc.stderr.splitlines()[1:]), proc.stderr  # source lines


# ---- trust ---------------------------------------------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="root's rules (and a second user) need root")


def _uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


@root_only
@pytest.mark.parametrize("plant", ["writable by others", "writable by group", "owned by a user",
                                   "directory owned by a user", "hard link", "symbolic link"])
def test_root_neither_loads_nor_writes_a_cache_someone_else_could_write(pkg, plant, tmp_path):
    run(pkg)
    path = cache_file(pkg)
    if plant == "writable by others":
        path.chmod(0o606)
    elif plant == "writable by group":
        path.chmod(0o660)
    elif plant == "owned by a user":
        os.chown(path, _uid("stune-alice"), -1)
    elif plant == "directory owned by a user":
        os.chown(pkg["cache"], _uid("stune-alice"), -1)
    elif plant == "hard link":
        os.link(path, tmp_path / "elsewhere")
    elif plant == "symbolic link":
        real = tmp_path / "real.marshal"
        shutil.move(path, real)
        path.symlink_to(real)
        target = (real.stat().st_mtime_ns, real.read_bytes())
    before = path.lstat()
    assert served(run(pkg)) == set()
    if plant == "symbolic link":  # not followed: replaced by a file of root's own, the target untouched
        assert (real.stat().st_mtime_ns, real.read_bytes()) == target
        assert not path.is_symlink() and served(run(pkg)) == set(MODULES)
        return
    after = path.lstat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "root wrote it"


@pytest.fixture
def shared_pkg():
    """pkg, in a directory a second user can read (pytest's tmp_path is root's alone)."""
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="stune-codecache-"))
    try:
        shared.chmod(0o755)
        shutil.copytree(REPO / "slurm_tune", shared / "slurm_tune", ignore=shutil.ignore_patterns("__pycache__"))
        cache = shared / "cache"
        yield {"root": shared, "cache": cache, "env": _env(cache)}
    finally:
        shutil.rmtree(shared)


@root_only
def test_a_user_loads_only_their_own_cache(shared_pkg):
    pkg, alice = shared_pkg, _uid("stune-alice")
    run(pkg)  # root's file
    os.chown(pkg["cache"], alice, -1)
    assert served(run(pkg, user="stune-alice")) == set()  # not alice's: not loaded
    cache_file(pkg).unlink()
    run(pkg, user="stune-alice")
    assert cache_file(pkg).stat().st_uid == alice
    assert served(run(pkg, user="stune-alice")) == set(MODULES)


# ---- the launcher ----------------------------------------------------------------------------------------------

def test_the_stune_sbatch_launcher_uses_and_keeps_the_cache(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho 4242\n")
    (fake / "sbatch").chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(_env(cache), PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}", PYTHONPATH=str(REPO),
               STUNE_PARTITIONS=str(REPO / "partitions"), STUNE_HISTORY=str(tmp_path / "history.jsonl"),
               STUNE_ENV_FILE="/dev/null")
    argv = [sys.executable, str(REPO / "bin/stune-sbatch"), "-p", "roce", "--parsable", "-H", "--wrap", "true"]
    stamps = []
    for _ in range(3):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "4242", proc.stderr
        (path,) = cache.glob("code-stune-sbatch*.marshal")
        stamps.append(path.stat().st_mtime_ns)
    _, _, package_dir, table = codecache.unpack(path.read_bytes())
    assert package_dir == str(REPO / "slurm_tune")
    assert {"slurm_tune.sbatch.submit", "slurm_tune.sbatch.plan", "slurm_tune.sbatch.history"} <= set(table)
    assert stamps[1] == stamps[2], "the third run found a module missing from the second run's file"
    assert len(json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])["sbatch"]) > 0


# ---- stune-health's launcher: the verdict never depends on the cache -----------------------------------------

SNAPSHOT = REPO / "tests/fixtures/snapshots/dgx-a100-ib.json"
HEALTH_MODULES = {"slurm_tune.cli.health", "slurm_tune.health.offline", "slurm_tune.health.judge",
                  "slurm_tune.health.ib", "slurm_tune.health.gpu", "slurm_tune.hw.snapshot"}


def failing_snapshot(tmp_path: Path) -> Path:
    doc = json.loads(SNAPSHOT.read_text())
    doc["ib"]["devices"]["mlx5_0"]["ports"]["1"]["state"] = "1: DOWN"
    path = tmp_path / "down.json"
    path.write_text(json.dumps(doc))
    return path


def health(pkg, *args: str, verbose_imports: bool = False, user: str | None = None) -> tuple[int, str, dict]:
    """(exit status, stdout, {stune module: its loader's class}) of the stune-health launcher over pkg's copy of
    the package; the loaders are read off the interpreter's own import log (-v)."""
    env = dict(pkg["env"], PYTHONPATH=str(pkg["root"]), STUNE_PARTITIONS=str(REPO / "partitions"),
               STUNE_ENV_FILE="/dev/null", **({"PYTHONVERBOSE": "1"} if verbose_imports else {}))
    argv = [sys.executable, str(REPO / "bin/stune-health"), *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    loaders = {}
    for line in proc.stderr.splitlines():  # import 'slurm_tune.health.ib' # <slurm_tune.codecache.CodeCache ...>
        if line.startswith("import 'slurm_tune"):
            name, _, loader = line[len("import '"):].partition("' # <")
            loaders[name] = loader.split()[0].rpartition(".")[2]
    return proc.returncode, proc.stdout, loaders


def health_cache(pkg) -> Path:
    (path,) = pkg["cache"].glob("code-stune-health*.marshal")
    return path


def test_the_stune_health_launcher_uses_and_keeps_the_cache(pkg, tmp_path):
    check = ("check", "--snapshot", str(SNAPSHOT), "--partition", "hdr", "-v")
    first = health(pkg, *check)
    assert first[0] == 0 and "OK" in first[1].splitlines()[0]
    stamps = [health_cache(pkg).stat().st_mtime_ns]
    rc, out, loaders = health(pkg, *check, verbose_imports=True)
    assert (rc, out) == first[:2]
    assert {m for m, loader in loaders.items() if loader == "CodeCache"} >= HEALTH_MODULES, loaders
    stamps.append(health_cache(pkg).stat().st_mtime_ns)
    assert stamps[0] == stamps[1], "a run that found every module rewrote the file"
    _, _, package_dir, table = codecache.unpack(health_cache(pkg).read_bytes())
    assert package_dir == str(pkg["root"] / "slurm_tune") and HEALTH_MODULES <= set(table)
    # a judged failure keeps its exit status through the launcher's exit (run_console)
    rc, out, _ = health(pkg, "check", "--snapshot", str(failing_snapshot(tmp_path)), "--partition", "hdr")
    assert rc == 6 and out.startswith("gpu-a017 (hdr, policy ") and ": FAIL - " in out.splitlines()[0]


def test_the_stune_health_hooks_save_the_cache_and_keep_their_exit_rule(pkg, tmp_path):
    """A hook's error (here no profile at all) exits 0 through the launcher, and its modules are cached."""
    pkg["env"].update(STUNE_STATE_DIR=str(tmp_path / "state"), STUNE_SYSFS_ROOT=str(tmp_path / "nothing"),
                      STUNE_HEALTH_PARTITION="no-such-partition", SLURMD_NODENAME="n1")
    for _ in range(2):
        rc, _, _ = health(pkg, "prolog")
        assert rc == 0
    _, _, _, table = codecache.unpack(health_cache(pkg).read_bytes())
    assert {"slurm_tune.cli.health", "slurm_tune.health.node"} <= set(table)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stale source", "poisoned entry", "writable by others"])
def test_stune_health_judges_alike_whatever_its_cache_file_holds(pkg, tmp_path, damage):
    """A damaged, stale or foreign cache file falls back to the normal import, silently: same verdict, same
    output, same exit status; the file is replaced unless someone else could have written it."""
    failing = str(failing_snapshot(tmp_path))
    check = ("check", "--snapshot", failing, "--partition", "hdr", "-v")
    reference = health(pkg, *check)
    assert reference[0] == 6
    path = health_cache(pkg)
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x00\xff" * 5000)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif damage == "stale source":  # the judging code changed after the file was written: the source's verdict
        source = pkg["root"] / "slurm_tune/health/result.py"
        source.write_text(source.read_text().replace('f"{self.status:8s} ', 'f"[{self.status}] '))
    elif damage == "poisoned entry":  # the file reads, one judging module's code does not
        ib = "slurm_tune.health.ib"
        _rewrite(path, lambda f, m, p, t: (f, m, p, dict(t, **{ib: t[ib][:4] + (b"\xe3garbage",) + t[ib][5:]})))
    elif damage == "writable by others":
        path.chmod(0o606)
    before = path.stat()
    rc, out, loaders = health(pkg, *check, verbose_imports=True)
    assert "Traceback" not in out and rc == 6
    if damage == "stale source":
        assert out == reference[1].replace("fail     ", "[fail] ").replace("ok       ", "[ok] ")
        assert loaders["slurm_tune.health.result"] != "CodeCache"
    else:
        assert out == reference[1]
    after = path.stat()
    if damage == "writable by others":  # neither loaded nor replaced
        assert "CodeCache" not in loaders.values()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    else:
        assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns), "not replaced"
        rc, again, loaders = health(pkg, *check, verbose_imports=True)
        assert (rc, again) == (6, out) and loaders["slurm_tune.health.ib"] == "CodeCache"


@root_only
def test_a_user_judging_a_snapshot_keeps_a_cache_of_their_own_and_never_loads_roots(shared_pkg):
    pkg, alice = shared_pkg, _uid("stune-alice")
    check = ("check", "--snapshot", str(SNAPSHOT), "--partition", "hdr")
    reference = health(pkg, *check)  # root's file, in a directory then handed to alice
    os.chown(pkg["cache"], alice, -1)
    rc, out, loaders = health(pkg, *check, verbose_imports=True, user="stune-alice")
    assert (rc, out) == reference[:2] and "CodeCache" not in loaders.values()  # root's: not loaded
    assert health_cache(pkg).stat().st_uid == alice  # replaced by her own, in her directory
    rc, out, loaders = health(pkg, *check, verbose_imports=True, user="stune-alice")
    assert (rc, out) == reference[:2] and loaders["slurm_tune.health.judge"] == "CodeCache"


# ---- the prolog hook as Slurm runs it: stune found through STUNE_BIN/../lib, its modules from the cache -------

def test_the_prolog_hook_serves_its_modules_from_the_cache_of_an_installed_stune(tmp_path):
    """A wheel's layout (bin/ beside lib/pythonX.Y/site-packages): the hook reaches stune through
    `STUNE_BIN/../lib`, installs the code cache in the env file's STUNE_CACHE_DIR, and a second job's hook
    imports its modules from it, with the same exit status and message."""
    venv = tmp_path / "venv"
    site = venv / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    shutil.copytree(REPO / "slurm_tune", site / "slurm_tune", ignore=shutil.ignore_patterns("__pycache__"))
    (venv / "bin").mkdir()
    cache = tmp_path / "cache"
    env_file = tmp_path / "stune.env"
    env_file.write_text(f"STUNE_BIN={venv / 'bin'}\nSTUNE_CACHE_DIR={cache}\nSTUNE_PARTITIONS={REPO / 'partitions'}\n"
                        f"STUNE_STATE_DIR={tmp_path / 'state'}\nSTUNE_SYSFS_ROOT={tmp_path / 'nothing'}\n"
                        "STUNE_HEALTH_PARTITION=no-such-partition\n")
    hook_env = {"STUNE_ENV_FILE": str(env_file), "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1",
                "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "PYTHONDONTWRITEBYTECODE": "1"}

    def hook():
        proc = subprocess.run(["/usr/bin/python3", "-v", "-I", "-S", str(REPO / "prolog/10-stune-health")],
                              capture_output=True, text=True, env=hook_env, timeout=60)
        lines = proc.stderr.splitlines()
        loaders = {line.split("'")[1]: line.rpartition(" # <")[2].split()[0].rpartition(".")[2]
                   for line in lines if line.startswith("import 'slurm_tune")}
        return proc.returncode, [line for line in lines if line.startswith(("10-stune-health", "stune-health"))], loaders

    first = hook()
    assert first[0] == 0 and any("no-such-partition" in line for line in first[1]), first[1]
    (path,) = cache.glob("code-prolog-hook*.marshal")
    stamp = path.stat().st_mtime_ns
    rc, messages, loaders = hook()
    assert (rc, messages) == first[:2]
    assert loaders["slurm_tune.health.node"] == loaders["slurm_tune.health.prologhook"] == "CodeCache", loaders
    assert loaders["slurm_tune.codecache"] != "CodeCache"  # the launcher's own, by the path search
    assert path.stat().st_mtime_ns == stamp, "a hook that found every module rewrote the file"
