"""One run's settings are composed, not redeclared: every settings dataclass of the package (found by scanning, so
a new one is covered) declares ideas no other declares, holds the others as components, and states each default
once (in defaults.py or in its one dataclass)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_cli"
SETTINGS_SUFFIXES = ("Settings", "Options", "Config")  # how a settings type is named

# Not settings of a run: distill's training recipes (train.py, eagle_train.py: what `distill train` fits a draft
# with) and an EAGLE head's architecture as its files state it. They are left out of this check by name.
NOT_RUN_SETTINGS = {"TrainConfig", "EagleTrainConfig", "HeadConfig"}

# A field name two settings types may both declare because it names two different ideas. Empty: none does.
SAME_NAME_DIFFERENT_IDEA: dict[str, str] = {}


def _settings_classes() -> dict[str, type]:
    """Every dataclass named as a settings type, in every module of the package (found in the source, then
    imported)."""
    found: dict[str, type] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)
                 and node.name.endswith(SETTINGS_SUFFIXES) and node.name not in NOT_RUN_SETTINGS
                 and any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)]
        if not names:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for name in names:
            assert name not in found, f"two settings types are named {name}"
            found[name] = getattr(module, name)
    return found


def _is_component(field: dataclasses.Field, classes: dict[str, type]) -> bool:
    """A field that holds another settings type whole (composition, not a repeated idea)."""
    annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    return annotation.strip("'\"") in classes


def test_the_scan_finds_every_settings_type_of_a_run():
    assert {"LoadSettings", "DrafterOptions", "DrafterSettings", "GenerationConfig", "RunSettings", "ChatSettings",
            "BenchSettings", "ServeSettings", "VllmSettings", "VllmBenchSettings",
            "ProposerSettings", "ListenSettings", "ServerSettings"} <= set(_settings_classes())


def test_no_settings_type_repeats_another_ones_field():
    classes = _settings_classes()
    declared: dict[str, list[str]] = {}
    for name, kind in classes.items():
        for field in dataclasses.fields(kind):
            if not _is_component(field, classes):
                declared.setdefault(field.name, []).append(name)
    repeated = {field: owners for field, owners in declared.items()
                if len(owners) > 1 and field not in SAME_NAME_DIFFERENT_IDEA}
    assert not repeated, f"fields declared by more than one settings type: {repeated}"


def test_the_run_settings_are_held_whole_by_each_entry_point():
    """chat, bench, serve, vLLM's runs and the proposer hold the shared components, not copies of their fields."""
    classes = _settings_classes()

    def components(name: str) -> set[str]:
        return {str(field.type).strip("'\"") for field in dataclasses.fields(classes[name])
                if _is_component(field, classes)}

    assert components("RunSettings") == {"LoadSettings", "DrafterSettings", "GenerationConfig"}
    assert components("DrafterSettings") == {"DrafterOptions"}
    assert components("ChatSettings") == components("BenchSettings") == {"RunSettings"}
    assert components("ProposerSettings") == {"DrafterSettings"}
    assert components("VllmSettings") == {"LoadSettings", "ProposerSettings"}
    assert components("ServeSettings") == {"VllmSettings", "ListenSettings"}
    assert components("ServerSettings") == {"ChatSettings", "ListenSettings"}
    assert components("VllmBenchSettings") == {"BenchSettings"}


def _default_sources() -> dict[tuple[str, str], str]:
    """Each settings field with a literal default: (type, field) -> the default's source text; a default that names
    a constant (defaults.py's, or another module's) is not a literal."""
    classes = _settings_classes()
    literals: dict[tuple[str, str], str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef) or node.name not in classes:
                continue
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and statement.value is not None and \
                        isinstance(statement.target, ast.Name) and _is_literal(statement.value):
                    literals[(node.name, statement.target.id)] = ast.unparse(statement.value)
    return literals


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def test_each_default_is_declared_in_one_place():
    """A setting's default is written once: in its one dataclass (a literal there) or in defaults.py (a constant
    the dataclass names). The list below is every literal default, so a second one for an idea shows up here."""
    literals = _default_sources()
    by_field: dict[str, list[str]] = {}
    for (kind, field), _ in literals.items():
        by_field.setdefault(field, []).append(kind)
    assert all(len(kinds) == 1 for kinds in by_field.values()), by_field
    assert literals == {
        ("LoadSettings", "device"): "'auto'", ("LoadSettings", "dtype"): "'auto'",
        ("LoadSettings", "weights"): "'auto'", ("LoadSettings", "decoder"): "'auto'",
        ("DrafterOptions", "index"): "None",
        ("DrafterOptions", "l_threshold"): "1", ("DrafterOptions", "pld_max_ngram"): "3",
        ("DrafterOptions", "pld_min_ngram"): "1", ("DrafterOptions", "draft_model"): "None",
        ("DrafterOptions", "draft_min_prob"): "0.0", ("DrafterOptions", "memory"): "None",
        ("DrafterOptions", "aded_time_budget"): "None",
        ("GenerationConfig", "temperature"): "0.0", ("GenerationConfig", "top_p"): "1.0",
        ("GenerationConfig", "top_k"): "0",
        ("GenerationConfig", "min_p"): "0.0", ("GenerationConfig", "logprobs"): "None",
        ("GenerationConfig", "grammar"): "None",
        ("GenerationConfig", "seed"): "None", ("GenerationConfig", "stop"): "()",
        ("GenerationConfig", "eos_token_ids"): "()", ("GenerationConfig", "cost_aware"): "True",
        ("GenerationConfig", "draft_max"): "None", ("GenerationConfig", "min_new_tokens"): "0",
        ("GenerationConfig", "logit_bias"): "()", ("GenerationConfig", "presence_penalty"): "0.0",
        ("GenerationConfig", "frequency_penalty"): "0.0", ("GenerationConfig", "repetition_penalty"): "1.0",
        ("GenerationConfig", "penalty_last_n"): "None", ("GenerationConfig", "dry"): "None",
        ("ProposerSettings", "num_speculative_tokens"): "None",
        ("RunSettings", "exact"): "None", ("RunSettings", "raw"): "False",
        ("ChatSettings", "system"): "None", ("ChatSettings", "remember"): "True",
        ("BenchSettings", "repeats"): "1", ("BenchSettings", "warmup"): "True", ("BenchSettings", "batch"): "1",
        ("BenchSettings", "llama_server"): "None",
        ("ListenSettings", "host"): "'127.0.0.1'", ("ListenSettings", "api_key"): "None",
        ("ServeSettings", "extra_args"): "()", ("ServerSettings", "model_name"): "None",
        ("ServerSettings", "cors_origins"): "()", ("ServerSettings", "parallel"): "None",
        ("VllmSettings", "max_model_len"): "None", ("VllmSettings", "memory_fraction"): "None",
        ("VllmBenchSettings", "concurrency"): "None",
    }


