"""The trainer's packages form layers: a module imports only from its own package or from a lower layer.

`python tests/test_layers.py` prints every package-level edge (every import, including those inside functions).
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1] / "trainer"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(level)
    for level in (
        {"core"},
        {"config"},
        {"records"},
        {"storage"},
        {"data"},
        {"k8s"},
        {"cluster"},
        {"serving"},
        {"evaluation"},
        {"modeling"},
        {"training"},
        {"publishing"},
        {"command"},
        {"entry"},
    )
)
PACKAGE_ROOT = "(trainer)"


def unit(parts: tuple[str, ...]) -> str:
    """Names the layer of `trainer.<parts>`: its package, `entry` for a top-level module, else the package root."""
    if not parts or parts == ("__init__",):
        return PACKAGE_ROOT
    if (ROOT / parts[0]).is_dir():
        return parts[0]
    if (ROOT / f"{parts[0]}.py").exists():
        return "entry"
    return PACKAGE_ROOT


def level(name: str) -> int:
    if name == PACKAGE_ROOT:
        return -1
    return next(i for i, units in enumerate(LAYERS) if name in units)


def imports(path: pathlib.Path) -> list[tuple[tuple[str, ...], int]]:
    """Every `trainer...` module `path` imports (anywhere in it), with the line, as parts under `trainer`."""
    own = path.relative_to(ROOT).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ("trainer",) + own[: len(own) - node.level]
                module = ".".join(base + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = tuple(name.split("."))
            if parts[0] == "trainer":
                found.append((parts[1:], node.lineno))
    return found


def edges() -> dict[tuple[str, str], list[str]]:
    """Package-level edges, each with the `file:line` sites that make it."""
    result: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        source = unit(path.relative_to(ROOT).with_suffix("").parts)
        for parts, line in imports(path):
            target = unit(parts)
            if target != source:
                result[(source, target)].append(f"{path.relative_to(ROOT.parent)}:{line}")
    return result


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    declared = set().union(*LAYERS) - {"entry"}
    assert packages == declared


def test_no_import_goes_up_or_sideways():
    upward = [
        f"{source} -> {target}: {', '.join(sites)}"
        for (source, target), sites in sorted(edges().items())
        if level(target) >= level(source)
    ]
    assert upward == []


def test_the_check_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    fake = tmp_path / "trainer"
    for package in ("core", "training"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "core" / "bad.py").write_text("def f():\n    from trainer.training import loop\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert dict(edges()) == {("core", "training"): ["trainer/core/bad.py:2"]}


if __name__ == "__main__":
    for (source, target), sites in sorted(edges().items()):
        mark = "" if level(target) < level(source) else "   <-- goes up"
        print(f"{source} -> {target} ({len(sites)}){mark}")
