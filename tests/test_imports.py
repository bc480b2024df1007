"""The hot paths' import rule (docs/speed.md), checked for every hot entry point, and the launchers that
carry the hot commands (bin/, setup.cfg `scripts`).

The rule holds in the hot set, which is computed from the source (hot_set) and checked there statically;
every other module is plain Python. Each entry point also runs its real work in a fresh `python -I -S` with
only this checkout on sys.path (tests/importcheck.py), so the answer is the same under any kind of install.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import os
import stat
import sys
from pathlib import Path

import healthkit as kit
import hwtrees
import pytest
from importcheck import HEAVY, loaded_by
from test_import_graph import import_graph, module_name

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCHERS = REPO / "bin"

# Known breaches of the rule, each with its cost, until the module that causes it is changed. An entry here
# is a measured miss reported in README's Speed table, not a licence.
KNOWN = {
    # collections for namedtuple records: ~0.2x of a bare start (collections itself, then each class)
}


@pytest.fixture
def world(tmp_path):
    """One node and one submission host: a DGX-A100 and a RoCE sysfs tree, GPU snapshot, state and cache
    directories, the repo's profiles, and an `sbatch` stand-in on PATH (what stune imports does not depend
    on which sbatch answers; the cluster tests submit to the real one)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho 4242\n")
    (fake / "sbatch").chmod(0o755)
    hwtrees.h100_roce(tmp_path / "roce")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUNE_", "SLURM"))}
    env.update(
        PATH=f"{fake}:{env.get('PATH', '/usr/bin:/bin')}",
        STUNE_PARTITIONS=str(REPO / "partitions"),
        STUNE_CACHE_DIR=str(tmp_path / "cache"),
        STUNE_HISTORY=str(tmp_path / "history.jsonl"),
        STUNE_SYSFS_ROOT=str(kit.tree(tmp_path / "root", "hdr")),
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
        STUNE_STATE_DIR=str(tmp_path / "state"),
        STUNE_HEALTH_PARTITION="hdr",
        SLURMD_NODENAME="n7",
        STUNE_ENV_FILE="/dev/null",
    )
    return {"env": env, "tmp": tmp_path}


def _taskprolog_env(world):
    return dict(
        world["env"],
        SLURM_JOB_PARTITION="roce",
        SLURM_LOCALID="0",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="n[1-2]",
        SLURMD_NODENAME="n1",
        STUNE_SYSFS_ROOT=str(world["tmp"] / "roce"),
    )


def _filtered_slurm_conf(tmp: Path) -> Path:
    from slurm_tune.clifilter.render import DATA_DIR, DATA_FILE

    etc = tmp / "etc"
    (etc / DATA_DIR).mkdir(parents=True, exist_ok=True)
    (etc / DATA_DIR / DATA_FILE).write_text("return {}\n")
    (etc / "extra.conf").write_text("CliFilterPlugins=cli_filter/lua\n")
    conf = etc / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nInclude extra.conf\nNodeName=n1 CPUs=8 Gres=gpu:4\nPartitionName=roce Nodes=n1 Default=YES\n"
    )
    return conf


SNAPSHOT = REPO / "tests/fixtures/snapshots/dgx-a100-ib.json"
# name: (code that does the entry point's real work, env maker)
ENTRY_POINTS = {
    "prolog hook": (
        f"from slurm_tune.health.prologhook import main\nassert main(None, {str(BIN)!r}) == 0",
        lambda w: w["env"],
    ),
    "stune-health prolog": (
        "from slurm_tune.cli.health import main\nassert main(['prolog']) == 0",
        lambda w: w["env"],
    ),
    "stune-health check": (
        "from slurm_tune.cli.health import main\n"
        f"assert main(['check', '--snapshot', {str(SNAPSHOT)!r}, '--partition', 'hdr']) == 0",
        lambda w: w["env"],
    ),
    "stune-sbatch": (
        "from slurm_tune.cli.sbatch import main\n"
        "assert main(['-p', 'roce', '--parsable', '-H', '--wrap', 'true']) == 0",
        lambda w: w["env"],
    ),
    # a user's tokens are recorded as digests: without hashlib (its OpenSSL load costs ~0.4x of a bare start)
    "stune-sbatch (tokens in the environment)": (
        "from slurm_tune.cli.sbatch import main\n"
        "assert main(['-p', 'roce', '--parsable', '-H', '--wrap', 'true']) == 0",
        lambda w: dict(w["env"], HF_TOKEN="hf_abc", WANDB_API_KEY="0" * 40),
    ),
    "stune-task-prolog": (
        "from slurm_tune.cli.taskprolog import main\nassert main([]) == 0",
        _taskprolog_env,
    ),
    # a plain sbatch job on a node whose slurm.conf (Include followed, records and all) enables stune's
    # cli_filter: the first task reads slurm.conf, which must not load re or the admin's slurm.conf judge
    "stune-task-prolog (a plain job, the cli_filter enabled)": (
        "from slurm_tune.cli.taskprolog import main\nassert main([]) == 0",
        lambda w: dict(_taskprolog_env(w), SLURM_CONF=str(_filtered_slurm_conf(w["tmp"]))),
    ),
    # runs once per rank at job start; --show resolves the binding and runs nothing
    "stune-bind": (
        "from slurm_tune.cli.bind import main\nassert main(['--show', 'true']) == 0",
        lambda w: dict(_taskprolog_env(w), CUDA_VISIBLE_DEVICES="0"),
    ),
}


