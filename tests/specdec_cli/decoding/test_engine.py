"""The engine on tiny models: every drafter's greedy output is token-identical to plain greedy decoding."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TINY_EOS, TINY_VOCAB, chi_square, hf_greedy

from specdec_cli.decoding.cost_curve import CostCurve
from specdec_cli.decoding.draft import NOTHING, Draft
from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.decoding.stop_strings import find_stop
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.drafters.pld import PromptLookupDrafter, find_latest_match

# Fixed verify-cost curves (no timing: the outcome of a test never depends on this machine's speed).
FLAT_CURVE = {1: 1.0, 64: 1.0}  # drafts are free: everything the acceptance model likes is verified
# 2-3 rows dearest, big blocks cheap (the shape of float32 on some CPUs): blocks are padded up to 8 or 12 rows
DIP_CURVE = {1: 1.0, 2: 2.0, 3: 2.2, 4: 1.9, 8: 1.5, 12: 1.6, 16: 1.9}

PROMPTS = [
    [1, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11],
    [1, 5, 6, 7, 8, 9, 20, 21, 22, 5, 6, 7],
    [1, 40],
]


class ScriptedDrafter:
    """Proposes the reference continuation with a twist: exact, corrupted at one position, or run past EOS."""

    needs = NOTHING  # tokens only

    def __init__(self, reference: list[int], prompt_len: int, mode: str, seed: int = 0):
        self.name = f"scripted-{mode}"
        self.reference, self.prompt_len, self.mode = reference, prompt_len, mode
        self.rng = random.Random(seed)

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        if self.mode == "junk":
            return Draft([self.rng.randrange(TINY_VOCAB) for _ in range(budget)], self.name)
        truth = self.reference[done : done + budget]
        if self.mode == "past-eos":  # the true continuation, then EOS, then garbage after it
            truth = (truth + [TINY_EOS, 7, 8, 9])[:budget]
        if self.mode == "partial" and len(truth) > 1:
            wrong = self.rng.randrange(len(truth))
            truth = truth[:wrong] + [(truth[wrong] + 1) % TINY_VOCAB] + truth[wrong + 1 :]
        return Draft(list(truth), self.name)

    def observe(self, event):
        pass

    def reset(self):
        pass


def _generate(model, prompt, drafter, max_new_tokens, draft_max=6, curve=None):
    """Without a fixed `curve` cost-aware planning is off, so every draft reaches the verifier whole."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, draft_max=draft_max, eos_token_ids=(TINY_EOS,),
                              cost_aware=curve is not None)
    planner = None if curve is None else DraftPlanner(CostCurve.fixed(curve))
    return Engine(model, planner=planner).generate(prompt, drafter, config)


MODES = ["none", "pld", "exact", "partial", "junk", "past-eos"]
# cost-aware planning (trimming, and padding to cheaper row counts) on the drafters it changes most
CASES = ([(mode, None) for mode in MODES] + [(mode, FLAT_CURVE) for mode in ("pld", "partial", "junk")]
         + [(mode, DIP_CURVE) for mode in ("pld", "exact", "partial", "junk")])


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("mode, curve", CASES)
def test_greedy_identical_to_plain_decoding(tiny_model, prompt, mode, curve):
    reference = hf_greedy(tiny_model, prompt, 40)
    if mode == "none":
        drafter = NoDrafter()
    elif mode == "pld":
        drafter = PromptLookupDrafter()
    else:
        drafter = ScriptedDrafter(reference, len(prompt), mode)
    generation = _generate(tiny_model, prompt, drafter, 40, curve=curve)
    assert generation.tokens == reference
    stats = generation.stats
    assert stats.new_tokens == len(reference)
    assert stats.steps == sum(1 for event in generation.events if event.kind == "step")
    if mode == "none":
        assert stats.mean_accepted_tokens == pytest.approx(1.0) and stats.drafted_tokens == 0
    if mode == "exact" and stats.steps:
        assert stats.mean_accepted_tokens > 1.5
    steps = [event for event in generation.events if event.kind == "step"]
    assert all(event.verify_rows >= len(event.draft) + 1 for event in steps)
    if curve is DIP_CURVE and mode == "exact" and len(steps) > 2:
        # the 2-3 row forwards are never used: a short draft is padded up to a cheaper block
        assert all(event.verify_rows == 1 or event.verify_rows >= 4 for event in steps)


