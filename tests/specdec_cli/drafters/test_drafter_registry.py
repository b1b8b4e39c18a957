"""Drafters describe themselves: a new drafter is one module with a `SPEC` and one line in the registry, and the
registry derives the names, help, option errors, checks and builder from the specs. Draft length has one default.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import TINY_EOS, TINY_VOCAB, assert_one_line_error, cli_env, hf_greedy

import specdec_cli.drafters as registry
from specdec_cli.defaults import DEFAULT_BUDGET
from specdec_cli.drafters import DrafterOptions, TargetInfo, check_drafter_options, make_drafter
from specdec_cli.drafters.spec import draft_length
from specdec_cli.errors import SpecdecError

DRAFTERS_DIR = Path(registry.__file__).parent
DEFAULTS = DRAFTERS_DIR.parent / "defaults.py"

# The whole new drafter: one file in the drafters package. It proposes fixed tokens (the context's last ones again).
TOY = '''"""A toy drafter: proposes the newest tokens of the context again."""

from __future__ import annotations

from typing import Optional, Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from .spec import DrafterOptions, DrafterSpec, draft_length
from .target import TargetInfo


class EchoDrafter:
    name = "toy"
    needs = NOTHING

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tokens = list(context[-min(budget, self.draft_max):]) if budget > 0 else []
        return Draft(tokens, self.name) if tokens else Draft.empty(self.name)

    def observe(self, event: StepEvent) -> None:
        pass

    def reset(self) -> None:
        pass


def make_toy(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> EchoDrafter:
    return EchoDrafter(draft_length(draft_max))


SPEC = DrafterSpec(name="toy", help="a toy that proposes the newest tokens again", build=make_toy)
'''

# Adds the toy to the registry the way a drafter is added: its file in the package (a folder on the package's
# path), and one line in the registry's source, which is then run again in the registry's own namespace.
ADD_TOY = '''
import re
import sys
from pathlib import Path

import specdec_cli.drafters as registry

registry.__path__.append(FOLDER)
source = Path(registry.__file__).read_text(encoding="utf-8")
added = re.sub(r"(DRAFTER_MODULES = \\(.*\\n)", r'\\1    "toy",\\n', source, count=1)
assert added.count("\\n") == source.count("\\n") + 1, "the registry line was not added"
exec(compile(added, registry.__file__, "exec"), registry.__dict__)
'''


@pytest.fixture
def toy_folder(tmp_path):
    (tmp_path / "toy.py").write_text(TOY, encoding="utf-8")
    return str(tmp_path)


@pytest.fixture
def with_toy(toy_folder):
    """The registry with the toy added, in this process; put back as it was afterwards."""
    saved = dict(registry.__dict__)
    exec(ADD_TOY.replace("FOLDER", repr(toy_folder)), {})
    yield registry
    for name in set(registry.__dict__) - set(saved):
        del registry.__dict__[name]
    registry.__dict__.update(saved)
    registry.__path__.remove(toy_folder)
    sys.modules.pop("specdec_cli.drafters.toy", None)


def test_a_toy_drafter_is_one_file_and_one_registry_line(with_toy, tiny_llama):
    from specdec_cli.decoding.engine import Engine, GenerationConfig

    assert with_toy.DRAFTERS["toy"] == "a toy that proposes the newest tokens again"
    assert with_toy.is_drafter("toy") and "toy" not in with_toy.AUX_CHOICES  # its spec gives it no aux_rank
    with_toy.check_drafter_options("toy", with_toy.DrafterOptions())
    with pytest.raises(SpecdecError) as refused:
        with_toy.check_drafter_options("toy", with_toy.DrafterOptions(index="x.sam"))
    assert str(refused.value) == "index x.sam: toy does not use it (an index is read by sam and aded)"
    target = with_toy.TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,))
    drafter = with_toy.make_drafter("toy", with_toy.DrafterOptions(), target, 4)
    assert drafter.name == "toy" and drafter.draft_max == 4
    prompt = [1, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11]
    config = GenerationConfig(max_new_tokens=24, draft_max=4, eos_token_ids=(TINY_EOS,), cost_aware=False)
    generation = Engine(tiny_llama).generate(prompt, drafter, config)
    assert generation.stats.drafted_tokens > 0  # it did speculate
    assert generation.tokens == hf_greedy(tiny_llama, prompt, 24)


def test_a_toy_drafter_reaches_the_help_and_its_errors(toy_folder):
    """The command line (a fresh process: help is built when the CLI loads) lists it and refuses its misuse."""
    def specdec(*args: str) -> subprocess.CompletedProcess:
        code = ADD_TOY.replace("FOLDER", repr(toy_folder)) + (
            "sys.argv = ['specdec', *sys.argv[1:]]\nfrom specdec_cli.cli import main\nmain()\n")
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              env=cli_env(None), cwd=DRAFTERS_DIR.parent.parent, timeout=120)

    shown = specdec("chat", "--help")
    assert shown.returncode == 0 and "toy" in shown.stdout, shown.stderr
    assert_one_line_error(specdec("chat", "-p", "hi", "-d", "toy", "--draft-model", "somewhere"),
                          "--draft-model somewhere: toy does not use it")


def test_every_option_a_spec_names_is_a_drafter_option():
    names = {option.name for option in fields(DrafterOptions)}
    for spec in registry.SPECS.values():
        assert set(spec.options) <= names, spec.name
    for option in registry.UNUSED_OPTION_NOTES:  # every option that can go unused has a drafter that uses it
        assert option in names and any(option in spec.options for spec in registry.SPECS.values()), option


def test_drafter_modules_import_the_specs_not_the_registry():
    for path in DRAFTERS_DIR.glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module, f"{path.name} imports the registry back"


def test_listing_drafters_loads_no_drafter_machinery():
    code = ("import sys, specdec_cli.drafters as r; assert len(r.DRAFTERS) == len(r.DRAFTER_MODULES); "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=DRAFTERS_DIR.parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------- one default each


def _constants(path: Path) -> dict[str, object]:
    """Module-level NAME = literal assignments of a file."""
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _keyword_defaults(path: Path) -> list[tuple[str, str, ast.expr]]:
    """(function, parameter, default) of every parameter with a default in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            pairs = list(zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults))
            pairs += [(arg, default) for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default]
            found += [(node.name, arg.arg, default) for arg, default in pairs]
    return found


