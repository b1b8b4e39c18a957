"""`--kv-cache`: the native decoder's KV cache dtype, as a flag (llama.cpp's -ctk/-ctv, vLLM's --kv-cache-dtype) with
SPECDEC_KV_CACHE as its default; the bench's report says which cache the run used."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, invoke


@pytest.mark.parametrize("flag, expected", [(None, "float32"), ("bfloat16", "bfloat16"), ("float32", "float32")])
def test_the_bench_runs_on_the_cache_it_is_given_and_says_so(tmp_path, flag, expected):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"category": "copy", "turns": ["Repeat: one two three, one two three."]}) + "\n")
    given = ["--kv-cache", flag] if flag else []
    result = invoke("bench", "--prompts", str(prompts), "--drafters", "none,pld", "--max-new-tokens", "8",
                    "--no-warmup", "--json", *given, env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["environment"]["kv_cache"] == expected
    overall = [row for row in document["results"] if row["category"] == "overall"]
    assert overall and all(row["identical"] == row["compared"] == 1 for row in overall)


def test_the_environment_gives_the_default_and_the_flag_wins(tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"category": "copy", "turns": ["Say yes."]}) + "\n")
    monkeypatch.setenv("SPECDEC_KV_CACHE", "bfloat16")
    common = ["bench", "--prompts", str(prompts), "--drafters", "none", "--max-new-tokens", "4", "--no-warmup",
              "--json"]
    home = {"SPECDEC_HOME": str(tmp_path / "home")}
    assert json.loads(invoke(*common, env_extra=home).stdout)["environment"]["kv_cache"] == "bfloat16"
    flagged = invoke(*common, "--kv-cache", "float32", env_extra=home)
    assert json.loads(flagged.stdout)["environment"]["kv_cache"] == "float32"


def test_the_distill_commands_run_the_target_on_the_cache_they_are_given(tmp_path, monkeypatch):
    """distill's answering and prompt-writing stages read the cache the flag names (or float32 without one)."""
    from specdec_cli.cli import distill_cmd
    from specdec_cli.target_model.native.kv_cache import native_cache_dtype

    seen = []
    monkeypatch.setattr(distill_cmd, "load_target", lambda *args, **kwargs: None)
    for stage in ("run_generate", "run_self_prompts"):
        monkeypatch.setattr(distill_cmd, stage, lambda *args, **kwargs: seen.append(str(native_cache_dtype())))
    for given in (["--kv-cache", "bfloat16"], []):
        answering = invoke("distill", "generate", "-o", tmp_path / "data.jsonl", "--suite", "builtin", "--max-prompts",
                           "1", *given)
        writing = invoke("distill", "prompts", "-o", tmp_path / "prompts.jsonl", *given)
        assert answering.returncode == writing.returncode == 0, answering.stderr + writing.stderr
    assert seen == ["torch.bfloat16"] * 2 + ["torch.float32"] * 2


@pytest.mark.parametrize("command", [["chat", "--prompt", "hi"], ["bench"], ["serve"],
                                     ["distill", "-o", "head"], ["distill", "generate", "-o", "d.jsonl"],
                                     ["distill", "prompts", "-o", "p.jsonl"],
                                     ["distill", "train", "--data", "d.jsonl", "-o", "head"],
                                     ["distill", "evaluate", "-D", "head"]])
def test_a_cache_it_does_not_know_is_one_line(command):
    assert_one_line_error(invoke(*command, "--kv-cache", "float16"), "--kv-cache must be one of float32, bfloat16")


def test_vllm_serving_and_answering_refuse_it(tmp_path):
    assert_one_line_error(invoke("serve", "--engine", "vllm", "--kv-cache", "bfloat16"),
                          "--kv-cache: only --engine specdec uses it")
    for command in (["distill", "-o", tmp_path / "head"], ["distill", "generate", "-o", tmp_path / "d.jsonl",
                                                          "--suite", "builtin"]):
        assert_one_line_error(invoke(*command, "--engine", "vllm", "--kv-cache", "bfloat16"),
                              "--kv-cache: only --engine specdec uses it")
