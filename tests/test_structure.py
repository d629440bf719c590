"""The shape of the code: no import cycles and the trainer without kfp."""

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("trainer", "components", "pipelines")


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            yield name, path


def _imports(path: Path, package: str) -> set[str]:
    """Every module this file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([package, *filter(None, [base])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = dict(_modules())
    return {
        name: {m for m in _imports(path, name.split(".")[0]) if m in modules and m != name}
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_even_through_function_level_imports():
    graph = import_graph()
    assert graph["trainer.train"] and graph["pipelines.factories"], "the walk found the project's imports"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"], "the check itself finds one"


def test_the_trainer_never_imports_kfp():
    for name, path in _modules():
        if name.startswith("trainer"):
            assert not {m for m in _imports(path, "trainer") if m == "kfp" or m.startswith("kfp.")}, name
