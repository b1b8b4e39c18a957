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


@pytest.mark.parametrize("command", [["chat", "--prompt", "hi"], ["bench"], ["serve"]])
def test_a_cache_it_does_not_know_is_one_line(command):
    assert_one_line_error(invoke(*command, "--kv-cache", "float16"), "--kv-cache must be one of float32, bfloat16")


def test_vllm_serving_refuses_it():
    assert_one_line_error(invoke("serve", "--engine", "vllm", "--kv-cache", "bfloat16"),
                          "--kv-cache: only --engine specdec uses it")
