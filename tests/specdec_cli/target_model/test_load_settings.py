"""How a target is loaded, stated once: LoadSettings' choices and their one message, SPECDEC_DTYPE and
SPECDEC_WEIGHTS, the hub's cache used without touching the environment, and load_target's order of work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import cli_env

from specdec_cli.errors import SpecdecError, check_choice
from specdec_cli.target_model.load import hub, models, target_source
from specdec_cli.target_model.load.load_settings import DEVICES, DTYPES, WEIGHTS, LoadSettings


@pytest.mark.parametrize("setting, value", [("device", "tpu"), ("dtype", "float8"), ("weights", "int3")])
def test_a_value_outside_its_choices_is_one_message_naming_the_setting(setting, value):
    with pytest.raises(SpecdecError) as caught:
        LoadSettings(**{setting: value})
    choices = {"device": DEVICES, "dtype": DTYPES, "weights": WEIGHTS}[setting]
    assert str(caught.value) == f"{setting} must be one of {', '.join(choices)}, got {value!r}"
    assert caught.value.setting == setting


def test_the_environment_fills_auto_only_and_is_checked_the_same_way():
    environ = {"SPECDEC_DTYPE": " bfloat16 ", "SPECDEC_WEIGHTS": "dense"}
    assert LoadSettings().with_environment(environ) == LoadSettings(dtype="bfloat16", weights="dense")
    assert LoadSettings(dtype="float16", weights="int8").with_environment(environ) == LoadSettings(
        dtype="float16", weights="int8")
    assert LoadSettings().with_environment({"SPECDEC_DTYPE": "  "}) == LoadSettings()
    with pytest.raises(SpecdecError, match="^SPECDEC_WEIGHTS must be one of auto, dense") as caught:
        LoadSettings().with_environment({"SPECDEC_WEIGHTS": "int3"})
    assert caught.value.setting is None  # not a flag: the command line says it as it is


def test_check_choice_returns_the_value():
    assert check_choice("cpu", DEVICES, "device") == "cpu"


def test_the_command_line_checks_a_choice_as_it_parses_it():
    """--dtype float8 fails with the library's message, as its flag, before anything else runs."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    for args, message in ((["chat", "-p", "hi", "--dtype", "float8"], "dtype must be one of auto, float32"),
                          (["bench", "--device", "tpu"], "device must be one of auto, cpu, cuda, mps"),
                          (["distill", "train", "--data", "x", "-o", "y", "--kd-loss", "l2"],
                           "kd_loss must be one of fkl")):
        result = CliRunner().invoke(app, args)
        assert isinstance(result.exception, SpecdecError) and str(result.exception).startswith(message), result


def test_a_cached_hub_model_without_the_hub_loads_from_its_cache_directory(tmp_path, monkeypatch):
    """What used to set HF_HUB_OFFLINE for the whole process: the cache's snapshot directory is the location."""
    snapshot = tmp_path / "models--org--m" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache",
                        lambda repo, name: str(snapshot / name) if repo == "org/m" else None)
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    before = dict(os.environ)
    assert models.model_location(target_source.TargetSource("hub", "org/m", "org/m")) == str(snapshot)
    assert dict(os.environ) == before
    with pytest.raises(SpecdecError, match="org/other: not a local file or directory, not in the Hugging Face"):
        models.model_location(target_source.TargetSource("hub", "org/other", "org/other"))


def test_a_hub_repo_without_safetensors_is_refused_before_transformers_asks_for_a_conversion(monkeypatch):
    """What DISABLE_SAFETENSORS_CONVERSION, set for the whole process, used to prevent."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: None)
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    files = {"org/safe": {"model.safetensors.index.json"}, "org/pickled": {"pytorch_model.bin"}}
    monkeypatch.setattr("huggingface_hub.file_exists", lambda repo, name: name in files[repo])
    assert hub.check_hub("org/safe") == "org/safe"
    with pytest.raises(SpecdecError, match="org/pickled: the repo has no safetensors weights"):
        hub.check_hub("org/pickled")

    def unanswered(repo, name):
        raise OSError("no answer")

    monkeypatch.setattr("huggingface_hub.file_exists", unanswered)
    assert hub.check_hub("org/pickled") == "org/pickled"  # transformers says what is wrong, with the load


LOAD_AND_COMPARE = """
import json, os, sys
import torch._dynamo  # (torch's own doing, as transformers' models import it: TORCHINDUCTOR_CACHE_DIR)
before = dict(os.environ)
from specdec_cli.target_model.load import models
for weights in ("dense", "int8"):
    models.load_target(sys.argv[1], "cpu", "auto", weights=weights, step_timer=lambda model: 0.01)
after = dict(os.environ)
print(json.dumps({key: [before.get(key), after.get(key)] for key in set(before) | set(after)
                  if before.get(key) != after.get(key)}))
"""


def test_importing_and_loading_a_target_leaves_the_environment_as_it_was(tiny_model_dir, tmp_path):
    """In a fresh process: specdec's import and a load, dense and in blocks, set no environment variable."""
    env = cli_env({"SPECDEC_HOME": str(tmp_path)})
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("SPECDEC_DTYPE")  # `auto`: the timing path too
    result = subprocess.run([sys.executable, "-c", LOAD_AND_COMPARE, tiny_model_dir], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


def test_each_default_is_stated_once():
    """defaults.py's promise: the library's settings take its values rather than numbers of their own."""
    import dataclasses

    from specdec_cli.bench.settings import BenchSettings, bench_settings
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.defaults import DEFAULT_BENCH_MAX_NEW_TOKENS, DEFAULT_DRAFTER, DEFAULT_MAX_NEW_TOKENS
    from specdec_cli.session.chat import ChatSession, ChatSettings

    assert GenerationConfig().max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert BenchSettings().run.generation.max_new_tokens == DEFAULT_BENCH_MAX_NEW_TOKENS
    assert bench_settings().run.generation.max_new_tokens == DEFAULT_BENCH_MAX_NEW_TOKENS
    assert ChatSettings().run.drafter.name == DEFAULT_DRAFTER
    session_settings = {field.name: field for field in dataclasses.fields(ChatSession)}["settings"]
    assert session_settings.default_factory().run.drafter.name == DEFAULT_DRAFTER


@pytest.mark.parametrize("changes, message", [
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"draft_max": -1}, "draft_max must be >= 0 (0 = no drafting), got -1"),
    ({"seed": -1}, "seed must be between 0 and 2^63 - 1, got -1"),
])
def test_bench_checks_the_generation_settings_as_chat_does(changes, message):
    from specdec_cli.bench.settings import bench_settings

    with pytest.raises(SpecdecError) as caught:
        bench_settings(**changes).check()
    assert str(caught.value).startswith(message)


def test_chat_settings_check_each_load_value():
    from specdec_cli.session.chat import ChatSettings
    from specdec_cli.session.run_settings import run_settings

    for changes in ({"device": "tpu"}, {"dtype": "float8"}, {"weights": "int3"}):
        with pytest.raises(SpecdecError, match=f"^{next(iter(changes))} must be one of"):
            ChatSettings(run_settings(**changes)).check()
