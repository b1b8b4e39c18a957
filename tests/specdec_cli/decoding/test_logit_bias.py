"""`logit_bias` and OpenAI's presence and frequency penalties (the server's): each bias is added to its token's
logit in every choice, and each penalty taken off for the answer's tokens so far along the row's own draft path, so
greedy answers are transformers' with the same `sequence_bias` (or a processor taking the penalties off), whatever
is drafted (a banned or repeated token drafted in chains and trees at every depth), batched answers are each the
answer alone (test_batch.py), and sampling keeps the shaped law."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB, chi_square, hf_greedy
from test_engine import PROMPTS
from test_min_new_tokens import EndingDrafter

from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.errors import SpecdecError


def _biased_reference(model, prompt, bias: dict, new: int = 24) -> list[int]:
    """transformers' greedy decoding with each token's bias added to its logit (`sequence_bias` of one token)."""
    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None,
                             sequence_bias={(token,): value for token, value in bias.items()})
    return out[0, len(prompt):].tolist()


class _Penalties:
    """transformers logits processor: OpenAI's presence and frequency penalties over the tokens after the prompt."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)  # [1, vocab]
        for token in input_ids[0, self.prompt_len :].tolist():
            counts[0, token] += 1
        return scores - (self.frequency * counts + self.presence * (counts > 0))


def _penalised_reference(model, prompt, presence: float, frequency: float, new: int = 24) -> list[int]:
    from transformers import LogitsProcessorList

    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None,
                             logits_processor=LogitsProcessorList([_Penalties(len(prompt), presence, frequency)]))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("drafter", ["none", "pld", "repeated", "repeated-tree"])
def test_every_drafter_keeps_the_penalties_as_plain_decoding_does(tiny_model, prompt, drafter):
    """Drafts that repeat the answer's last token (what the penalties push down) and the true continuation."""
    free = hf_greedy(tiny_model, prompt, 24, eos=None)
    presence, frequency = 1.5, 0.75
    reference = _penalised_reference(tiny_model, prompt, presence, frequency)
    assert reference != free  # the penalties changed the answer

    class Repeating(EndingDrafter):
        def propose(self, context, budget):
            self.eos = context[-1]  # the token just written, drafted again first
            return super().propose(context, budget)

    made = {"none": lambda: NoDrafter(), "pld": lambda: PromptLookupDrafter(),
            "repeated": lambda: Repeating(reference, len(prompt), 0, tree=False),
            "repeated-tree": lambda: Repeating(reference, len(prompt), 0, tree=True)}[drafter]()
    config = GenerationConfig(max_new_tokens=24, draft_max=8, presence_penalty=presence, frequency_penalty=frequency,
                              cost_aware=False)
    generation = Engine(tiny_model).generate(prompt, made, config)
    assert generation.tokens == reference
    if drafter == "repeated-tree":
        assert generation.stats.accepted_tokens > 0


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("drafter", ["none", "pld", "banned", "banned-tree"])
def test_every_drafter_keeps_a_logit_bias_as_transformers_sequence_bias(tiny_model, prompt, drafter):
    free = hf_greedy(tiny_model, prompt, 24, eos=None)
    banned, favoured = free[1], (free[0] + 5) % TINY_VOCAB  # a token it writes early, and one it does not
    bias = {banned: -100.0, favoured: 2.5}
    reference = _biased_reference(tiny_model, prompt, bias)
    assert reference != free and banned not in reference  # the bias changed the answer
    made = {"none": lambda: NoDrafter(), "pld": lambda: PromptLookupDrafter(),
            "banned": lambda: EndingDrafter(reference, len(prompt), banned, tree=False),
            "banned-tree": lambda: EndingDrafter(reference, len(prompt), banned, tree=True)}[drafter]()
    config = GenerationConfig(max_new_tokens=24, draft_max=8, logit_bias=tuple(bias.items()), cost_aware=False)
    generation = Engine(tiny_model).generate(prompt, made, config)
    assert generation.tokens == reference
    if drafter == "banned-tree":
        assert generation.stats.accepted_tokens > 0  # the truth beside the banned token was taken


