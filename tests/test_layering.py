"""Layering: which package modules each module imports (at the top or inside a function), and that nothing
imports the layers on top (cli, ui) from below. `python tests/test_layering.py` prints the graph."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "diversed_demo"
TOP = {"cli": set(), "ui": {"cli"}}  # the top layers (a module or a package), and who may import each


def module_name(path: Path) -> str:
    """ui/app.py -> "ui.app"; a package's __init__.py -> the package, "ui"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    return module.split(".")[0]


def import_graph() -> dict[str, list[str]]:
    """module -> the package modules it imports, e.g. "distill.card" -> ["bench", "decode", "distill.data", …]."""
    modules = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:  # `from . import tasks` names a module; `from .tasks import X` a member
                    imported.add(f"{stem}.{alias.name}".lstrip(".") if f"{stem}.{alias.name}".lstrip(".") in modules
                                 else stem)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                imported.update(n.removeprefix("diversed_demo.") for n in names if n.startswith("diversed_demo."))
        graph[name] = sorted(m for m in imported if m in modules and m != name)
    return graph


def test_nothing_imports_the_top_layers_from_below():
    graph = import_graph()
    assert {"cli", "ui", "ui.app", "decode", "distill.train"} <= set(graph)
    for module, imported in graph.items():
        for top, allowed in TOP.items():
            if layer(module) != top and layer(module) not in allowed:
                assert all(layer(m) != top for m in imported), f"{module} imports {top}"


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


if __name__ == "__main__":
    for module, imported in import_graph().items():
        print(f"{module} -> {', '.join(imported) or '(none)'}")
