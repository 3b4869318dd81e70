"""Imports flow one way: no module imports a higher layer (``dsa_tvm/layering.py``),
and no group of modules or packages imports itself in a cycle.

Every ``import`` statement counts, at module level or inside a function (an import
deferred into a function still runs against the order). ``python
tests/test_import_order.py`` prints the cycles, the upward imports and the count of
function-level imports.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsa_tvm.layering import LAYERS, PACKAGES, layer_of  # noqa: E402

#: Upward imports or cycles left on purpose: (importer, imported) -> reason. Empty is the goal.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = "function-level" if self.in_function else "module-level"
        return f"{self.importer}:{self.line} -> {self.imported} ({where})"


@functools.cache
def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(modules: dict[str, Path], name: str) -> str | None:
    """The project module ``name`` names, or the closest package above it, or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """(import node, inside a function) for every import that runs (not TYPE_CHECKING ones)."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    yield from walk(sub, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            yield from walk(child, inner)
    yield from walk(tree, False)


def import_edges() -> list[Edge]:
    """Every import of a project module by a project module."""
    modules = _modules()
    edges, seen = [], set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if _is_package(path) else module.rpartition(".")[0]
        for node, in_function in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(modules, target)
                edge = Edge(module, resolved or "", node.lineno, in_function)
                if resolved is not None and resolved != module and edge not in seen:
                    seen.add(edge)
                    edges.append(edge)
    return edges


def _sccs(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def _room_of(module: str) -> str:
    """The package a module lives in, split by layer (top-level dsa_tvm modules span layers)."""
    path = _modules()[module]
    package = module if _is_package(path) else module.rpartition(".")[0]
    return f"{package}[{LAYERS[layer_of(module)][0]}]"


def cycles(edges: list[Edge], package_level: bool) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if (edge.importer, edge.imported) in ALLOWED:
            continue
        a, b = edge.importer, edge.imported
        if package_level:
            a, b = _room_of(a), _room_of(b)
        if a != b:
            graph.setdefault(a, set()).add(b)
    nodes = sorted(set(graph) | {n for targets in graph.values() for n in targets})
    return _sccs(nodes, graph)


def load_cycles(edges: list[Edge]) -> list[list[str]]:
    """Cycles among the imports that run when a module is first loaded (module level),
    counting that ``import a.b.c`` from outside package ``a`` first runs ``a/__init__.py``
    and ``a/b/__init__.py``: ``dsa_tvm/__init__.py`` imports the whole API, so a lower
    package importing ``dsa_tvm.x`` at module level must not be imported by that API at
    module level (``import relay_passes`` first would find itself half loaded)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.in_function:
            continue
        targets = {edge.imported}
        parts = edge.imported.split(".")
        for n in range(1, len(parts)):
            ancestor = ".".join(parts[:n])
            if ancestor in modules and not edge.importer.startswith(ancestor + "."):
                targets.add(ancestor)
        graph.setdefault(edge.importer, set()).update(targets - {edge.importer})
    nodes = sorted(set(graph) | {n for targets in graph.values() for n in targets})
    return _sccs(nodes, graph)


def upward(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if layer_of(e.imported) > layer_of(e.importer)
            and (e.importer, e.imported) not in ALLOWED]


def summary(edges: list[Edge]) -> str:
    module_cycles, package_cycles = cycles(edges, False), cycles(edges, True)
    up = upward(edges)
    loading = load_cycles(edges)
    statements = {(e.importer, e.line) for e in edges}
    deferred = {(e.importer, e.line) for e in edges if e.in_function}
    in_modules = len({m for m, _ in deferred})
    lines = [f"{len(module_cycles)} module cycles, {len(package_cycles)} package cycles, "
             f"{len(up)} upward imports, {len(loading)} load-time cycles; {len(deferred)} of "
             f"{len(statements)} project import statements are function-level, in {in_modules} modules"]
    lines += ["module cycle: " + " <-> ".join(c) for c in module_cycles]
    lines += ["package cycle: " + " <-> ".join(c) for c in package_cycles]
    lines += ["load-time cycle: " + " <-> ".join(c) for c in loading]
    names = [name for name, _ in LAYERS]
    lines += [f"upward: {e}  [{names[layer_of(e.importer)]} < {names[layer_of(e.imported)]}]"
              for e in up]
    return "\n".join(lines)


def test_every_module_has_a_layer():
    for module in _modules():
        layer_of(module)


def test_no_upward_import():
    edges = import_edges()
    assert not upward(edges), summary(edges)


def test_no_import_cycle():
    edges = import_edges()
    assert not cycles(edges, False) and not cycles(edges, True), summary(edges)


def test_no_load_time_cycle():
    edges = import_edges()
    assert not load_cycles(edges), summary(edges)


def test_lower_packages_import_first():
    """A fresh interpreter imports a lower package before dsa_tvm (load_cycles cannot see
    imports inside functions that ``dsa_tvm/__init__.py`` calls, such as ``setup``)."""
    first = ("relay_passes", "relay_passes.kinds", "tir_schedules.nests",
             "tir_schedules.kinds")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = [subprocess.Popen([sys.executable, "-c", f"import {m}"], env=env, cwd=ROOT,
                             stderr=subprocess.PIPE, text=True) for m in first]
    failed = {m: r.communicate(timeout=300)[1].strip().splitlines()[-1:]
              for m, r in zip(first, runs) if r.wait() != 0}
    assert not failed, f"importing these first fails: {failed}"


def test_allowed_exceptions_still_exist():
    present = {(e.importer, e.imported) for e in import_edges()}
    assert not set(ALLOWED) - present, "ALLOWED names imports that are gone: drop them"


if __name__ == "__main__":
    print(summary(import_edges()))