def test_sampling_with_a_logit_bias_keeps_the_biased_law(tiny_llama):
    """Seeded Monte-Carlo: the second new token (verified against drafts) follows the biased model's law."""
    from specdec_cli.decoding.sampling import warp_probs

    prompt = [1, 10, 11, 12, 10, 11]
    bias = torch.zeros(TINY_VOCAB)
    with torch.inference_mode():
        first = tiny_llama(torch.tensor([prompt])).logits[0, -1]  # [vocab]
    boosted, cut = int(first.argsort()[-3]), int(first.argmax())
    bias[boosted], bias[cut] = 1.5, -2.0
    with torch.inference_mode():
        first = warp_probs(first + bias, 1.0)  # [V]
        second = warp_probs(tiny_llama(torch.tensor([prompt + [t] for t in range(TINY_VOCAB)])).logits[:, -1] + bias,
                            1.0)  # [V, V]
    _assert_second_token_law(tiny_llama, prompt, first, second, logit_bias=((boosted, 1.5), (cut, -2.0)))


def test_sampling_with_penalties_keeps_the_penalised_law(tiny_llama):
    """Seeded Monte-Carlo: the second new token, after a first one the penalties count, follows the law of the
    model's logits less the penalties for that first token. A bias makes one token the likely first and second
    choice, so that the penalties' share of the law is large enough to tell (a law without them fails)."""
    from specdec_cli.decoding.sampling import warp_probs

    prompt = [1, 10, 11, 12, 10, 11]
    presence, frequency = 1.0, 0.5
    bias = torch.zeros(TINY_VOCAB)
    with torch.inference_mode():
        logits = tiny_llama(torch.tensor([prompt])).logits[0, -1]  # [V]
        favoured = int(logits.argsort()[-3])
        bias[favoured] = 8.0
        first = warp_probs(logits + bias, 1.0)  # [V]
        second = tiny_llama(torch.tensor([prompt + [t] for t in range(TINY_VOCAB)])).logits[:, -1] + bias  # [V, V]
        second = warp_probs(second - (presence + frequency) * torch.eye(TINY_VOCAB), 1.0)  # row t1: t1 penalised
    _assert_second_token_law(tiny_llama, prompt, first, second, presence_penalty=presence,
                             frequency_penalty=frequency, logit_bias=((favoured, 8.0),))


def _assert_second_token_law(model, prompt, first, second, **settings) -> None:
    """Seeded Monte-Carlo over 800 answers of two tokens (the second verified against `pld`'s drafts) with
    `settings`: the second token follows sum over t1 of first[t1] * second[t1] ([V] and [V, V] laws)."""
    law = (first.unsqueeze(1) * second).sum(0).double()
    counts = torch.zeros(TINY_VOCAB, dtype=torch.float64)
    engine, drafter = Engine(model), PromptLookupDrafter()
    for seed in range(800):
        config = GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed, draft_max=3, cost_aware=False,
                                  **settings)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


@pytest.mark.parametrize("name, value", [("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                         ("presence_penalty", float("nan"))])
def test_a_penalty_out_of_range_is_one_line(name, value):
    with pytest.raises(SpecdecError, match=name) as error:
        GenerationConfig(**{name: value}).check()
    assert error.value.setting == name


@pytest.mark.parametrize("bias, needle", [(((-1, 1.0),), "token ids >= 0"), (((3, 101.0),), "[-100, 100]"),
                                          (((3, float("nan")),), "[-100, 100]"), (((10**6, 1.0),), "vocabulary")])
def test_a_bad_logit_bias_is_one_line(tiny_model, bias, needle):
    config = GenerationConfig(max_new_tokens=4, logit_bias=bias)
    with pytest.raises(SpecdecError, match="logit_bias") as error:
        Engine(tiny_model).generate(PROMPTS[0], NoDrafter(), config)
    assert needle in str(error.value) and error.value.setting == "logit_bias"
