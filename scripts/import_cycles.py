"""Fail on any import cycle between product modules (scripts/lint runs it).

The graph is import-linter's (grimp): every import, inside functions included, but not those under
`if TYPE_CHECKING:` (types only, never run). A cycle is a set of modules each reachable from the
others; the known ones are listed below, to be broken, and any other fails the check.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's packages, not the ones the virtualenv's editable install points at (a worktree
# shares the main checkout's virtualenv).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grimp

PACKAGES = ("crm", "messaging", "campaigns", "runner", "surveys", "erp", "integrations", "project")

# Known cycles, to be broken (each a set of modules); a known cycle that is gone must leave the list.
KNOWN: list[frozenset[str]] = []


def cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(m for m in graph.modules if not _is_migration(m))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(_imported(graph, root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(_imported(graph, child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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


def _is_migration(module: str) -> bool:
    return ".migrations" in module


def _imported(graph: grimp.ImportGraph, module: str) -> list[str]:
    return sorted(m for m in graph.find_modules_directly_imported_by(module) if not _is_migration(m))


def main() -> int:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    found = cycles(graph)
    new = [c for c in found if c not in KNOWN]
    gone = [c for c in KNOWN if c not in found]
    for cycle in new:
        print("import cycle:", " <-> ".join(sorted(cycle)))
    for cycle in gone:
        print("a known cycle is gone, remove it from KNOWN in scripts/import_cycles.py:", sorted(cycle))
    if new or gone:
        return 1
    print(f"no import cycle between product modules ({len(KNOWN)} known)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
