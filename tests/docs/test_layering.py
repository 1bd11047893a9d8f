"""Layering: the package's folders are its layers, and a module imports only from its own layer or those
below (at the top of the file or inside a function). `python tests/docs/test_layering.py` prints the graph."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "diversed_demo"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def documented_layers() -> list[str]:
    """The layers, bottom to top, as docs/architecture.md's table lists them: the one place the order is
    written (the package's docstring points there)."""
    return re.findall(r"^\| `(\w+)/` \|", ARCHITECTURE.read_text(encoding="utf-8"), flags=re.MULTILINE)


LAYERS = documented_layers()


def module_name(path: Path) -> str:
    """ui/app.py -> "ui.app"; a package's __init__.py -> the package, "ui"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    return module.split(".")[0]


def imported_modules(path: Path, package: list[str], modules: set[str]) -> set[str]:
    """The package modules a file imports, relative (`from ..core import decode`) or absolute."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            stem = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import tasks` names a module; `from .tasks import X` a member
                member = f"{stem}.{alias.name}".lstrip(".")
                imported.add(member if member in modules else stem)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            imported.update(n.removeprefix("diversed_demo.") for n in names if n.startswith("diversed_demo."))
    return imported


def import_graph() -> dict[str, list[str]]:
    """module -> the package modules it imports, e.g. "core.decode" -> ["core.cache", "core.draft", …]."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported = imported_modules(path, package, set(paths))
        graph[name] = sorted(m for m in imported if m in paths and m != name)
    return graph


def test_every_module_lives_in_a_layer():
    assert len(LAYERS) == len(set(LAYERS)) and "core" in LAYERS
    assert {layer(m) for m in import_graph()} <= set(LAYERS)


def test_no_module_imports_from_a_layer_above_its_own():
    graph = import_graph()
    assert {"cli", "ui.app", "core.decode", "models.loading", "training.loop", "distill.train"} <= set(graph)
    for module, imported in graph.items():
        for other in imported:
            assert LAYERS.index(layer(other)) <= LAYERS.index(layer(module)), f"{module} imports {other}"


def test_the_package_has_no_import_cycles():
    graph, done = import_graph(), set()

    def visit(module, path):
        assert module not in path, " -> ".join(path + [module])
        if module not in done:
            for imported in graph[module]:
                visit(imported, path + [module])
            done.add(module)

    for module in graph:
        visit(module, [])


def test_test_helpers_do_not_ship_in_the_package():
    assert not (PACKAGE / "tiny.py").exists()
    assert not any("tiny" in path.stem for path in PACKAGE.rglob("*.py"))


def test_the_plain_functions_beneath_the_app_run_without_gradio():
    """What the app's handlers call (a run, a comparison, the opening, the examples) and the CLI import
    no Gradio, so scripts and a machine without it (a GPU box with only torch) can run them headless."""
    headless = [
        "ui.runs",
        "ui.opening",
        "ui.examples",
        "ui.render",
        "ui.trace",
        "runtime.plan",
        "cli",
    ]
    code = "; ".join(f"import diversed_demo.{m}" for m in headless)
    code += "; import sys; assert 'gradio' not in sys.modules, 'gradio imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


if __name__ == "__main__":
    for module, imported in import_graph().items():
        print(f"{module} -> {', '.join(imported) or '(none)'}")
