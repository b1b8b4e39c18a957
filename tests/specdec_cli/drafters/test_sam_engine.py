"""The sam drafter through the engine: greedy output is token-identical to plain greedy decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY_EOS, hf_greedy, invoke

from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.drafters.sam import SamDrafter
from specdec_cli.sam.automaton import build_static

PROMPTS = [[1, 10, 11, 12, 13, 10, 11, 12, 13, 10], [1, 30, 31, 32, 33], [1, 7]]


def _static_from_reference(model, prompts):
    """An index over the model's own answers (the corpus SAM-Decoding found best), EOS-separated."""
    corpus: list[int] = []
    for prompt in prompts:
        corpus += prompt + hf_greedy(model, prompt, 60) + [TINY_EOS]
    return build_static(np.array(corpus, dtype=np.int32), separators=(TINY_EOS,))


@pytest.mark.parametrize("with_index", [False, True])
@pytest.mark.parametrize("cost_aware", [False, True])
def test_sam_greedy_identical(tiny_model, with_index, cost_aware):
    static = _static_from_reference(tiny_model, PROMPTS) if with_index else None
    engine = Engine(tiny_model)
    steps = committed = 0
    for prompt in PROMPTS:
        reference = hf_greedy(tiny_model, prompt, 48)
        drafter = SamDrafter(static, separators=(TINY_EOS,))
        config = GenerationConfig(max_new_tokens=48, draft_max=16, eos_token_ids=(TINY_EOS,), cost_aware=cost_aware)
        generation = engine.generate(prompt, drafter, config)
        assert generation.tokens == reference
        steps += generation.stats.steps
        committed += generation.stats.new_tokens - 1  # the prefill's token is not a step's
    if with_index and not cost_aware:  # the index holds these very answers: long accepted drafts
        assert committed / steps > 2.0


def test_sam_multi_turn_keeps_learning(tiny_llama):
    """One drafter over two turns: the second prompt re-sends the first; output stays identical."""
    engine = Engine(tiny_llama)
    drafter = SamDrafter(None, separators=(TINY_EOS,))
    config = GenerationConfig(max_new_tokens=32, draft_max=8, eos_token_ids=(TINY_EOS,), cost_aware=False)
    first_prompt = PROMPTS[0]
    first = engine.generate(first_prompt, drafter, config)
    second_prompt = first_prompt + first.tokens + [5, 10, 11]
    second = engine.generate(second_prompt, drafter, config)
    assert first.tokens == hf_greedy(tiny_llama, first_prompt, 32)
    assert second.tokens == hf_greedy(tiny_llama, second_prompt, 32)


@pytest.mark.real_model
def test_real_model_sam_with_index_is_lossless(shared_real_model, tmp_path):
    """build-index over the sample corpus, then greedy chat --json: identical to --drafter none (in process, on the
    session's copy of the model)."""
    index = tmp_path / "corpus.sam"
    built = invoke("build-index", "corpora/python_answers.jsonl", "-o", str(index))
    assert built.returncode == 0, built.stderr
    prompt = "Write a Python function that reads a text file and returns the number of lines, words and characters."
    outputs = {}
    for drafter in ("none", "pld", "sam"):
        extra = ["--index", str(index)] if drafter == "sam" else []
        result = invoke("chat", "--prompt", prompt, "--drafter", drafter, "-n", "96", "--json", *extra)
        assert result.returncode == 0, result.stderr
        outputs[drafter] = json.loads(result.stdout)
    assert outputs["sam"]["output_token_ids"] == outputs["none"]["output_token_ids"]
    assert outputs["pld"]["output_token_ids"] == outputs["none"]["output_token_ids"]
