"""No import cycle between modules (issue 23). The graph is built from the source, not from what a run
happens to load: every `import`/`from ... import` in slurm_tune/**.py and stune_dev/**.py, at module level
and inside functions alike (a function-level import is a dependency that merely runs later).

An edge A -> B means module A names module B in an import. `from pkg import name` is an edge to the
submodule pkg.name when that is a module, else to pkg itself (its __init__.py). Importing a submodule also
runs its packages' __init__.py files; that is not drawn, or every package would be a circle with its parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slurm_tune", "stune_dev")

# Circles known and not broken yet, each with the change that breaks it (issue 23 broke the last: the adapter
# and its commands, when submit came to build the adapter itself). An entry that is no longer a circle fails
# the test below until it is deleted here, so this list can only shrink.
PENDING: set[frozenset[str]] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (anywhere in its body)."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in files else source)
            for target in targets:
                # `import a.b.c` names a.b.c; fall back to the longest prefix that is one of ours
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    ties = [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]
    return "circle: " + ", ".join(ties)


def test_no_import_cycle_between_modules():
    graph = import_graph()
    new = [c for c in cycles(graph) if c not in PENDING]
    assert not new, "\n".join(_describe(c, graph) for c in new)


def test_every_pending_circle_still_exists():
    """A circle broken elsewhere comes off PENDING, so the list cannot hide a new one."""
    found = set(cycles(import_graph()))
    gone = [sorted(c) for c in PENDING if c not in found]
    assert not gone, f"no longer circles, delete them from PENDING: {gone}"


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import thing\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (pkg / "sub" / "b.py").write_text("import pkg.c\nthing = 1\n")
    (pkg / "c.py").write_text("def g():\n    from . import a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b", "pkg.c"})]
