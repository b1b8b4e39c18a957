"""The prompt cache (decoding/prompt_cache.py): a prompt that begins as the previous context did computes only what
is new, and the answer is the one a cold prompt gets, token for token, on the native decoder's row-invariant blocks
(prompts longer than a block included) and on transformers' forward."""

from __future__ import annotations

import pytest
import torch
from conftest import fixed_engine
from helpers import EOS, family_model

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.decoding.prompt_cache import PromptCache
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import quant


def _sequence(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1, *torch.randint(4, 64, (length - 1,), generator=generator).tolist()]


def _config() -> GenerationConfig:
    return GenerationConfig(max_new_tokens=24, draft_max=7, eos_token_ids=(EOS,))


def _model(native: bool):
    model = family_model("llama", seed=11)
    if native:
        if not kernels.available():
            pytest.skip("specdec's CPU kernels are not compiled")
        quant.install_blocks(model, converted_blocks.plan_blocks(model, "int4", None))
    return model


@pytest.mark.parametrize("native", [True, False], ids=["native-blocks", "transformers"])
@pytest.mark.parametrize("drafter", ["none", "pld", "aded"])  # none, a chain, a tree
def test_a_conversation_resent_computes_only_its_new_tokens_and_answers_as_a_cold_prompt(native, drafter):
    model = _model(native)
    engine = fixed_engine(model)
    from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter

    def make():
        return make_drafter(drafter, DrafterOptions(), TargetInfo(64, (EOS,)))

    cache = PromptCache()
    first_prompt = _sequence(45, seed=1) + _sequence(15, seed=1)[1:]  # longer than a block (32 rows); repeats
    first = engine.generate(first_prompt, make(), _config(), prompt_cache=cache)
    assert first.cached_tokens == 0
    assert len(cache) == len(first_prompt) + len(first.tokens) - 1  # every committed token but the newest
    second_prompt = first_prompt + first.tokens + _sequence(12, seed=2)[1:]
    second = engine.generate(second_prompt, make(), _config(), prompt_cache=cache)
    assert second.cached_tokens == len(first_prompt) + len(first.tokens) - 1
    cold = engine.generate(second_prompt, make(), _config(), prompt_cache=PromptCache())
    assert cold.cached_tokens == 0 and second.tokens == cold.tokens
    again = engine.generate(second_prompt, make(), _config(), prompt_cache=cache)  # the same prompt once more
    assert again.cached_tokens == len(second_prompt) - 1 and again.tokens == cold.tokens


def test_the_cache_reuses_only_a_common_prefix_and_never_the_whole_prompt():
    cache = PromptCache()
    assert cache.common_prefix([1, 2, 3]) == 0
    model = _model(native=False)
    engine = fixed_engine(model)
    prompt = _sequence(20, seed=3)
    engine.generate(prompt, NoDrafter(), _config(), prompt_cache=cache)
    assert cache.common_prefix(prompt) == len(prompt) - 1  # its last token is computed for its logits
    assert cache.common_prefix(prompt[:5] + [7, 7, 7]) == 5
    other, held = cache.take([2, *prompt[1:]])
    assert held == 0 and other is None and len(cache) == 0  # nothing held in common: the engine starts a cache


@pytest.mark.parametrize("native", [True, False], ids=["native-blocks", "transformers"])
def test_a_copied_beginning_equals_the_entries_it_copies_and_stays_apart_from_them(native):
    model = _model(native)
    engine = fixed_engine(model)
    cache = PromptCache()
    prompt = _sequence(40, seed=4)
    engine.generate(prompt, NoDrafter(), _config(), prompt_cache=cache)
    held = cache.held[-1].cache
    copy = held.copy_prefix(17)
    assert type(copy) is type(held) and copy.get_seq_length() == 17
    for mine, theirs in zip(copy.layers, held.layers):
        assert torch.equal(mine.keys, theirs.keys[..., :17, :]) and torch.equal(mine.values, theirs.values[..., :17, :])
    before = held.layers[0].keys.clone()
    copy.layers[0].keys.fill_(float("nan"))  # the copy's buffers are its own
    assert torch.equal(held.layers[0].keys, before)
    with pytest.raises(ValueError):
        held.copy_prefix(held.get_seq_length() + 1)


