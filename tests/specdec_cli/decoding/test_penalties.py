"""The repetition penalty and llama.cpp's windowed penalties (decoding/penalties.py): each verify row counts the
context and its own draft path (the last n tokens of them, in llama.cpp's window), so greedy answers are
transformers' `repetition_penalty`, or a processor doing what llama.cpp's sampler does, whatever is drafted (the
truth deep into a chain, past the window; a counted token beside it in trees), and sampling keeps the penalised
law. `counted` is checked against counting every row's tokens by brute force."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TINY_VOCAB, hf_greedy
from test_engine import PROMPTS
from test_logit_bias import _assert_second_token_law

from specdec_cli.decoding.draft import NOTHING, Draft
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.penalties import counted
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.errors import SpecdecError


def _random_draft(rng: random.Random, size: int, tree: bool) -> Draft:
    tokens = [rng.randrange(6) for _ in range(size)]
    if not tree:
        return Draft(tokens, "chain")
    return Draft(tokens, "tree", parents=[rng.randrange(-1, node) for node in range(size)])


def _brute_counts(history: list[int], draft: Draft, rows: int, window) -> dict:
    """{(row, token): count} by listing each row's tokens (history, then its path; the last `window` of them)."""
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft.tokens) - 1))
    found = {}
    for row in range(rows):
        path, node = [], row - 1 if row - 1 < len(draft.tokens) else -1
        while node >= 0:
            path.insert(0, draft.tokens[node])
            node = parents[node]
        seen = history + path
        for token in seen if window is None else seen[max(0, len(seen) - window):]:
            found[row, token] = found.get((row, token), 0) + 1
    return found


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("window", [None, 1, 2, 3, 5, 50])
def test_each_row_counts_what_its_context_and_path_hold(tree, window):
    rng = random.Random(7)
    for trial in range(40):
        history = [rng.randrange(6) for _ in range(rng.randrange(0, 9))]
        draft = _random_draft(rng, rng.randrange(0, 9), tree)
        rows = len(draft.tokens) + 1 + rng.randrange(0, 3)  # padding rows count as row 0
        columns, counts = counted(history, draft, rows, window)
        assert columns.tolist() == sorted(set(columns.tolist()))
        got = {(row, token): int(counts[row, column]) for row in range(rows)
               for column, token in enumerate(columns.tolist()) if counts[row, column]}
        assert got == _brute_counts(history, draft, rows, window), (trial, history, draft)


class _LlamaCppPenalties:
    """A transformers logits processor doing what llama.cpp's penalties sampler does: the last `last_n` tokens of
    the prompt and the answer (-1: all), each counted token's logit divided by `repeat` where positive and
    multiplied where not, then less presence once and frequency per occurrence."""

    def __init__(self, last_n: int, repeat: float, presence: float, frequency: float):
        self.last_n, self.repeat, self.presence, self.frequency = last_n, repeat, presence, frequency

    def __call__(self, input_ids, scores):
        seen = input_ids[0].tolist()
        counts = torch.zeros_like(scores)  # [1, vocab]
        for token in seen if self.last_n == -1 else seen[-self.last_n:]:
            counts[0, token] += 1
        scores = torch.where(counts > 0, torch.where(scores > 0, scores / self.repeat, scores * self.repeat), scores)
        return scores - (self.frequency * counts + self.presence * (counts > 0))


def _reference(model, prompt, new: int = 24, **settings) -> list[int]:

    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None,
                             **settings)
    return out[0, len(prompt):].tolist()


def _llama_cpp_reference(model, prompt, last_n, repeat, presence, frequency):
    from transformers import LogitsProcessorList

    return _reference(model, prompt, logits_processor=LogitsProcessorList(
        [_LlamaCppPenalties(last_n, repeat, presence, frequency)]))


