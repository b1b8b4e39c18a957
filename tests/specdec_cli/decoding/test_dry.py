"""DRY, llama.cpp's sequence penalty (decoding/dry.py): the penalties against the definition counted by brute
force (and the worked example of llama.cpp's comments), breakers as token sequences, and every drafter's greedy
answer under DRY equal to transformers' greedy decoding with a processor that applies the brute-force penalties:
each verify row counts its own draft path."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import hf_greedy
from test_engine import PROMPTS
from test_penalties import _drafter, _reference

from specdec_cli.decoding.dry import Breakers, DryPenalty, dry_penalties, token_breakers
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.errors import SpecdecError


def _brute(window: list[int], dry: DryPenalty, breakers: Breakers) -> dict[int, float]:
    """The definition, counted naively: the stretch back to the latest breaker; for each earlier end, how many of
    the tokens before it equal the window's end (within that stretch); the longest per following token."""
    count = len(window)
    if dry.multiplier == 0 or count <= dry.allowed_length:
        return {}
    limit = count
    for head in range(count - 1, -1, -1):  # the breaker nearest the end: its head, its longest tail after it
        fits = [len(tail) for tail in breakers.tails.get(window[head], ())
                if window[head + 1 : head + 1 + len(tail)] == list(tail) and head + len(tail) < count]
        if fits:
            limit = count - 1 - head - max(fits)
            break
    if limit < dry.allowed_length:
        return {}
    longest: dict[int, int] = {}
    for end in range(count - 1):
        length = 0
        while length < end + 1 and window[end - length] == window[count - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= dry.allowed_length:
            longest[window[end + 1]] = max(longest.get(window[end + 1], 0), length)
    return {token: dry.multiplier * dry.base ** (length - dry.allowed_length) for token, length in longest.items()
            if token not in breakers.whole}


def test_the_worked_example():
    """llama.cpp's example: after `a b c c b c y a b c`, emitting c would repeat `a b c` (3), y `b c` (2), b `c`
    (1: under the allowed length of 2, no penalty)."""
    a, b, c, y = 1, 2, 3, 4
    window = np.array([a, b, c, c, b, c, y, a, b, c])
    dry = DryPenalty(multiplier=0.8, base=1.75, allowed_length=2)
    assert dry_penalties(window, dry, Breakers()) == pytest.approx({c: 0.8 * 1.75, y: 0.8})


def test_a_breaker_stops_the_count_and_is_never_penalised():
    colon, newline = 9, 8
    breakers = Breakers({colon: ((),), newline: ((),)}, frozenset({colon, newline}))
    dry = DryPenalty(multiplier=1.0, base=2.0, allowed_length=1)
    # `1 2 3 : 1 2 3`: the stretch after the ':' is 3 long, so 1 2 3 before it counts 3 (not more), and ':' after
    # `1 2 3` (a repeat of 3) is a breaker: not penalised
    window = [5, 1, 2, 3, colon, 6, 1, 2, 3]
    got = dry_penalties(np.array(window), dry, breakers)
    assert got == _brute(window, dry, breakers) and colon not in got
    window = [1, 2, 3, 4, 1, 2, 3, newline, 1, 2, 3]  # the stretch is 3: `1 2 3` matches 3, the count stops there
    assert dry_penalties(np.array(window), dry, breakers) == pytest.approx({4: 4.0})


@pytest.mark.parametrize("allowed, base", [(0, 1.0), (1, 1.5), (2, 1.75), (3, 3.0)])
def test_penalties_equal_the_definition_counted_by_brute_force(allowed, base):
    rng = random.Random(allowed)
    breakers = Breakers({7: ((),), 5: ((6,), (6, 6))}, frozenset({7}))  # 7 a breaker; 5 followed by 6 (or 6 6)
    dry = DryPenalty(multiplier=0.7, base=base, allowed_length=allowed)
    for _ in range(300):
        window = [rng.randrange(8 if rng.random() < 0.3 else 4) for _ in range(rng.randrange(0, 40))]
        got = dry_penalties(np.array(window, dtype=np.int64), dry, breakers)
        assert got == pytest.approx(_brute(window, dry, breakers)), window


def test_the_exponent_is_capped_where_float32_would_overflow():
    window = np.array([1, 2] * 200)
    got = dry_penalties(window, DryPenalty(multiplier=1.0, base=10.0, allowed_length=2), Breakers())
    assert 0 < got[1] < float(np.finfo(np.float32).max) and got[1] == 10.0 ** int(88.7228391 / np.log(10.0))


def test_breakers_become_token_sequences_as_llama_cpp_matches_them():
    texts = ["a", "b", "\n", "x:", "ab", "q*a", "ba", "end\n\n"]

    def encode(text):
        return [texts.index(char) for char in text]

    got = token_breakers(texts, encode, ["\n", ":", "ab"])
    assert got.whole == {2, 3, 4, 7}  # texts holding a breaker whole
    assert got.tails[0] == ((1,),)  # "a" ends in the beginning of "ab": then "b"
    assert got.tails[5] == ((1,),) and got.tails[6] == ((1,),)  # "q*a", "ba" end in "a"
    assert 1 not in got.tails  # "b" begins no breaker


def _dry_processor(dry: DryPenalty, breakers: Breakers):
    class Dry:
        def __call__(self, input_ids, scores):
            seen = input_ids[0].tolist()
            window = seen[-dry.last_n:] if dry.last_n > 0 else seen
            for token, penalty in _brute(window, dry, breakers).items():
                scores[0, token] -= torch.tensor(penalty, dtype=torch.float32).to(scores.dtype)
            return scores

    return Dry()


class _Letters:
    """A tokenizer for the tiny models: token t is one letter; 3 is a line end (a breaker)."""

    def __len__(self):
        return 64

    def decode(self, ids, skip_special_tokens=False):
        return "".join("\n" if token == 3 else chr(ord("A") + token % 58) for token in ids)

    def encode(self, text, add_special_tokens=False):
        return [3 if char == "\n" else ord(char) - ord("A") for char in text]


@pytest.mark.parametrize("prompt, allowed, last_n", [(PROMPTS[0], 1, -1), (PROMPTS[0], 0, 6), (PROMPTS[1], 0, -1)])
@pytest.mark.parametrize("drafter", ["none", "pld", "truth", "truth-tree"])
def test_every_drafter_keeps_dry_as_plain_decoding_does(tiny_model, prompt, allowed, last_n, drafter):
    """Drafts of 8 (the truth deep into chains, past a window of 6; a repeated token beside it in trees) are judged
    row by row, each counting its own path."""
    from transformers import LogitsProcessorList

    from specdec_cli.decoding.dry import breakers_for

    tokenizer = _Letters()
    dry = DryPenalty(multiplier=2.0, base=1.75, allowed_length=allowed, last_n=last_n)
    breakers = breakers_for(tokenizer, dry.breakers)
    assert breakers.whole == {3}
    reference = _reference(tiny_model, prompt, new=48,
                           logits_processor=LogitsProcessorList([_dry_processor(dry, breakers)]))
    assert reference != hf_greedy(tiny_model, prompt, 48, eos=None)  # DRY changed the answer
    config = GenerationConfig(max_new_tokens=48, draft_max=8, dry=dry, cost_aware=False)
    generation = Engine(tiny_model, tokenizer).generate(prompt, _drafter(drafter, reference, len(prompt)), config)
    assert generation.tokens == reference
    if drafter.startswith("truth"):
        assert generation.stats.accepted_tokens > len(reference) // 2


def test_dry_needs_a_tokenizer(tiny_model):
    with pytest.raises(SpecdecError, match="DRY sequence breakers need the target's tokenizer"):
        Engine(tiny_model).generate(PROMPTS[0], _drafter("none", [], 0), GenerationConfig(dry=DryPenalty(1.0)))


@pytest.mark.parametrize("settings, name", [({"multiplier": -1.0}, "dry_multiplier"), ({"base": 0.5}, "dry_base"),
                                            ({"allowed_length": -1}, "dry_allowed_length"),
                                            ({"last_n": -2}, "dry_penalty_last_n"),
                                            ({"breakers": ()}, "dry_sequence_breakers"),
                                            ({"breakers": ("",)}, "dry_sequence_breakers")])
def test_a_bad_dry_setting_is_one_line(settings, name):
    with pytest.raises(SpecdecError, match=name) as error:
        GenerationConfig(dry=DryPenalty(**{"multiplier": 1.0, **settings})).check()
    assert error.value.setting == name


def test_sampling_with_dry_keeps_the_penalised_law(tiny_llama):
    """Seeded Monte-Carlo: the second new token (verified against prompt lookup's drafts) follows the law of the
    model's logits less DRY's penalties after the prompt and whichever first token was drawn."""
    from conftest import TINY_VOCAB, chi_square

    from specdec_cli.decoding.dry import breakers_for
    from specdec_cli.decoding.sampling import warp_probs
    from specdec_cli.drafters.pld import PromptLookupDrafter

    prompt, tokenizer = [1, 10, 11, 12, 10, 11, 12, 10, 11], _Letters()
    dry = DryPenalty(multiplier=3.0, base=2.0, allowed_length=0)  # every token seen penalised, repeats more
    breakers = breakers_for(tokenizer, dry.breakers)

    def penalised(logits, window):  # logits [V] after `window`
        for token, penalty in _brute(window, dry, breakers).items():
            logits[token] -= penalty
        return logits

    with torch.inference_mode():
        first = warp_probs(penalised(tiny_llama(torch.tensor([prompt])).logits[0, -1].clone(), prompt), 1.0)  # [V]
        second = tiny_llama(torch.tensor([prompt + [t] for t in range(TINY_VOCAB)])).logits[:, -1].clone()  # [V, V]
        second = warp_probs(torch.stack([penalised(second[t], prompt + [t]) for t in range(TINY_VOCAB)]), 1.0)
    law = (first.unsqueeze(1) * second).sum(0).double()
    counts = torch.zeros(TINY_VOCAB, dtype=torch.float64)
    engine, drafter = Engine(tiny_llama, tokenizer), PromptLookupDrafter()
    for seed in range(800):
        config = GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed, draft_max=3, cost_aware=False, dry=dry)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)