def test_eos_stops_and_is_kept(tiny_llama):
    """Declare a token the model produces to be EOS: output stops right after it, like generate."""
    prompt = PROMPTS[0]
    reference = hf_greedy(tiny_llama, prompt, 12, eos=None)
    eos = reference[3]
    expected = reference[: reference.index(eos) + 1]
    drafter = ScriptedDrafter(reference, len(prompt), "exact")
    config = GenerationConfig(max_new_tokens=40, draft_max=6, eos_token_ids=(eos,), cost_aware=False)
    generation = Engine(tiny_llama).generate(prompt, drafter, config)
    assert generation.tokens == expected == hf_greedy(tiny_llama, prompt, 40, eos=eos)
    assert generation.finish_reason == "eos"


def test_max_new_tokens_is_exact(tiny_llama):
    prompt = PROMPTS[0]
    reference = hf_greedy(tiny_llama, prompt, 7)
    generation = _generate(tiny_llama, prompt, ScriptedDrafter(reference, len(prompt), "exact"), 7, draft_max=16)
    assert generation.tokens == reference and len(generation.tokens) == 7
    assert generation.finish_reason in ("length", "eos")
    assert all(len(event.draft) <= 16 for event in generation.events)


def test_an_event_callback_may_end_the_generation(tiny_llama):
    """A callback that returns True ends the answer after that event (a server's limit): what was committed is the
    beginning of the answer plain decoding writes, and the finish is "length"; with drafts or without."""
    prompt = PROMPTS[0]
    config = GenerationConfig(max_new_tokens=30, draft_max=6, cost_aware=False)  # (no end-of-text token)
    plain = Engine(tiny_llama).generate(prompt, NoDrafter(), config).tokens
    for drafter in (NoDrafter(), ScriptedDrafter(plain, len(prompt), "exact")):
        seen: list = []

        def enough(event, seen: list = seen) -> bool:
            seen.append(event)
            return sum(len(one.committed) for one in seen) >= 5

        generation = Engine(tiny_llama).generate(prompt, drafter, config, on_event=enough)
        assert generation.finish_reason == "length"
        assert 5 <= len(generation.tokens) < 30 and generation.tokens == plain[: len(generation.tokens)]
        assert len(generation.events) == len(seen)  # nothing after the event that ended it


def test_events_are_consistent(tiny_llama):
    prompt = PROMPTS[1]
    generation = _generate(tiny_llama, prompt, PromptLookupDrafter(), 30)
    events = generation.events
    assert events[0].kind == "prefill" and list(events[0].prompt_tokens) == prompt
    committed = [token for event in events for token in event.committed]
    assert committed == generation.tokens
    for event in events[1:]:
        assert event.committed[: event.accepted] == event.draft.tokens[: event.accepted]
        assert len(event.committed) == event.accepted + 1 or event.finished  # the target's own token last
        assert event.features is None and event.scored_topk is None  # pld needs neither: neither is computed
    assert events[-1].finished == generation.finish_reason


def _exact_second_token_law(model, prompt, temperature):
    """P(2nd new token) = sum over t1 of P(t1) P(t2 | t1), from the model's own warped distributions."""
    from specdec_cli.decoding.sampling import warp_probs

    with torch.inference_mode():
        first = warp_probs(model(torch.tensor([prompt])).logits[0, -1], temperature)  # [vocab]
        batch = torch.tensor([prompt + [token] for token in range(TINY_VOCAB)])  # [vocab, len+1]
        second = warp_probs(model(batch).logits[:, -1], temperature)  # [vocab, vocab]
    return (first.unsqueeze(1) * second).sum(0).double()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "exact", "junk"])
def test_sampling_keeps_the_target_distribution(tiny_llama, mode):
    """Seeded Monte-Carlo on a real (tiny) model: the 2nd new token follows the model's exact law."""
    prompt = [1, 10, 11, 12, 10, 11]
    temperature = 1.0
    config = GenerationConfig(max_new_tokens=4, temperature=temperature, draft_max=4, eos_token_ids=(),
                              cost_aware=False)
    engine = Engine(tiny_llama)
    drafter = NoDrafter() if mode == "none" else ScriptedDrafter([11, 12, 10, 11], len(prompt), mode)
    runs = 800
    counts = torch.zeros(TINY_VOCAB, dtype=torch.float64)
    for seed in range(runs):
        config.seed = seed
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, _exact_second_token_law(tiny_llama, prompt, temperature))
    # mean dof, sd sqrt(2 dof): 5 sd is a one-in-millions false alarm; a biased rule overshoots by far
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_find_latest_match():
    import numpy as np

    tokens = np.array([1, 2, 3, 9, 1, 2, 3, 7, 1, 2])
    assert find_latest_match(tokens, 2) == 4
    assert find_latest_match(tokens, 3) is None or find_latest_match(tokens, 3) < 8
    assert find_latest_match(np.array([4, 5]), 1) is None


