"""The shape of the code: no import cycles and the trainer without kfp."""

import ast
from pathlib import Path

from tests.support.paths import ROOT

PACKAGES = ("trainer", "components", "pipelines")


def _modules():
    """Every module of the packages, subpackages included: (dotted name, path)."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(path: Path) -> set[str]:
    """Every module this file imports, at the top or inside a function (relative imports are not used here)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: a relative import"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = dict(_modules())
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


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
    assert "trainer.cluster.topology" in graph["trainer.cluster.supervisor"], "and the subpackages' modules"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"], "the check itself finds one"


def _importers(root: str, prefix: str) -> set[str]:
    return {
        name
        for name, path in _modules()
        if name.startswith(prefix) and any(m == root or m.startswith(f"{root}.") for m in _imports(path))
    }


def test_the_trainer_never_imports_kfp():
    assert _importers("kfp", "trainer") == set()
    assert "pipelines.factories" in _importers("kfp", "pipelines"), "the check sees kfp where it is used"


def test_the_kubernetes_client_is_used_only_by_the_kubernetes_package_and_the_kserve_deployment():
    assert _importers("kubernetes", "trainer") == {
        "trainer.k8s.checkpoints",
        "trainer.cluster.discovery",
        "trainer.k8s.objects",
        "trainer.cluster.configmap_status",
        "trainer.serving.kserve",
    }


def test_the_trainer_is_grouped_by_concern_with_only_entry_points_at_the_top():
    top = {p.stem for p in (ROOT / "trainer").glob("*.py")}
    assert top == {"__init__", "steps", "train", "prepare", "evaluate", "launch", "local_job"}, "commands and steps"
    packages = {p.parent.name for p in (ROOT / "trainer").glob("*/__init__.py")}
    assert packages == {
        "command",
        "config",
        "core",
        "data",
        "modeling",
        "training",
        "cluster",
        "k8s",
        "storage",
        "evaluation",
        "serving",
        "records",
        "publishing",
    }
    for package in packages:
        assert ast.get_docstring(ast.parse((ROOT / "trainer" / package / "__init__.py").read_text())), package


def test_test_files_share_helpers_through_tests_support_only():
    """A test file imports no other test file and not conftest (pytest imports those itself): shared helpers live
    in tests/support/, fixtures in conftest.py."""
    tests = ROOT / "tests"
    found = {}
    for path in sorted(tests.rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[:2]
            if top[0] == "tests" and len(top) == 2 and (top[1].startswith("test_") or top[1] == "conftest"):
                found.setdefault(str(path.relative_to(ROOT)), set()).add(name)
    assert not found, f"move what these import into a tests/support/ module: {found}"
    assert (tests / "support" / "__init__.py").exists() and any(
        "tests.support.processes" in _imports(p) for p in tests.glob("test_*.py")
    ), "the check sees the support modules' users"
