"""Many answers per forward (decoding/plain_many.py, native.py `many`): each answer bit-identical to plain decoding
of its prompt alone (greedy, and sampled with the same seed), on tiny block models of several families and on the
real default model's GGUF."""

from __future__ import annotations

import pytest
import torch
from conftest import fixed_engine
from helpers import EOS, PROMPTS, family_model

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.decoding.plain_many import plain_many
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import quant
from specdec_cli.target_model.native.kv_cache import KVCache
from specdec_cli.target_model.native.native import ROW_INVARIANT_ROWS, Part
from specdec_cli.target_model.verify.exact_setup import NativeForward

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

NEW = 24
# attention kinds the many-sequence forward must keep apart: plain GQA, sliding windows with soft-capped scores,
# local and global layers, QK-norm, fused q/k/v
FAMILIES = [("llama", "int4"), ("gemma2", "int8"), ("gemma3_text", "int4"), ("qwen3", "int4"), ("phi3", "int4")]


def _prompts() -> list[list[int]]:
    """Prompts of many lengths: one token, the helpers' two, and one longer than a row-invariant block."""
    generator = torch.Generator().manual_seed(3)
    longer = [1, *torch.randint(4, 64, (ROW_INVARIANT_ROWS + 9,), generator=generator).tolist()]
    return [[1], *PROMPTS, longer, [1, 7, 7, 7], [1, 30, 31]]


@pytest.fixture(scope="module", params=FAMILIES, ids=[family for family, _ in FAMILIES])
def block_model(request):
    family, mode = request.param
    model = family_model(family, seed=5)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, mode, None))
    return model


def _config(new=NEW, **settings) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": new, "eos_token_ids": (EOS,), **settings})


def _plain(model, prompts, new=NEW, seeds=None, **settings):
    engine = fixed_engine(model)
    answers = [engine.generate(prompt, NoDrafter(), _config(new, seed=None if seeds is None else seeds[index],
                                                            **settings))
               for index, prompt in enumerate(prompts)]
    assert isinstance(engine.forward, NativeForward) and engine.forward.outcome.state == "on"
    return engine.forward, answers


@pytest.mark.parametrize("width", [1, 3, 32])
def test_answers_in_batches_are_plain_greedy_answers(block_model, width):
    prompts = _prompts()
    forward, plain = _plain(block_model, prompts)
    ended = []
    answers = plain_many(forward, prompts, _config(), width=width, on_answer=ended.append)
    assert ended == answers and sorted(answer.index for answer in answers) == list(range(len(prompts)))
    for answer in answers:
        assert answer.tokens == plain[answer.index].tokens, (block_model.config.model_type, width, answer.index)
        assert answer.finish_reason == plain[answer.index].finish_reason


@torch.inference_mode()  # (the decoder's buffers were made in inference mode, by the engine)
@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}])
def test_sampled_answers_in_batches_are_plain_sampled_answers_with_their_seeds(block_model, settings):
    prompts = _prompts()
    seeds = [100 + index for index in range(len(prompts))]
    forward, plain = _plain(block_model, prompts, seeds=seeds, **settings)
    answers = plain_many(forward, prompts, _config(**settings), width=4, seeds=seeds)
    for answer in answers:
        assert answer.tokens == plain[answer.index].tokens, (block_model.config.model_type, answer.index)
    assert len({tuple(answer.tokens) for answer in answers}) > 1


@torch.inference_mode()  # (the decoder's buffers were made in inference mode, by the engine)
def test_a_forward_over_several_sequences_gives_each_the_bits_it_gets_alone(block_model):
    """Logits and features of every row, several sequences at once, equal a forward of each alone, bit for bit."""
    forward, _ = _plain(block_model, [PROMPTS[0]], new=2)
    decoder = forward.decoder
    contexts = _prompts()[1:4]
    alone, together = [], []
    for context in contexts:  # each alone: its prompt, then a 3-token chain after it
        cache = KVCache()
        decoder(torch.tensor([context[:-3]]), torch.arange(len(context) - 3)[None], cache)
        out = decoder(torch.tensor([context[-3:]]), torch.arange(len(context) - 3, len(context))[None], cache,
                      output_hidden_states=True)
        alone.append((out.logits[0], out.hidden_states[-1][0]))
        together.append(KVCache())
        decoder(torch.tensor([context[:-3]]), torch.arange(len(context) - 3)[None], together[-1])
    parts = [Part(torch.tensor(context[-3:]), torch.arange(len(context) - 3, len(context)), cache)
             for context, cache in zip(contexts, together)]
    logits, features = decoder.many(parts)  # [9, vocab], [9, hidden]
    for index, (expected_logits, expected_features) in enumerate(alone):
        assert torch.equal(logits[3 * index : 3 * index + 3], expected_logits)
        assert torch.equal(features[3 * index : 3 * index + 3], expected_features)
        assert together[index].get_seq_length() == len(contexts[index])


def test_an_answer_that_ends_leaves_its_place_to_a_waiting_prompt():
    model = family_model("llama", seed=5)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int4", None))
    prompts = _prompts()
    forward, plain = _plain(model, prompts)
    never = [token for token in range(4, 64) if all(token not in answer.tokens for answer in plain)]
    first = plain[0].tokens
    eos = next(token for token in first[2:] if token not in first[: first.index(token)] and token != EOS)
    stop = first.index(eos)
    answers = plain_many(forward, prompts, _config(eos_token_ids=(eos, *never[:1])), width=2)
    by_index = {answer.index: answer for answer in answers}
    assert [answer.index for answer in answers][0] == 0  # the first to end, while the second goes on
    assert by_index[0].tokens == first[: stop + 1] and by_index[0].finish_reason == "eos"
    for index in range(1, len(prompts)):
        expected = plain[index].tokens
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert by_index[index].tokens == expected


def test_too_many_rows_or_a_bad_width_are_refused(block_model):
    forward, _ = _plain(block_model, [PROMPTS[0]], new=2)
    with pytest.raises(ValueError, match="at most"):
        forward.decoder.many([Part(torch.tensor([1]), torch.tensor([0]), KVCache())] * (ROW_INVARIANT_ROWS + 1))
    with pytest.raises(ValueError, match="width"):
        plain_many(forward, [[1]], _config(4), width=0)
    with pytest.raises(ValueError, match="seeds"):
        plain_many(forward, [[1]], _config(4), width=1, seeds=[1, 2])
    with pytest.raises(TypeError):
        plain_many(object(), [[1]], _config(4), width=1)


def test_the_default_ggufs_answers_in_batches_are_its_plain_answers(real_target):
    from specdec_cli.decoding.engine import Engine
    from specdec_cli.drafters import target_info
    from specdec_cli.texts.prompt_ids import format_prompt

    target = real_target("float32", "gguf")
    info = target_info(target.model, target.tokenizer)
    questions = ["Name three colours.", "Write a Python function that reverses a string.", "What is 7 times 8?",
                 "Give one tip for sleeping well."]
    prompts = [format_prompt(target.tokenizer, [{"role": "user", "content": text}]) for text in questions]
    engine = Engine(target.model, target.tokenizer)
    config = GenerationConfig(max_new_tokens=40, eos_token_ids=info.eos_token_ids, cost_aware=False)
    plain = [engine.generate(prompt, NoDrafter(), config) for prompt in prompts]
    answers = plain_many(engine.forward, prompts, config, width=3)
    for answer in answers:
        assert answer.tokens == plain[answer.index].tokens, questions[answer.index]
        assert answer.finish_reason == plain[answer.index].finish_reason