# The modules whose import starts a hot command (docs/speed.md, "The import rule"). The hot set is what they
# can load: their imports, at module level and in functions alike, followed through stune's modules, except
# into the modules of COLD_BRANCHES. The import rule holds in the hot set; every other module is plain Python.
HOT_ENTRY_MODULES = (
    "slurm_tune.health.prologhook",
    "slurm_tune.cli.health",
    "slurm_tune.cli.sbatch",
    "slurm_tune.cli.taskprolog",
    "slurm_tune.cli.bind",
)
# Modules a hot module imports in a function only on a branch that is not a hot path: the walk does not enter
# them, so they and what only they import are cold (test_every_hot_entry_point_follows_the_import_rule checks
# that no hot command's real work loads a module outside the hot set).
COLD_BRANCHES = {
    "slurm_tune.health.apply": "`stune-health run`, the periodic full run, applies its verdict to Slurm",
    "slurm_tune.hw.nvml": "`stune-health snapshot` reads the GPUs through NVML; the prolog makes no NVML call",
    "slurm_tune.profilecheck": "a profile cache miss validates the profile (yaml and the schema)",
    "slurm_tune.admin.slurmconf": "judging slurm.conf for install and doctor (the reader is slurmfile.py)",
    "slurm_tune.slurm.adapter": "Slurm's queries: a submission that asks Slurm something, `stune-health drain`",
    "slurm_tune.slurm.records": "the queries' records, loaded at first use (test_slurm_adapter)",
    "slurm_tune.slurm.associations": "the association tree, loaded at first use (test_slurm_adapter)",
    "slurm_tune.slurm.version": "Slurm's release, read at the first query (test_slurm_adapter)",
    "slurm_tune.stage.tier": "a task that stages data: the time is in the copy (docs/speed.md, Staging)",
    "slurm_tune.stage.stager": "a task that stages data: the time is in the copy (docs/speed.md, Staging)",
    "slurm_tune.sbatch.historyview": "`stune-sbatch history`: the history file, sacct's records, the bottleneck",
    "slurm_tune.health.ladder": "`stune-health run` with remediation.enabled: the remediation ladder's steps",
    "slurm_tune.cli.health_incidents": "`stune-health incidents` and `xids`: read commands, not hooks",
    "slurm_tune.cli.reliability": "`stune-health lemons` and `reliability`: fleet-wide reports from sacct",
    "slurm_tune.nodeenv.ascendenv": "an Ascend partition's task: its NPUs and rank table, once per job and node",
    "slurm_tune.nodeenv.ranktable": "an Ascend partition's rank tables: the periodic run publishes, a task builds",
}


