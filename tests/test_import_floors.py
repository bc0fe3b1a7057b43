"""The package reads from the floor up: a stage imports only from its own floor and those below it,
never from one above (a planner does not import the navigator, the Ray jobs do not import the
command line), so the dependency graph is the one the folders show."""

from __future__ import annotations

import ast

from conftest import REPO

# Floors, lowest first: what the package is built on, the world, what an agent sees and maps,
# the topo-polar trajectory, the memory, retrieval and the encoder, the planners, the agent,
# the Ray jobs and the benchmarks, the command line.
FLOORS = {
    "config": 0, "errors": 0, "safe_pickle": 0, "artefacts": 0, "file_locks": 0, "bootstrap": 0, "ray_cluster": 0,
    "world": 1, "perception": 2, "mapping": 2, "topo": 3, "memory": 4, "retrieval": 5, "encoder": 5,
    "planners": 6, "queries": 6, "agent": 7, "revisit": 7, "distributed": 8, "bench": 8, "cli": 9, "__main__": 9,
}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def test_no_module_imports_from_a_floor_above_its_own():
    upward = []
    for path in sorted((REPO / "platform" / "trajrag").rglob("*.py")):
        parts = path.relative_to(REPO / "platform" / "trajrag").parts
        if parts == ("__init__.py",):
            continue
        own = parts[0].removesuffix(".py")
        assert own in FLOORS, f"{path}: give {own!r} a floor in this test"
        tree = ast.parse(path.read_text())
        annotations_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trajrag.") \
                    and id(node) not in annotations_only:
                other = node.module.split(".")[1]
                if FLOORS[other] > FLOORS[own]:
                    upward.append(f"{path.relative_to(REPO)}:{node.lineno} ({own}) imports {node.module}")
    assert upward == [], "imports from a floor above: " + "; ".join(upward)