def test_the_command_line_defaults_are_the_settings_defaults():
    """What a flag defaults to is what the settings default to: chat, bench and serve built from no flags at all
    equal the settings' own defaults."""
    from typer.testing import CliRunner

    from specdec_cli.bench.settings import BenchSettings, bench_settings
    from specdec_cli.cli import app
    from specdec_cli.session.chat import ChatSettings
    from specdec_cli.session.run_settings import run_settings
    from specdec_cli.vllm.serve import ServeSettings, serve_settings

    assert ChatSettings(run_settings()) == ChatSettings()
    assert bench_settings() == BenchSettings()
    assert serve_settings() == ServeSettings()
    from specdec_cli.server.settings import ServerSettings, server_settings

    assert server_settings() == ServerSettings()
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert "--host" in help_text and "127.0.0.1" in help_text and "8000" in help_text and "8080" in help_text


@pytest.mark.parametrize("values, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"aux": "recycle"}, "aux recycle: pld does not use it"),
    ({"index": "/nonexistent.sam"}, "index /nonexistent.sam: pld does not use it"),
])
def test_a_run_is_checked_once_with_the_library_messages(values, message):
    from specdec_cli.errors import SpecdecError
    from specdec_cli.session.run_settings import run_settings

    with pytest.raises(SpecdecError, match=f"^{message}"):
        run_settings("pld", **values).check()


def test_draft_max_is_one_setting_for_the_drafter_and_the_engine():
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.drafters import DrafterOptions
    from specdec_cli.session.run_settings import run_settings

    assert run_settings("sam").generation.budget == GenerationConfig().budget  # no --draft-max: the one default
    chosen = run_settings("sam", draft_max=5)
    assert chosen.generation.draft_max == chosen.generation.budget == 5  # one field: the engine's and the drafter's
    assert "draft_max" not in {field.name for field in dataclasses.fields(DrafterOptions)}
    with pytest.raises(TypeError, match="no run setting is named colour"):
        run_settings("sam", colour="red")


def test_vllm_runner_takes_the_dtypes_from_the_load_settings():
    from specdec_cli.target_model.load import load_settings
    from specdec_cli.vllm import runner

    source = Path(runner.__file__).read_text(encoding="utf-8")
    assert "float16" not in source.split('"""', 2)[2]  # no copy of the list below the docstring
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="dtype must be one of " + ", ".join(load_settings.DTYPES)):
        runner.VllmSettings(load_settings.LoadSettings("m", dtype="int4"))


def test_a_chat_session_keeps_its_settings_whole_and_draft_max_sets_both_lengths(tiny_llama):
    """ChatSession holds its ChatSettings (no copies of their fields); a new draft_max (`/set draft_max`) is the
    engine's budget and the drafter's cap at once, the drafter built again."""
    from dataclasses import replace

    from conftest import make_char_tokenizer

    from specdec_cli.defaults import DEFAULT_BUDGET
    from specdec_cli.session.chat import ChatSession, ChatSettings
    from specdec_cli.session.run_settings import run_settings

    settings = ChatSettings(run_settings("pld", max_new_tokens=8), system="be brief")
    session = ChatSession(tiny_llama, make_char_tokenizer(), settings)
    assert session.settings.run.drafter == settings.run.drafter and session.system == "be brief"
    assert session.generation.budget == session.drafter.draft_max == DEFAULT_BUDGET
    session.set_generation(replace(session.generation, draft_max=3))
    assert session.settings.run.generation.draft_max == session.generation.budget == session.drafter.draft_max == 3
    session.set_drafter("sam")
    assert session.drafter_name == session.settings.run.drafter.name == "sam" and session.drafter.draft_max == 3
    session.set_system(None)
    assert session.settings.system is None
