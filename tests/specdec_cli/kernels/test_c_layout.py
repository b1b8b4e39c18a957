"""The C sources' layout: files of one concern each, at most 800 lines, sharing one header that setup.py ships.

Reads the files and setup.py as text (nothing is compiled or imported here); test_kernels.py checks what the code
computes."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "specdec_cli"
KERNELS = PACKAGE / "kernels"
HEADER = KERNELS / "csrc" / "kernels.h"
MAX_LINES = 800


def c_files(under: Path) -> list[Path]:
    return sorted(under.rglob("*.c")) + sorted(under.rglob("*.h"))


def kernel_extension() -> dict[str, list[str]]:
    """setup.py's keyword lists (sources, depends, extra_compile_args) of the specdec_cli.kernels._cpu Extension,
    names of module-level lists resolved."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    lists = {target.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension" and node.args
                and ast.literal_eval(node.args[0]) == "specdec_cli.kernels._cpu"):
            return {keyword.arg: lists[keyword.value.id] if isinstance(keyword.value, ast.Name)
                    else ast.literal_eval(keyword.value) for keyword in node.keywords if keyword.arg}
    raise AssertionError("setup.py has no Extension for specdec_cli.kernels._cpu")


def test_no_c_file_over_800_lines():
    files = c_files(PACKAGE)
    assert len(files) > 2
    too_long = {str(path.relative_to(ROOT)): count for path in files
                if (count := len(path.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"C files over {MAX_LINES} lines: {too_long}"


def test_every_kernel_file_opens_with_what_it_holds_and_what_it_does_not():
    for path in c_files(KERNELS):
        text = path.read_text()
        assert text.startswith("/*"), f"{path.name} does not open with a comment"
        opening = text[: text.index("*/")]
        assert path.name in opening, f"{path.name}'s opening comment does not name the file"
        assert "Not here" in opening, f"{path.name}'s opening comment does not say what it does not hold"


def test_the_kernels_share_one_header():
    headers = [path for path in KERNELS.rglob("*.h")]
    assert headers == [HEADER]
    for path in sorted(KERNELS.rglob("*.c")):
        includes = re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE)
        assert len(includes) == 1 and (path.parent / includes[0]).resolve() == HEADER, (path.name, includes)


def test_setup_py_builds_every_kernel_file_and_ships_the_header():
    extension = kernel_extension()
    present = sorted(str(path.relative_to(ROOT)) for path in KERNELS.rglob("*.c"))
    assert sorted(extension["sources"]) == present
    assert extension["depends"] == [str(HEADER.relative_to(ROOT))]
    assert "-ffp-contract=off" in extension["extra_compile_args"]  # no fused multiply-add the code did not write
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert f"include {HEADER.parent.relative_to(ROOT)}/*.h" in manifest


def test_functions_shared_across_files_are_prefixed():
    """What one file defines for another is declared in the header, named cpu_*; the rest is static."""
    declared = re.findall(r"^[a-z][\w ]*?[ *](\w+)\([^;{]*\);", HEADER.read_text(), re.MULTILINE)
    assert len(declared) > 10
    assert [name for name in declared if not name.startswith("cpu_")] == []
    for path in sorted(KERNELS.rglob("*.c")):
        for name in re.findall(r"^(?:AVX2 |VNNI512 )?(?!static)[a-z][\w ]*?[ *](\w+)\([^;]*?\)\s*\{", path.read_text(),
                               re.MULTILINE):
            assert name.startswith("cpu_") or name == "PyInit__cpu", f"{path.name}: {name} is neither static nor cpu_*"