def test_pld_drafts_the_continuation():
    drafter = PromptLookupDrafter(max_ngram=2, draft_max=3)
    draft = drafter.propose([1, 2, 3, 4, 5, 9, 2, 3], budget=8)
    assert draft.tokens == [4, 5, 9]
    assert drafter.propose([1, 2], budget=4).tokens == []
    assert drafter.propose([1, 2, 1], budget=0).tokens == []


def test_a_check_outcome_renders_as_displays_and_bench_json_show_it(tiny_llama):
    from specdec_cli.target_model.verify.check_outcome import CheckOutcome

    assert CheckOutcome("off").text() == "off" and CheckOutcome("not checked").text() == "not checked"
    assert CheckOutcome("passed").text() == "passed"
    assert CheckOutcome("on", "blocks up to 8 rows; linear shapes padded: none").text() \
        == "on: blocks up to 8 rows; linear shapes padded: none"
    assert CheckOutcome("chains only", "no tree mask for chunked_attention layers").text() \
        == "chains only: no tree mask for chunked_attention layers"
    engine = Engine(tiny_llama, planner=DraftPlanner(CostCurve.fixed(FLAT_CURVE)))  # float32: exactness off
    assert engine.forward.outcome == CheckOutcome("off") and engine.forward.outcome.text() == "off"
    assert engine.tree_outcome == CheckOutcome("not checked") and engine.tree_check == "not checked"


# -- stop strings: checked on a tail window, placed as a whole decode places them ----------------------------


class _ByteTokenizer:
    """Tokens of 1-3 characters, lone UTF-8 bytes (characters split across tokens) and a special token that
    decodes to nothing: what makes a stop string span tokens. Counts the ids it decodes."""

    SPECIAL = 63

    def __init__(self):
        pieces = ["a", "b", " ", "ab", "ba", "\n", "</", "s>", "STOP", "x", "yz", "é", "<", "/", "s", ">", "é!"]
        self.pieces = [piece.encode() for piece in pieces] + [bytes([byte]) for byte in "é😀".encode()]
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=False):
        self.decoded += len(ids)
        parts = [b"" if token == self.SPECIAL else self.pieces[token % len(self.pieces)] for token in ids]
        return b"".join(parts).decode("utf-8", errors="replace")