class _Truthful:
    """Drafts the reference's next tokens as a chain (rows deep in the path, past a short window), or a tree with
    the context's newest token (one every penalty counts) beside the truth at every depth."""

    needs = NOTHING

    def __init__(self, reference: list[int], prompt_len: int, tree: bool):
        self.name = "truth-tree" if tree else "truth"
        self.reference, self.prompt_len, self.tree = reference, prompt_len, tree

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        truth = self.reference[done : done + budget]
        if not self.tree:
            return Draft(truth, self.name)
        tokens, parents, parent = [], [], -1
        for depth, token in enumerate(truth[: budget // 2]):
            siblings = [context[-1], token] if depth % 2 else [token, context[-1]]
            first = len(tokens)
            tokens += siblings
            parents += [parent, parent]
            parent = first + siblings.index(token)
        return Draft(tokens, self.name, parents=parents)

    def observe(self, event):
        pass

    def reset(self):
        pass


def _drafter(name: str, reference: list[int], prompt_len: int):
    return {"none": lambda: NoDrafter(), "pld": lambda: PromptLookupDrafter(),
            "truth": lambda: _Truthful(reference, prompt_len, tree=False),
            "truth-tree": lambda: _Truthful(reference, prompt_len, tree=True)}[name]()


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("drafter", ["none", "pld", "truth", "truth-tree"])
def test_every_drafter_keeps_the_repetition_penalty_as_transformers(tiny_model, prompt, drafter):
    """transformers' (and vLLM's) repetition_penalty: the prompt's tokens and the answer's, no window."""
    reference = _reference(tiny_model, prompt, repetition_penalty=1.8)
    assert reference != hf_greedy(tiny_model, prompt, 24, eos=None)  # the penalty changed the answer
    config = GenerationConfig(max_new_tokens=24, draft_max=8, repetition_penalty=1.8, cost_aware=False)
    generation = Engine(tiny_model).generate(prompt, _drafter(drafter, reference, len(prompt)), config)
    assert generation.tokens == reference
    if drafter.startswith("truth"):
        assert generation.stats.accepted_tokens > len(reference) // 2


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("drafter", ["none", "pld", "truth", "truth-tree"])
@pytest.mark.parametrize("last_n", [3, 16, -1])
def test_every_drafter_keeps_llama_cpp_windowed_penalties(tiny_model, prompt, drafter, last_n):
    """llama.cpp's repeat_last_n: all three penalties over the last n tokens of prompt and answer; with n = 3 and
    drafts of 8 the window slides past the context along a row's path."""
    settings = {"repeat": 2.0, "presence": 1.5, "frequency": 0.5}
    reference = _llama_cpp_reference(tiny_model, prompt, last_n, **settings)
    if last_n == -1:
        assert reference != hf_greedy(tiny_model, prompt, 24, eos=None)  # the penalties changed the answer
    else:  # and the window did: counting more than its tokens would not give this answer
        assert reference != _llama_cpp_reference(tiny_model, prompt, -1, **settings)
    config = GenerationConfig(max_new_tokens=24, draft_max=8, repetition_penalty=settings["repeat"],
                              presence_penalty=settings["presence"], frequency_penalty=settings["frequency"],
                              penalty_last_n=last_n, cost_aware=False)
    generation = Engine(tiny_model).generate(prompt, _drafter(drafter, reference, len(prompt)), config)
    assert generation.tokens == reference
    if drafter.startswith("truth"):
        assert generation.stats.accepted_tokens > len(reference) // 2


def test_a_window_of_none_is_no_penalty(tiny_model):
    """llama.cpp's repeat_last_n = 0 turns every penalty off, whatever they are set to."""
    prompt = PROMPTS[0]
    config = GenerationConfig(max_new_tokens=16, draft_max=4, repetition_penalty=3.0, presence_penalty=2.0,
                              penalty_last_n=0)
    generation = Engine(tiny_model).generate(prompt, PromptLookupDrafter(), config)
    assert generation.tokens == hf_greedy(tiny_model, prompt, 16, eos=None)


def test_sampling_with_a_repetition_penalty_keeps_the_penalised_law(tiny_llama):
    """Seeded Monte-Carlo: the second new token follows the law of the model's logits with the prompt's tokens and
    the first new token penalised."""
    from specdec_cli.decoding.sampling import warp_probs

    prompt, penalty = [1, 10, 11, 12, 10, 11], 10.0  # (strong enough that the law without it fails)

    def repeated(logits, seen):  # [n, V] logits, [n, V] bool
        return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)

    in_prompt = torch.zeros(TINY_VOCAB, dtype=torch.bool)
    in_prompt[prompt] = True
    with torch.inference_mode():
        first = warp_probs(repeated(tiny_llama(torch.tensor([prompt])).logits[0, -1:], in_prompt[None])[0], 1.0)
        second = tiny_llama(torch.tensor([prompt + [t] for t in range(TINY_VOCAB)])).logits[:, -1]  # [V, V]
        second = warp_probs(repeated(second, in_prompt[None] | torch.eye(TINY_VOCAB, dtype=torch.bool)), 1.0)
    _assert_second_token_law(tiny_llama, prompt, first, second, repetition_penalty=penalty)


@pytest.mark.parametrize("name, value, needle", [("repetition_penalty", 0.0, "> 0"),
                                                 ("repetition_penalty", float("nan"), "> 0"),
                                                 ("repetition_penalty", float("inf"), "> 0"),
                                                 ("penalty_last_n", -2, ">= -1")])
def test_a_bad_penalty_setting_is_one_line(name, value, needle):
    with pytest.raises(SpecdecError, match=name) as error:
        GenerationConfig(**{name: value}).check()
    assert needle in str(error.value) and error.value.setting == name