@pytest.mark.parametrize("native", [True, False], ids=["native-blocks", "transformers"])
def test_with_several_entries_each_conversation_finds_its_own_and_shares_a_common_beginning(native):
    model = _model(native)
    engine = fixed_engine(model)
    cache = PromptCache(entries=2)
    system = _sequence(20, seed=5)  # what two conversations begin with (a system prompt)
    first_a = system + _sequence(14, seed=6)[1:]
    first_b = system + _sequence(9, seed=7)[1:]
    a = engine.generate(first_a, NoDrafter(), _config(), prompt_cache=cache)
    b = engine.generate(first_b, NoDrafter(), _config(), prompt_cache=cache)
    assert b.cached_tokens == len(system)  # a copy of the beginning conversation a's entry holds
    assert len(cache.held) == 2  # a's own entry stayed
    second_a = first_a + a.tokens + _sequence(6, seed=8)[1:]
    again_a = engine.generate(second_a, NoDrafter(), _config(), prompt_cache=cache)
    assert again_a.cached_tokens == len(first_a) + len(a.tokens) - 1  # its whole last turn, though b came after
    assert len(cache.held) == 2  # a's entry replaced by its longer one; b's kept
    for prompt, answer in ((first_b, b), (second_a, again_a)):
        cold = engine.generate(prompt, NoDrafter(), _config(), prompt_cache=PromptCache())
        assert answer.tokens == cold.tokens  # every answer is a cold prompt's
    third = _sequence(12, seed=9)
    engine.generate(third, NoDrafter(), _config(), prompt_cache=cache)  # a third conversation's entry...
    assert len(cache.held) == 2  # ...and b's, the least recently used, goes
    assert not any(entry.tokens[: len(first_b)] == first_b for entry in cache.held)
    assert cache.common_prefix(second_a + [5]) > len(second_a) - 1


def test_a_cache_of_one_entry_gives_it_up_to_any_prompt():
    cache = PromptCache()
    model = _model(native=False)
    engine = fixed_engine(model)
    prompt = _sequence(20, seed=10)
    engine.generate(prompt, NoDrafter(), _config(), prompt_cache=cache)
    taken, held = cache.take(prompt[:6] + [2, 2])
    assert held == 6 and taken.get_seq_length() == 6 and len(cache) == 0  # moved and cut, not copied
    with pytest.raises(ValueError):
        PromptCache(entries=0)


@pytest.mark.parametrize("entries", [1, 2])
def test_a_next_turn_computed_ahead_is_taken_whole_and_answers_as_a_cold_prompt(entries):
    """Engine.compute_ahead: the opening of a next turn computed into the held context while nobody waits (its
    answer's last token read back differently, as `.\\n\\n` is, so the entry is cut there first); the next prompt
    takes it whole and its answer is a cold prompt's, token for token, on the row-invariant blocks."""
    engine = fixed_engine(_model(native=True))
    cache = PromptCache(entries)
    other = engine.generate(_sequence(12, seed=15), NoDrafter(), _config(), prompt_cache=cache) if entries > 1 \
        else None  # (another conversation's entry, never touched)
    first_prompt = _sequence(40, seed=11)
    first = engine.generate(first_prompt, NoDrafter(), _config(), prompt_cache=cache)
    assert first.tokens[-2] != 5
    answer = first.tokens[:-2] + [5]  # its last two tokens (the newest not held) read back as one other token
    opening = first_prompt + answer + _sequence(6, seed=12)[1:]  # the template's end of it, a user turn's start
    assert engine.compute_ahead(cache, opening, len(first_prompt) + 1, most=32) == 1 + 5
    assert engine.compute_ahead(cache, opening, len(first_prompt) + 1, most=32) == 0  # all held already
    assert cache.common_prefix(opening + [9]) == len(opening)
    assert [entry.cache.get_seq_length() for entry in cache.held if entry.tokens == opening] == [len(opening)]
    second_prompt = opening + _sequence(8, seed=13)[1:]
    second = engine.generate(second_prompt, NoDrafter(), _config(), prompt_cache=cache)
    assert second.cached_tokens == len(opening)  # only the user's words and what follows them computed
    cold = engine.generate(second_prompt, NoDrafter(), _config(), prompt_cache=PromptCache())
    assert second.tokens == cold.tokens
    if other is not None:
        assert any(len(entry.tokens) == 12 + len(other.tokens) - 1 for entry in cache.held)


def test_computing_ahead_leaves_what_it_does_not_continue_and_forwards_that_round_in_pieces():
    engine = fixed_engine(_model(native=True))
    cache = PromptCache()
    prompt = _sequence(30, seed=14)
    engine.generate(prompt, NoDrafter(), _config(), prompt_cache=cache)
    kept = [list(entry.tokens) for entry in cache.held]
    elsewhere = prompt[:10] + _sequence(20, seed=16)  # shares 10 tokens: less than the conversation's prompt
    assert engine.compute_ahead(cache, elsewhere, len(prompt), most=32) == 0
    assert [entry.tokens for entry in cache.held] == kept and cache.held[0].cache.get_seq_length() == len(kept[0])
    longer = kept[0] + _sequence(50, seed=17)[1:]
    assert engine.compute_ahead(cache, longer, len(prompt), most=8) == 8  # at most `most`
    transformers_engine = fixed_engine(_model(native=False))
    cache = PromptCache()
    transformers_engine.generate(prompt, NoDrafter(), _config(), prompt_cache=cache)
    assert transformers_engine.compute_ahead(cache, cache.held[0].tokens + [5, 6], len(prompt), most=32) == 0
