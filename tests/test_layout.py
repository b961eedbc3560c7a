"""The product's boundaries: `demo/` (what a Space runs) never loads the training pipeline, and the
modules of both packages import each other without a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo"
PACKAGES = ("demo", "training")


def demo_modules() -> list[str]:
    return sorted(f"demo.{p.stem}" for p in DEMO.glob("*.py") if p.stem != "__init__")


def imports_of(path: Path) -> set[str]:
    """Every demo.* and training.* module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in PACKAGES:
                found |= {f"{node.module}.{a.name}" for a in node.names}
            elif node.module.split(".")[0] in PACKAGES:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES and "." in a.name}
    return found


def test_importing_every_demo_module_loads_no_training_module():
    code = ("import importlib, sys\n"
            f"for m in {demo_modules()!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'training' or m.startswith('training.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_no_demo_source_names_the_training_package():
    for path in DEMO.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n == "training" or n.startswith("training.") for n in names), path


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of a module graph (module -> modules it imports), or None."""
    state: dict[str, str] = {}  # module -> "open" while on the current path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        if state.get(module) == "done":
            return None
        if state.get(module) == "open":
            return path[path.index(module):] + [module]
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            circle = visit(dep, path + [module])
            if circle:
                return circle
        state[module] = "done"
        return None

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return None


def test_demo_and_training_modules_import_each_other_without_a_circle():
    graph = {f"{pkg}.{p.stem}": imports_of(p) for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")}
    assert len(graph) > 30
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_a_planted_circle(tmp_path):
    (tmp_path / "a.py").write_text("from demo.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from demo import a\n")
    graph = {"demo.a": imports_of(tmp_path / "a.py"), "demo.b": imports_of(tmp_path / "b.py"), "demo.c": {"demo.a"}}
    assert find_circle(graph) == ["demo.a", "demo.b", "demo.a"]
    assert find_circle({"demo.a": {"demo.b"}, "demo.b": set()}) is None
