"""The product's boundaries, read from the source (README "Layout" says why the cut is where it is):

- the modules of `demo/` fall in audiences: the engine core (flat in `demo/`), its kernels, the
  models it loads, the service the page and the API call, the measurement, and the UI; each imports
  only from the audiences below it, so the engine core and its kernels import nothing of the
  service, the UI or the measurement, and nothing imports the UI but the UI;
- no module imports both Gradio or plotly and torch or Triton at module level, and the UI imports
  no torch at all at module level;
- `training/` imports the product, never the reverse, and no two modules import each other in a circle;
- the design card's files are real modules doing their jobs; the commands keep their names;
- no function of the product is longer than MAX_FUNCTION_LINES, and no process-wide switch is set
  from outside its module (a `global` statement);
- the engine is the loop (at most MAX_ENGINE_LINES), and nothing of the product subclasses it: the
  capture lab swaps its public hooks;
- a drafting method is named only by the registry (demo/methods.py) and the proposers (and by the
  drafter architectures and checkpoint formats that share their names);
- the developer tools (demo/bench/tools/) are never imported by the app;
- the README stays within MAX_README_BYTES and each reference doc within MAX_DOC_BYTES.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo"
PACKAGES = ("demo", "training")
# the commands users run, each a module of a few lines that calls its package's main
COMMANDS = {"demo.perf": "demo.bench.tools.perf", "demo.compare": "demo.bench.tools.compare",
            "demo.export_drafter": "demo.models.export_drafter", "demo.bench.__main__": "demo.bench.tools.cli",
            **{f"demo.bench.{tool}": f"demo.bench.tools.{tool}" for tool in ("served", "sweep", "hostile", "lookup")}}
# audience -> the audiences it may import (itself included)
MAY_IMPORT = {
    "kernels": {"kernels"},
    "core": {"core", "kernels"},
    "models": {"models", "core", "kernels"},
    "service": {"service", "models", "core", "kernels"},
    "bench": {"bench", "service", "models", "core", "kernels"},
    "ui": {"ui", "bench", "service", "models", "core"},
    "command": {"bench", "models"},
}
GUI = ("gradio", "plotly")
TENSORS = ("torch", "triton")
MAX_FUNCTION_LINES = 120


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def product_files() -> list[Path]:
    return sorted(p for p in DEMO.rglob("*.py") if "__pycache__" not in p.parts)


CORE_PACKAGES = ("proposers",)  # sub-packages of the engine core: one proposer a drafting method


def audience(module: str) -> str:
    """The audience of a demo module: its sub-package, or for a module flat in demo/ (or in a core
    package), the core (views.py, the UI's entry, and the commands apart)."""
    parts = module.split(".")
    if module in COMMANDS:
        return "command"
    if module == "demo.views":
        return "ui"
    if len(parts) > 2 or (len(parts) == 2 and (DEMO / parts[1]).is_dir()):
        return "core" if parts[1] in CORE_PACKAGES else parts[1]
    return "core"


def imports_of(path: Path, top_level_only: bool = False) -> set[str]:
    """Every module a file imports (at module level only, or inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            if node.module in PACKAGES or node.module.startswith("demo."):
                found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif top_level_only and isinstance(node, (ast.If, ast.Try)):  # `if HAVE_TRITON: import triton`
            found |= {n for child in ast.walk(node) if isinstance(child, ast.Import) for n in
                      (a.name for a in child.names)}
    return found


def project_imports(path: Path) -> set[str]:
    """The demo.* and training.* modules (not packages' faces) a file imports."""
    known = {module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {m for m in imports_of(path) if m in known and m.split(".")[0] in PACKAGES} - set(PACKAGES)


def test_the_design_cards_files_are_real_modules_doing_their_jobs():
    jobs = {"app.py": {"main", "parse_args"}, "demo/engine.py": {"Engine", "GenerationConfig"},
            "demo/drafter_eagle3.py": {"Eagle3Drafter"}, "demo/views.py": {"build_demo", "register_listeners"}}
    for path, names in jobs.items():
        defined = {n.name for n in ast.parse((ROOT / path).read_text()).body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {a.asname or a.name for n in ast.parse((ROOT / path).read_text()).body
                    if isinstance(n, ast.ImportFrom) for a in n.names}
        assert names <= defined, (path, names - defined)
    for path in ("assets", "requirements.txt"):
        assert (ROOT / path).exists()


def test_every_module_imports_only_from_the_audiences_below_it():
    wrong = []
    for path in product_files():
        module = module_name(path)
        mine = audience(module)
        for dep in project_imports(path):
            if dep.startswith("training"):
                continue  # test_no_demo_source_names_the_training_package says why not
            if audience(dep) not in MAY_IMPORT[mine] and dep not in COMMANDS.values():
                wrong.append(f"{module} ({mine}) imports {dep} ({audience(dep)})")
    assert not wrong, "\n".join(wrong)


def test_each_audience_is_the_one_the_layout_names():
    found = {audience(module_name(p)) for p in product_files() if p.name != "__init__.py"}
    assert found == set(MAY_IMPORT)
    assert audience("demo.engine") == "core" and audience("demo.kernels.fused") == "kernels"
    assert audience("demo.views") == "ui" and audience("demo.ui.html.render") == "ui"


def test_no_module_imports_both_a_gui_library_and_torch_at_module_level():
    both = []
    for path in [*product_files(), ROOT / "app.py"]:
        top = {m.split(".")[0] for m in imports_of(path, top_level_only=True)}
        if top & set(GUI) and top & set(TENSORS):
            both.append(str(path.relative_to(ROOT)))
    assert not both


def test_the_ui_imports_no_torch_at_module_level():
    for path in product_files():
        if audience(module_name(path)) == "ui":
            top = {m.split(".")[0] for m in imports_of(path, top_level_only=True)}
            assert not top & set(TENSORS), path


def test_each_command_only_calls_its_packages_main():
    for command, implementation in COMMANDS.items():
        path = ROOT / (command.replace(".", "/") + ".py")
        assert project_imports(path) == {implementation}, command
        assert len(path.read_text().splitlines()) < 12, command
    assert (DEMO / "bench" / "__main__.py").is_file()  # python -m demo.bench


def test_importing_every_demo_module_loads_no_training_module():
    modules = [module_name(p) for p in product_files() if p.name != "__main__.py"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'training' or m.startswith('training.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_no_demo_source_names_the_training_package():
    for path in product_files():
        names = imports_of(path)
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
    graph = {module_name(p): project_imports(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    assert len(graph) > 30
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"demo.a": {"demo.b"}, "demo.b": {"demo.a"}, "demo.c": {"demo.a"}}
    assert find_circle(graph) == ["demo.a", "demo.b", "demo.a"]
    assert find_circle({"demo.a": {"demo.b"}, "demo.b": set()}) is None


def test_the_audience_rule_catches_a_planted_upward_import(tmp_path, monkeypatch):
    planted = DEMO / "planted_for_the_layout_test.py"
    monkeypatch.setattr(sys.modules[__name__], "product_files", lambda: [planted])
    planted.write_text("from demo.ui.html.render import escape\n")
    try:
        with pytest.raises(AssertionError, match="planted_for_the_layout_test .core. imports demo.ui.html.render"):
            test_every_module_imports_only_from_the_audiences_below_it()
    finally:
        planted.unlink()


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_of_the_product_is_longer_than_the_limit():
    long = [f"{p.relative_to(ROOT)}:{f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in [*product_files(), ROOT / "app.py"] for f in functions(p)
            if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_product_module_rebinds_a_process_wide_switch():
    """A `global` statement is a switch some caller flips for everyone (a bench knob in the product
    path); settings are passed as values instead."""
    flips = [f"{p.relative_to(ROOT)}:{f.name}" for p in product_files() for f in functions(p)
             if any(isinstance(n, ast.Global) for n in ast.walk(f))]
    assert not flips, flips


MAX_DOC_BYTES = 25_000  # each reference doc: the present, not a ledger (docs/runs/ keeps those)
MAX_README_BYTES = 16_000  # what it is, the two set-up commands, the screenshots, how to use it, the layout, links


def test_the_readme_and_the_reference_docs_stay_within_their_size():
    assert (ROOT / "README.md").stat().st_size <= MAX_README_BYTES
    docs = sorted((ROOT / "docs").glob("*.md"))
    large = {d.name: d.stat().st_size for d in docs if d.stat().st_size > MAX_DOC_BYTES}
    assert len(docs) >= 6 and not large, large


MAX_ENGINE_LINES = 500  # demo/engine.py: the loop (prefill, step, accept, account), with its docstrings


def test_the_engine_is_the_loop_and_nothing_subclasses_it():
    """Buffers, capture, acceptance, the packed result and each drafting method live in modules of
    their own; a feature that needs another engine swaps its public hooks (``Engine.binding``,
    ``Engine.proposer``), never subclasses it."""
    assert len((DEMO / "engine.py").read_text().splitlines()) <= MAX_ENGINE_LINES
    subclasses = [f"{p.relative_to(ROOT)}:{node.name}" for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)
                  and any(isinstance(b, ast.Name) and b.id == "Engine" or isinstance(b, ast.Attribute) and b.attr == "Engine"
                          for b in node.bases)]
    assert not subclasses, subclasses


# the registry and the proposers name the methods; the drafter architectures and the checkpoint formats
# (published config keys) share the names of the two drafter methods
NAMES_METHODS = ("demo/methods.py", "demo/proposers/", "demo/drafter_common.py", "demo/models/checkpoints.py",
                 "demo/models/export_drafter.py")


def test_no_drafting_method_is_named_outside_the_registry_and_the_proposers():
    from demo.methods import METHODS

    names = set(METHODS) - {"none"}  # "none" is also the word for no value
    named = [f"{p.relative_to(ROOT)}:{node.lineno} {node.value!r}" for p in [*product_files(), ROOT / "app.py"]
             if not str(p.relative_to(ROOT)).startswith(NAMES_METHODS)
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and node.value in names]
    assert not named, named


def test_the_app_never_imports_the_developer_tools():
    """The workshop (demo/bench/tools/) is reached only through its commands."""
    tools = {module_name(p) for p in (DEMO / "bench" / "tools").rglob("*.py")}
    assert len(tools) > 5, "demo/bench/tools/ holds the developer tools"
    app = [p for p in [*product_files(), ROOT / "app.py"] if module_name(p) not in tools | set(COMMANDS)]
    wrong = [f"{p.relative_to(ROOT)} imports {m}" for p in app for m in project_imports(p) if m in tools]
    assert not wrong, wrong