def _module_level(body: list[ast.stmt]):
    """The import statements that run when a module is imported: not those in functions, nor under
    `if TYPE_CHECKING:` (annotations only)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from _module_level(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _module_level(inner)


def module_level_imports(root: Path = REPO) -> dict[str, set[str]]:
    """stune module -> what it imports at module level: stune modules by full name (with the packages whose
    __init__.py that runs), anything else by its top-level name."""
    files = {module_name(p, root): p for p in sorted((root / "slurm_tune").rglob("*.py"))}
    found: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                sources = [alias.name for alias in node.names]
            elif node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
                sources = [source] + [f"{source}.{alias.name}" for alias in node.names]
            else:
                source = node.module or ""
                sources = [source] + [f"{source}.{alias.name}" for alias in node.names]
            for source in sources:
                if source == "__future__":
                    continue
                if not source.startswith("slurm_tune"):
                    targets.add(source.split(".")[0])
                    continue
                parts = source.split(".")
                # every package on the way runs its __init__.py; `from pkg import name` names a module or not
                targets.update(
                    p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in files
                )
        targets.discard(name)
        found[name] = targets
    return found


def hot_set(entries: tuple[str, ...] = HOT_ENTRY_MODULES, root: Path = REPO, lazy: bool = True) -> set[str]:
    """The stune modules the entry modules can load: their imports (with `lazy`, function-level ones too, but
    not into COLD_BRANCHES; without, what importing them loads), transitively, with their packages."""
    imports = module_level_imports(root)
    graph = import_graph(root, ("slurm_tune",)) if lazy else imports
    hot: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in hot or name not in imports:
            continue
        hot.add(name)
        todo.extend(imports[name])  # module level: includes the packages on the way
        todo.extend(t for t in graph[name] if t not in COLD_BRANCHES)
        todo.extend(name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1))
    return hot


def test_no_module_in_the_hot_set_imports_a_heavy_module_at_module_level():
    """The import rule checked from the source: it holds in the hot set, and only there (a cold module imports
    at module level what it likes)."""
    imports = module_level_imports()
    hot = hot_set()
    assert set(HOT_ENTRY_MODULES) <= hot and {"slurm_tune.fastjson", "slurm_tune.health.node"} <= hot
    assert not hot & set(COLD_BRANCHES) and "slurm_tune.cli.fairshare" not in hot
    breaches = {name: sorted(imports[name] & HEAVY) for name in sorted(hot) if imports[name] & HEAVY}
    assert not breaches, f"hot modules import heavy ones at module level (docs/speed.md): {breaches}"
    assert not hot & HEAVY, f"heavy stune modules in the hot set: {sorted(hot & HEAVY)}"


def test_the_hot_set_sees_packages_relative_imports_and_skips_functions(tmp_path):
    pkg = tmp_path / "slurm_tune"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import os\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import c\nif TYPE_CHECKING:\n    import json\n")
    (pkg / "c.py").write_text(
        "try:\n    import re\nexcept ImportError:\n    pass\ndef f():\n    import yaml\n"
    )
    imports = module_level_imports(tmp_path)
    assert imports["slurm_tune.sub.b"] == {"slurm_tune", "slurm_tune.c"}
    assert imports["slurm_tune.c"] == {"re"}
    assert imports["slurm_tune"] == {"os"}
    everything = {"slurm_tune", "slurm_tune.sub", "slurm_tune.sub.b", "slurm_tune.c"}
    assert hot_set(("slurm_tune.sub.b",), tmp_path) == everything


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_hot_entry_point_follows_the_import_rule(world, name):
    code, make_env = ENTRY_POINTS[name]
    env = make_env(world)
    loaded_by(code, env)  # the first run fills the profile cache, as every run after a node's first finds it
    loaded = loaded_by(code, env)
    assert any(m.startswith("slurm_tune.") for m in loaded), "the entry point did not run"
    # the walk over the source agrees with the run: importing the entry module loads what it finds at module
    # level, and the run's real work loads nothing outside the hot set
    entry = code.split()[1]  # `from MODULE import main`
    imported = hot_set((entry,), lazy=False)
    assert imported <= loaded, f"hot_set() names modules the run did not load: {sorted(imported - loaded)}"
    outside = {m for m in loaded if m.startswith("slurm_tune")} - hot_set()
    assert not outside, f"{name} loads modules outside the hot set (COLD_BRANCHES?): {sorted(outside)}"
    breaches = (loaded & HEAVY) - KNOWN.get(name, set())
    assert not breaches, (
        f"{name} imports {sorted(breaches)}: import them where they are needed (docs/speed.md)"
    )
    stale = KNOWN.get(name, set()) - loaded
    assert not stale, f"{name} no longer imports {sorted(stale)}: remove it from KNOWN"


def test_the_prolog_makes_no_slurm_call_nor_nvml_and_the_hook_skips_the_cli_layer(world):
    hook = loaded_by(ENTRY_POINTS["prolog hook"][0], world["env"])
    assert "slurm_tune.health.node" in hook and "slurm_tune.cli.health" not in hook
    cli = loaded_by(ENTRY_POINTS["stune-health prolog"][0], world["env"])
    assert not (hook | cli) & {"slurm_tune.slurm", "slurm_tune.hw.nvml"}


def test_judging_a_snapshot_loads_no_hook_no_slurm_and_no_nvml_code(world):
    check = loaded_by(ENTRY_POINTS["stune-health check"][0], world["env"])
    assert {"slurm_tune.health.offline", "slurm_tune.health.judge"} <= check
    assert not check & {
        "slurm_tune.health.node",
        "slurm_tune.health.prologhook",
        "slurm_tune.health.collect",
        "slurm_tune.slurm",
        "slurm_tune.hw.nvml",
    }


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def test_each_hot_command_ships_as_a_launcher_pip_points_at_its_interpreter():
    cfg = _setup_cfg()
    scripts = cfg["options"]["scripts"].split()
    console = {
        line.split("=")[0].strip()
        for line in cfg["options.entry_points"]["console_scripts"].splitlines()
        if line.strip()
    }
    assert sorted(scripts) == sorted(f"bin/{p.name}" for p in LAUNCHERS.iterdir())
    tested = {name.split()[0] for name in ENTRY_POINTS if name.startswith("stune-")}
    for script in scripts:
        path = REPO / script
        name = path.name
        assert name not in console, (
            f"{name} is both a launcher and a console script: pip would write one over the other"
        )
        assert path.stat().st_mode & stat.S_IXUSR
        lines = path.read_text().splitlines()
        # `#!python` exactly: setuptools and pip replace it with the installing interpreter (and drop any flags)
        assert lines[0] == "#!python"
        code = [line for line in lines[1:] if line and not line.startswith("#")]
        module = code[-2].split()[1]
        # the template: nothing between the interpreter's start and the command (no code cache: issue 23)
        assert code == ["import sys", f"from {module} import main", "sys.exit(main())"], (
            f"{script}: not the template"
        )
        assert name in tested, f"{name}: a hot command without an entry in ENTRY_POINTS"
        assert callable(importlib.import_module(module).main)
