"""No import circles among the library's modules.

The layers contract (``lint-imports``, pyproject.toml) orders the subpackages; it says nothing of
modules within one subpackage, where a circle (a imports b, b imports a) can hide behind an import
inside a function. This test finds every such circle.
"""

from __future__ import annotations

import grimp

PACKAGE = "nodelm_lib"


def import_graph() -> dict[str, set[str]]:
    """``{module: the package's modules it imports}`` for every module of the package. grimp reads
    each module's source: imports inside functions and under ``TYPE_CHECKING`` count as well as
    those at the top, since each is an edge that a circle can close. No cache: the test writes
    nothing into the tree."""
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    modules = {m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}
    return {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}


def import_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative):
    each is a set of modules that import one another round a circle.

    What counts: grimp records only imports written in the source, so a package's
    ``__init__`` importing its own submodules closes no circle by itself (Python's implicit
    import of a parent package while a submodule loads is not an edge); one does where a
    submodule imports from the package itself (``from nodelm_lib import x``), which is a real
    circle at import time."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                        circles.append(sorted(component))
    return circles


def test_circles_are_found():
    # the finder itself, on a graph with one circle of three, a self-contained pair and a tail
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert sorted(import_circles(edges)) == [["a", "b", "c"], ["e", "f"]]


def test_imports_inside_functions_are_edges():
    # the CLI imports the modules of its commands inside functions
    assert "nodelm_lib.runs.store_checks" in import_graph()["nodelm_lib.cli"]


def test_no_import_circles():
    circles = import_circles(import_graph())
    assert circles == [], f"{len(circles)} import circle(s) among the package's modules: {circles}"
