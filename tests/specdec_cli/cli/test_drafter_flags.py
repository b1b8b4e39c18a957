"""A drafter option the chosen drafter(s) do not use is an error, before the model loads, in chat, bench and
distill generate (`--drafter pld --index /nonexistent.sam` used to exit 0, `--draft-model` was ignored by sam)."""

from __future__ import annotations

import pytest
from conftest import invoke

from specdec_cli.drafters import DrafterOptions, check_drafter_options
from specdec_cli.errors import SpecdecError


@pytest.mark.parametrize("names, options, needle", [
    ("pld", DrafterOptions(index="/nonexistent.sam"), "index /nonexistent.sam: pld does not use it"),
    ("sam", DrafterOptions(draft_model="/nonexistent"), "draft_model /nonexistent: sam does not use it"),
    ("sam+none", DrafterOptions(draft_model="/nonexistent"), "sam+none does not use it"),
    ("none", DrafterOptions(draft_min_prob=0.2), "draft_min_prob 0.2: none does not use it"),
    ("pld", DrafterOptions(aux="recycle"), "aux recycle: pld does not use it"),
    ("sam+pld", DrafterOptions(aux="recycle"), "names its own"),
    ("recycle", DrafterOptions(memory="/tmp"), "memory /tmp: recycle does not use it"),
    ("aded", DrafterOptions(l_threshold=3), "l_threshold 3: aded does not use it"),
    (["none", "pld", "recycle"], DrafterOptions(index="x.sam"), "none, pld, recycle does not use it"),
])
def test_an_option_no_drafter_uses_is_an_error(names, options, needle):
    with pytest.raises(SpecdecError, match="does not use it") as raised:
        check_drafter_options(names, options)
    assert needle in str(raised.value)


@pytest.mark.parametrize("names, options", [  # as bench gives them: all its drafters at once
    (["none", "sam"], DrafterOptions(aux="recycle", l_threshold=3)),
    (["none", "sam+model"], DrafterOptions(draft_min_prob=0.1)),
    (["none", "pld", "sam+none"], DrafterOptions(l_threshold=2)),
    (["none", "pld"], DrafterOptions()),
])
def test_options_one_of_the_drafters_uses_pass(names, options):
    try:
        check_drafter_options(names, options)
    except SpecdecError as exc:  # only the files behind them may be missing here, not the option unused
        assert "does not use it" not in str(exc)


@pytest.mark.parametrize("args, needle", [
    (["chat", "-p", "hi", "--drafter", "pld", "--index", "/nonexistent.sam"], "--index /nonexistent.sam: pld does"),
    (["chat", "-p", "hi", "--drafter", "sam", "--draft-model", "/nonexistent"], "--draft-model /nonexistent: sam"),
    (["chat", "-p", "hi", "--drafter", "pld", "--aux", "recycle"], "--aux recycle: pld does not use it"),
    (["bench", "--drafters", "none,pld", "--index", "/nonexistent.sam"], "--index /nonexistent.sam: none, pld"),
    (["bench", "--drafters", "none,sam", "--draft-model", "/nonexistent"], "--draft-model /nonexistent: none, sam"),
    (["distill", "generate", "--suite", "builtin", "-o", "a.jsonl", "--drafter", "pld", "--index", "/nonexistent.sam"],
     "--index /nonexistent.sam: pld does not use it"),
])
def test_the_commands_refuse_them_before_the_model_loads(tmp_path, args, needle):
    result = invoke(*args, env_extra={"SPECDEC_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:") and needle in lines[0], result.stderr
    assert not (tmp_path / "home" / "models").exists()  # the model was never loaded


def test_bench_in_vllm_refuses_an_index_no_proposer_reads():
    from specdec_cli.bench.settings import bench_settings
    from specdec_cli.bench.vllm_bench import VllmBenchSettings, vllm_methods

    with pytest.raises(SpecdecError, match="index /nonexistent.sam: pld does not use it"):
        VllmBenchSettings(bench_settings(vllm_methods(["pld"], ["ngram"]), index="/nonexistent.sam")).check()
    with pytest.raises(SpecdecError, match="index file not found"):  # sam reads it: so it must exist
        VllmBenchSettings(bench_settings(vllm_methods(["sam", "pld"], []), index="/nonexistent.sam")).check()


@pytest.mark.parametrize("args, needle", [
    (["distill", "generate", "--suite", "distill", "-o", "x.jsonl", "--batch-prompts", "4", "--drafter", "sam"],
     "--drafter: --batch-prompts 4 answers in batches"),
    (["distill", "generate", "--suite", "distill", "-o", "x.jsonl", "--batch-prompts", "8", "--draft-max", "3"],
     "--draft-max: --batch-prompts 8"),
    (["distill", "generate", "--suite", "distill", "-o", "x.jsonl", "--engine", "vllm", "--drafter", "sam",
      "--index", "a.sam"], "--drafter and --index: vLLM answers without specdec's drafters"),
    (["distill", "generate", "--suite", "distill", "-o", "x.jsonl", "--engine", "vllm", "--draft-model", "d"],
     "--draft-model: vLLM"),
    (["distill", "--drafter", "sam", "--batch-prompts", "2", "-o", "d"], "--drafter: --batch-prompts 2"),
    (["distill", "--engine", "vllm", "--drafter", "pld", "-o", "d"], "--drafter: vLLM"),
])
def test_distill_refuses_drafter_flags_its_answering_would_ignore(tmp_path, monkeypatch, args, needle):
    """Batched or vLLM answering drafts with nothing: a drafter flag beside them is refused before the model
    loads (it was silently ignored)."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("specdec_cli.cli.distill_cmd.load_target", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr("specdec_cli.vllm.runner.vllm_installed", lambda: True)
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and isinstance(result.exception, SpecdecError), result.exception
    assert needle in str(result.exception)
    assert not list(tmp_path.iterdir())


def test_distill_generate_drafts_one_by_one_with_a_drafter_given(tmp_path, monkeypatch):
    """With --batch-prompts left to the weights (32 prompts a forward on dense ones, no drafter), a drafter flag
    given answers one by one, with that drafter; without one the weights still choose."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    calls: list[dict] = []
    monkeypatch.setattr("specdec_cli.cli.distill_cmd.load_target", lambda *a, **k: object())
    monkeypatch.setattr("specdec_cli.cli.distill_cmd.target_spec", lambda target: "t")
    monkeypatch.setattr("specdec_cli.cli.distill_cmd.run_generate", lambda *a, **k: calls.append(k))
    out = str(tmp_path / "rows.jsonl")
    base = ["distill", "generate", "--suite", "distill", "--max-prompts", "1", "-o", out]
    for extra in (["--drafter", "sam"], ["--draft-max", "4"], []):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 0, result.exception
    assert [call["batch_prompts"] for call in calls] == [1, 1, None]
    assert calls[0]["drafter"] == "sam" and calls[1]["draft_max"] == 4
