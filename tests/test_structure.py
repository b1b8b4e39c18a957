"""The shape of the package: no import cycles between its modules, Typer and Rich only in the CLI layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> tuple[set[str], set[str]]:
    """(package modules, third-party roots) imported when the module loads: function bodies and
    `if TYPE_CHECKING:` blocks do not count, since they do not run at import time."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, outer = set(), set()

    def visit(statements) -> None:
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                    for alias in node.names:
                        full = f"{target}.{alias.name}"
                        inner.add(full if _exists(full) else target)
                else:
                    outer.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.Import):
                outer.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    return inner, outer


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        inner, _ = _top_level_imports(path)
        graph[_module_name(path)] = inner
    return graph


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dependency in sorted(graph.get(module, ())):
            if dependency not in graph or dependency == module or module.startswith(dependency + "."):
                continue  # a package's own __init__ importing its children is how packages work
            if state.get(dependency) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [module, dependency]))
            if dependency not in state:
                visit(dependency, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_typer_and_rich_are_imported_only_by_the_cli():
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not roots & {"typer", "rich"}, f"{path.name} imports {roots & {'typer', 'rich'}}"


def test_the_cli_modules_load_without_torch():
    """`specdec --help` stays instant: nothing the command line imports at load time pulls in torch."""
    import subprocess
    import sys

    code = ("import sys, specdec_cli.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
