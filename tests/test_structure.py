"""The shape of the package: no import cycles between its modules, Typer and Rich only in the CLI layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package modules a module imports anywhere: at load time, inside functions, and under
    `if TYPE_CHECKING:` (a cycle through any of them still ties the two modules together)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == PACKAGE.name:
                target = node.module or ""
            else:
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                inner.add(full if _exists(full) else target)
        elif isinstance(node, ast.Import):
            inner.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE.name)
    return inner


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


# The layers, lowest first: a module may import its own package and the packages of lower layers, never a higher
# one. The top-level modules (errors, files, home, machine, defaults) are the foundation everything stands on.
LAYERS = (
    ("specdec_cli",),  # the foundation: errors, files, home, machine, processes, defaults
    ("kernels", "sam"),  # the C kernels; the suffix automaton
    ("target_model",),  # the target model: loading, block weights, native decoder, exactness, KV cache, and
    # the device engine (a fixed-shape torch decoder, target_model/device/)
    ("texts",),  # corpora, prompts, data rows, the answer memory
    ("decoding",),  # the engine and its pure parts
    ("drafters",),  # every drafter behind the two-method protocol
    ("session", "vllm"),  # a conversation and comparison; specdec inside vLLM
    ("distill",),  # draft models and heads trained on the target's answers
    ("bench",),  # speed against plain decoding and other engines
    ("server",),  # specdec serve on specdec's engine: the OpenAI HTTP API around a chat session
    ("cli", "__main__"),  # Typer and Rich: parse, build settings, call one function, render
)


def _layer(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 or (len(parts) == 2 and (_is_package(parts[1]) or parts[1] == "__main__")) \
        else "specdec_cli"
    for rank, names in enumerate(LAYERS):
        if package in names:
            return rank
    raise AssertionError(f"{module}: its package {package!r} has no place in LAYERS")


def _is_package(name: str) -> bool:
    return (PACKAGE / name / "__init__.py").is_file()


def test_no_import_cycles():
    """No cycle in the import graph, counting imports inside functions and under TYPE_CHECKING as edges."""
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


def test_every_import_points_down_the_layers():
    """The tree reads as the architecture: no module imports a package of a higher layer (LAYERS above)."""
    upward = [f"{module} -> {dependency}" for module, dependencies in _graph().items()
              for dependency in dependencies if _layer(dependency) > _layer(module)]
    assert not upward, "imports up the layers: " + "; ".join(sorted(upward))


# target_model's wings, lowest first: a wing's module imports its own wing, lower wings and target_model's root
# modules (families, placement, quiet: facts and policy every wing reads), never a higher wing; the root modules
# import no wing. Each wing's __init__ docstring says what it owns and what it stands on.
WINGS = ("native", "gguf", "in_place", "verify", "device", "load")
WING_LINES, FILE_LINES = 1500, 450


def _wing(module: str) -> "int | None":
    """A target_model module's wing rank (-1: a root module of target_model); None outside target_model."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "target_model":
        return None
    return WINGS.index(parts[2]) if parts[2] in WINGS else -1


def test_target_models_wings_point_down():
    ranks = {module: _wing(module) for module in _graph()}
    upward = [f"{module} -> {dependency}" for module, dependencies in _graph().items() if ranks[module] is not None
              for dependency in dependencies if (ranks.get(dependency) if ranks.get(dependency) is not None else -1)
              > ranks[module]]
    assert not upward, "imports up target_model's wings: " + "; ".join(sorted(upward))
    wings = {path.name for path in (PACKAGE / "target_model").iterdir() if (path / "__init__.py").is_file()}
    assert wings == set(WINGS)


def test_no_file_and_no_wing_is_too_long():
    """A file reads top to bottom on a few screens (at most 450 lines), a wing of target_model in one sitting."""
    lines = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    long_files = sorted(f"{path.relative_to(PACKAGE)} ({count})" for path, count in lines.items() if count > FILE_LINES)
    assert not long_files, "files over 450 lines: " + ", ".join(long_files)
    for wing in WINGS:
        total = sum(count for path, count in lines.items() if path.parent == PACKAGE / "target_model" / wing)
        assert total <= WING_LINES, f"target_model/{wing}: {total} lines"


def test_the_cycle_check_sees_function_level_and_type_checking_imports():
    graph = _graph()
    assert "specdec_cli.decoding.generation_config" in graph["specdec_cli.decoding.draft"]  # under TYPE_CHECKING
    assert "specdec_cli.texts.corpus" in graph["specdec_cli.texts.memory"]  # inside a function (numpy)


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


def test_the_version_is_the_changelogs_newest():
    """One version, written once (specdec_cli/__init__.py; pyproject.toml reads it): CHANGELOG.md's newest entry."""
    import re

    from specdec_cli import __version__

    root = PACKAGE.parent
    newest = re.search(r"^## (\d+\.\d+\.\d+)", (root / "CHANGELOG.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert newest and re.match(r"\d+\.\d+\.\d+", __version__).group(0) == newest.group(1)
    assert 'attr = "specdec_cli.__version__"' in (root / "pyproject.toml").read_text(encoding="utf-8")


def test_no_module_outside_the_target_and_the_kernels_is_over_450_lines():
    """A module that grows past 450 lines is split by concern (target_model/ and kernels/ have their own owners)."""
    long = [f"{path.relative_to(PACKAGE)}: {lines}" for path in sorted(PACKAGE.rglob("*.py"))
            if not {"target_model", "kernels"} & set(path.relative_to(PACKAGE).parts)
            and (lines := len(path.read_text(encoding="utf-8").splitlines())) > 450]
    assert not long, "modules over 450 lines: " + "; ".join(long)