def test_every_drafter_setting_has_one_default():
    """The defaults of the drafter settings, listed, each declared in one place: DrafterOptions' fields (or the
    defaults.py constant a field names); a drafter's constructor names the same default or takes None, and no
    drafter module declares a constant of its own for a setting (a draft length of 16, 8 or 80 that the engine's
    budget of 8 hid)."""
    options = {option.name: option.default for option in fields(DrafterOptions)}
    assert options == {
        "index": None, "l_bias": 3, "l_threshold": 1, "aux": "none", "pld_max_ngram": 3,
        "pld_min_ngram": 1, "draft_model": None, "draft_min_prob": 0.0, "memory": None, "aded_time_budget": None,
    }
    assert draft_length(None) == draft_length(0) == DEFAULT_BUDGET and draft_length(12) == 12
    # the draft-length default: declared once, in defaults.py
    declared = [(path.name, name) for path in [DEFAULTS, *sorted(DRAFTERS_DIR.glob("*.py"))]
                for name in _constants(path) if re.search(r"DRAFT_MAX|(?<!TIME)_BUDGET$", name)]
    assert declared == [("defaults.py", "DEFAULT_BUDGET"), ("defaults.py", "VLLM_DRAFT_MAX")]  # (vLLM's own)
    settings = {name.removeprefix("pld_") for name in options}
    for path in sorted(DRAFTERS_DIR.glob("*.py")):
        for name in _constants(path):  # no second declaration of a setting's default: L_THRESHOLD = 1, DRAFT_MAX = 16
            assert name.lower() not in settings, f"{path.name}: {name} declares a drafter setting's default again"
        for function, parameter, default in _keyword_defaults(path):
            if parameter in settings and isinstance(default, ast.Constant) and default.value is not None:
                raise AssertionError(f"{path.name}: {function}({parameter}={default.value!r}) repeats a default")


def test_the_draft_length_each_drafter_gets_by_default():
    """Without --draft-max every drafter drafts at most the engine's default budget, as before the one default:
    the tree and table drafters' own caps (80, 64) and sam's 16 never took effect under the engine's 8. model keeps
    its 6 draft forwards and eagle its tree depth of 5 (both below the budget, so both did take effect)."""
    from specdec_cli.drafters.eagle import DEFAULT_TREE_DEPTH
    from specdec_cli.drafters.model import FORWARDS_PER_DRAFT

    target = TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,))
    for name in ("pld", "sam", "recycle", "aded"):
        assert make_drafter(name, DrafterOptions(), target).draft_max == DEFAULT_BUDGET, name
        assert make_drafter(name, DrafterOptions(), target, 5).draft_max == 5, name
    assert FORWARDS_PER_DRAFT == 6 and DEFAULT_TREE_DEPTH == 5
    check_drafter_options(["pld", "sam", "recycle", "aded"], DrafterOptions())
