"""Nothing outside the tracer registry branches on a tracer's name.

The registry (``memtrace/tracers/``) is the only list of tracers: a consumer that compares a
tracer name to a literal (``tracer.name == "malloc"``, ``body.get("tracer") != "probe"``) or, in
the report, views, reporters and exports, looks a tracer's results up by a literal name
(``targets["malloc"]``, ``t.get("iosurface")``) has to be edited for every tracer added, which
docs/architecture.md ("Adding a tracer") promises never happens.  This test reads every module
of ``src/memtrace`` with ``ast`` and fails on each such place, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from memtrace import tracers

SRC = Path(__file__).resolve().parents[2] / "src" / "memtrace"
# Packages that consume summaries and report documents: there, a tracer's name as a subscript or
# a .get() key is a read of that tracer's results by name.
CONSUMERS = ("report", "views", "reporters", "exports")
# The same word meaning something else than a tracer, each with why.
NOT_A_TRACER = {
    ("analyze/census.py", "purgeable"): "the census's sort key for the purgeable-memory columns",
}


def _names() -> set[str]:
    return set(tracers.names())


def _literals(node: ast.AST) -> list[str]:
    """String constants an operand stands for: itself, or the members of a tuple/list/set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _offences(path: Path, rel: str, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    consumer = rel.split("/")[0] in CONSUMERS
    out = []
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [s for s in _literals(operand) if s in names]
        elif consumer and isinstance(node, ast.Subscript):
            found += [s for s in _literals(node.slice) if s in names]
        elif (consumer and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args):
            found += [s for s in _literals(node.args[0]) if s in names]
        out += [f"{rel}:{node.lineno}: {ast.unparse(node)[:90]}" for s in found if (rel, s) not in NOT_A_TRACER]
    return out


def test_no_module_outside_the_registry_branches_on_a_tracer_name() -> None:
    names = _names()
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("tracers/"):
            continue
        offences += _offences(path, rel, names)
    assert not offences, "tracer names compared or looked up outside memtrace/tracers/:\n" + "\n".join(offences)


def test_the_check_sees_each_kind_of_offence(tmp_path: Path) -> None:
    """The scan itself: each form it must catch is caught, and a name that is no tracer is not."""
    names = {"malloc", "fds"}
    sample = tmp_path / "m.py"
    sample.write_text('if tracer.name == "malloc": pass\n'
                      'if kind in ("fds", "x"): pass\n'
                      'a = t["malloc"]\n'
                      'b = t.get("fds")\n'
                      'if kind == "other": pass\n', encoding="utf-8")
    assert [o.split(":")[1] for o in _offences(sample, "report/m.py", names)] == ["1", "2", "3", "4"]
    # Outside the consumers only comparisons count (layout.KINDS["malloc"] names a function).
    assert [o.split(":")[1] for o in _offences(sample, "doctor.py", names)] == ["1", "2"]
    # Every exception names a module that exists and a word that is a tracer's name.
    for rel, word in NOT_A_TRACER:
        assert (SRC / rel).is_file() and word in _names()