def _whole_text_stop(tokenizer, before, committed, stops):
    """The stop search as it was: the whole output decoded, every step."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    text = decode(before + committed)
    hits = [text.find(stop) for stop in stops if stop and stop in text]
    if not hits:
        return len(committed), None
    cut = min(hits)
    for keep in range(len(committed) + 1):
        if len(decode(before + committed[:keep])) > cut:
            return keep, cut
    return len(committed), cut


@pytest.mark.parametrize("seed", range(6))
def test_stop_strings_found_on_a_tail_are_placed_as_the_whole_text_places_them(seed):
    rng = random.Random(seed)
    tokenizer = _ByteTokenizer()
    vocab = len(tokenizer.pieces)
    for _ in range(60):
        stops = rng.choice([("</s>",), ("STOP", "ba b"), ("é",), ("😀",), ("\n\n", "yzx"), ("a" * 30,)])
        before, found = [], (0, None)
        while found[1] is None and len(before) < 300:  # an answer grown step by step until a stop shows
            committed = [rng.choice([rng.randrange(vocab), _ByteTokenizer.SPECIAL]) for _ in range(rng.randint(1, 6))]
            found = find_stop(tokenizer, before, committed, stops)
            assert found == _whole_text_stop(tokenizer, before, committed, stops), (stops, before, committed)
            before += committed[: found[0]]


def test_stop_search_decodes_a_window_per_step_not_the_whole_answer():
    tokenizer = _ByteTokenizer()
    before = []
    for _ in range(2000):
        find_stop(tokenizer, before, [0, 2], ("</s>",))  # "a a a ...": never a stop
        before += [0, 2]
    assert tokenizer.decoded < 100 * 2000  # a whole decode per step would be ~4,000,000 ids


def test_a_stop_string_spanning_tokens_cuts_the_generation(tiny_llama):
    """Through the engine: the output stops at the token that completes the stop string's first character, the
    finish reason is "stop" and text_end is where the stop string begins."""
    tokenizer = _ByteTokenizer()
    prompt = PROMPTS[0]
    plain = _generate(tiny_llama, prompt, NoDrafter(), 40)
    text = tokenizer.decode(plain.tokens, skip_special_tokens=True)
    start = len(text) // 2
    stop = text[start : start + 3]
    assert len(stop) == 3
    cut = text.find(stop)
    for drafter in (NoDrafter(), PromptLookupDrafter()):
        engine = Engine(tiny_llama, tokenizer, planner=DraftPlanner(CostCurve.fixed(FLAT_CURVE)))
        config = GenerationConfig(max_new_tokens=40, draft_max=6, eos_token_ids=(TINY_EOS,), stop=(stop,))
        generation = engine.generate(prompt, drafter, config)
        assert generation.finish_reason == "stop" and generation.text_end == cut
        assert plain.tokens[: len(generation.tokens)] == generation.tokens
        assert len(tokenizer.decode(generation.tokens, skip_special_tokens=True)) > cut
        assert len(tokenizer.decode(generation.tokens[:-1], skip_special_tokens=True)) <= cut


# -- what a drafter reads, and who decides whether drafting pays ------------------------------------------------


class _CountingJunk(ScriptedDrafter):
    """Junk drafts (never accepted); counts the proposals the engine asks for and what it gets told."""

    def __init__(self, reference, prompt_len):
        super().__init__(reference, prompt_len, "junk")
        self.budgets = []

    def propose(self, context, budget):
        self.budgets.append(budget)
        return super().propose(context, budget)


def test_the_engine_stops_asking_a_drafter_whose_drafts_do_not_pay(tiny_llama):
    prompt = PROMPTS[1]
    reference = hf_greedy(tiny_llama, prompt, 60)
    drafter = _CountingJunk(reference, len(prompt))
    generation = _generate(tiny_llama, prompt, drafter, 60, draft_max=6, curve={1: 1.0, 2: 1.8, 8: 6.0})
    assert generation.tokens == reference
    steps = generation.stats.steps
    assert len(drafter.budgets) < steps // 2  # most steps drafted nothing: the planner asked for nothing
    assert drafter.budgets[0] == 6 and min(drafter.budgets) >= 1


def test_drafters_declare_what_they_read_and_get_only_that(tiny_llama):
    from specdec_cli.decoding.draft import Drafter, Needs
    from specdec_cli.drafters import DRAFTERS, DrafterOptions, TargetInfo, make_drafter
    from specdec_cli.drafters.recycle import RecycleDrafter

    target = TargetInfo(vocab_size=TINY_VOCAB, eos_token_ids=(TINY_EOS,))
    for name in [name for name in DRAFTERS if name not in ("model", "eagle")] + ["sam+recycle", "sam+none"]:
        drafter = make_drafter(name, DrafterOptions(), target)
        assert isinstance(drafter, Drafter) and isinstance(drafter.needs, Needs), name
        drafter.reset()
    assert make_drafter("recycle", DrafterOptions(), target).needs == Needs(scored_topk=True)
    assert make_drafter("sam+recycle", DrafterOptions(), target).needs == Needs(scored_topk=True)  # its auxiliary's
    assert make_drafter("sam+aded", DrafterOptions(), target).needs == Needs()
    prompt = PROMPTS[0]
    generation = _generate(tiny_llama, prompt, RecycleDrafter(TINY_VOCAB), 24)
    events = generation.events[1:]
    assert all(len(event.scored_topk) == len(event.draft) + 1 and event.features is None for event in events)
    assert generation.tokens == hf_greedy(tiny_llama, prompt, 24)


class _EmptyTrees(ScriptedDrafter):
    """A tree drafter that finds nothing every other step (an empty tree) and a junk two-node tree otherwise."""

    def propose(self, context, budget):
        if len(context) % 2:
            return Draft([], self.name, [])
        return Draft([3, 4][:budget], self.name, [-1, -1][:budget])


def test_a_step_verifying_no_node_of_a_tree_is_a_plain_forward(tiny_llama):
    """A tree's mask costs ~9% of a one-row forward on a CPU: a step that keeps nothing of a tree (it found none, or
    the planner kept none) runs the plain forward, and the answer stays plain decoding's."""
    prompt = PROMPTS[1]
    engine = Engine(tiny_llama)
    forward, trees = engine.forward, []

    class Recording:
        def __getattr__(self, name):
            return getattr(forward, name)

        def __call__(self, block, cache, past, **options):
            trees.append((len(block), options.get("tree")))
            return forward(block, cache, past, **options)

    engine.forward = Recording()
    config = GenerationConfig(max_new_tokens=20, draft_max=4, eos_token_ids=(TINY_EOS,), cost_aware=False)
    generation = engine.generate(prompt, _EmptyTrees([], len(prompt), "junk"), config)
    assert generation.tokens == hf_greedy(tiny_llama, prompt, 20)
    assert any(rows == 1 for rows, _ in trees) and [-1, -1] in [tree for _, tree in trees]  # our trees verified
    assert all(tree is None for rows, tree in trees if rows == 1)
