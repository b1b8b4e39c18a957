"""Log probabilities of committed tokens (decoding/logprobs.py through the engine): the same bits with drafts as
without, every draft accepted (an oracle drafter) or none; what an independent forward gives; the rows that chose a
step's tokens, for chains and trees."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_EOS, fixed_engine
from helpers import IdsTokenizer

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.decoding.logprobs import choosing_rows, token_logprobs
from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
from specdec_cli.drafters.oracle import OracleDrafter

VOCAB = 64
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 30, 31, 32, 33, 30, 31]]



@pytest.fixture(scope="module")
def target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         initializer_range=0.3, eos_token_id=TINY_EOS, bos_token_id=1,
                                         pad_token_id=0)).eval()
    return model


def _scored(generation) -> list:
    return [entry for event in generation.events for entry in (event.logprobs or [])]


def _config(**changes) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": 20, "eos_token_ids": (TINY_EOS,), "draft_max": 4, "logprobs": 3,
                               "cost_aware": False, **changes})


def _targets():
    yield "dense"
    if kernels.available():
        yield "blocks"


@pytest.mark.parametrize("weights", list(_targets()))
def test_logprobs_are_plain_decodings_bits_with_every_draft_accepted_or_none(target, weights):
    model = target
    if weights == "blocks":
        from specdec_cli.target_model.load import converted_blocks
        from specdec_cli.target_model.native import quant

        model = copy.deepcopy(target)
        quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    engine = fixed_engine(model, exact=True)  # (exact verification: each row's bits whatever the block)
    none = make_drafter("none", DrafterOptions(), target_info(model, IdsTokenizer(VOCAB)))
    for prompt in PROMPTS:
        plain = engine.generate(prompt, none, _config())
        scored = _scored(plain)
        assert [entry.token for entry in scored] == plain.tokens
        assert all(len(entry.top) == 3 and entry.top[0][1] >= entry.logprob for entry in scored)
        assert all(entry.top[0][0] == entry.token for entry in scored)  # greedy: the likeliest
        oracle = engine.generate(prompt, OracleDrafter([plain.tokens], 4), _config())
        assert oracle.tokens == plain.tokens and oracle.stats.accepted_tokens >= len(plain.tokens) // 2
        assert _scored(oracle) == scored  # the same bits, read from other rows of other forwards
        assert engine.generate(prompt, none, _config(logprobs=None)).events[1].logprobs is None


def test_logprobs_match_an_independent_forward(target):
    engine = fixed_engine(target)
    none = make_drafter("none", DrafterOptions(), target_info(target, IdsTokenizer(VOCAB)))
    prompt = PROMPTS[0]
    generation = engine.generate(prompt, none, _config(logprobs=0))
    ids = torch.tensor([prompt + generation.tokens])
    with torch.no_grad():
        logits = target(ids).logits[0, len(prompt) - 1 : -1]  # [answer, vocab]: the rows that chose the answer
    expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(generation.tokens)[:, None])[:, 0]
    got = torch.tensor([entry.logprob for entry in _scored(generation)])
    assert torch.allclose(got, expected, atol=1e-4)
    assert all(entry.top == () for entry in _scored(generation))


def test_the_rows_that_chose_a_steps_tokens():
    assert choosing_rows([]) == [0]  # no draft accepted: the root chose the target's token
    assert choosing_rows([0, 1, 2]) == [0, 1, 2, 3]  # a chain
    assert choosing_rows([1, 4]) == [0, 2, 5]  # a tree's path: node 1 (row 2), then node 4 (row 5)
    rows = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    [first, second] = token_logprobs(rows, [1, 2], 2)
    assert first.token == 1 and abs(first.logprob - torch.log(torch.tensor(0.25)).item()) < 1e-6
    assert [token for token, _ in first.top] == [0, 1] and second.top[0][0] == 2
    assert token_logprobs(rows, [], 2) == []
