"""No import cycles in src/memtrace (issue 24): the module import graph, read with ``ast``, is acyclic.

What counts as an edge, and why:

* every ``import``/``from ... import`` of a memtrace module, at module level, under
  ``if TYPE_CHECKING:`` and inside functions alike.  A function-level import is the usual way a
  cycle is papered over (it defers the failure, not the dependency: neither module can be read,
  tested or replaced without the other), and a TYPE_CHECKING import is a dependency mypy follows
  (capture_loop <-> children was one).  Lazy imports of heavy third-party modules (frida,
  pymobiledevice3) are not edges: only memtrace's own modules are nodes.
* importing ``memtrace.a.b`` runs ``memtrace/a/__init__.py`` first, so it is an edge to
  ``memtrace.a`` too (the root package, which only holds ``__version__``, excepted).
"""

from __future__ import annotations

import ast
from pathlib import Path

import memtrace

ROOT = Path(memtrace.__file__).parent


def module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The memtrace modules ``name`` imports (anywhere in it), with their parent packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            wanted = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in wanted:
            while target and target not in modules:        # `from pkg import name`: name is no module
                target = target.rpartition(".")[0]
            while target and target != "memtrace":
                if target != name and not name.startswith(target + "."):
                    targets.add(target)
                target = target.rpartition(".")[0]
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
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
                        found.append(sorted(component))
    return found


def test_the_graph_is_read() -> None:
    """The walk finds the imports it is meant to (a graph of no edges would pass the next test)."""
    graph = import_graph()
    assert "memtrace.capture" in graph["memtrace.capture_loop"]
    assert "memtrace.frida_host" in graph["memtrace.capture_loop"]       # function-level, counted
    assert "memtrace.symbols" in graph["memtrace.analyze.symbols"]       # a parent package, counted
    assert "memtrace.tracers" in graph["memtrace.tracers.malloc"] or "memtrace.tracers.options" in graph[
        "memtrace.tracers.malloc"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_memtrace_has_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    lines = [" <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(lines)
