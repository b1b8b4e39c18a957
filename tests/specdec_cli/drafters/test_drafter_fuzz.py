"""Every drafter, automaton and vLLM proposer fed random, negative and out-of-vocabulary token ids: each call
returns (drafts of ids in the vocabulary only) or raises one SpecdecError, within a time limit. A SIGALRM turns a
hang into a failure instead of a stuck suite (`SamProposer.propose([[-1]], ...)` used to loop forever)."""

from __future__ import annotations

import copy
import signal
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from conftest import TINY_EOS, TINY_VOCAB

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.drafters import AUX_CHOICES, DRAFTERS, DrafterOptions, TargetInfo, make_drafter, target_weights
from specdec_cli.drafters.eagle import EagleDrafter
from specdec_cli.drafters.model import ModelDrafter
from specdec_cli.drafters.oracle import OracleDrafter
from specdec_cli.drafters.sam import SamDrafter
from specdec_cli.errors import SpecdecError
from specdec_cli.sam.automaton import DynamicAutomaton, build_static
from specdec_cli.session.run_settings import DrafterSettings
from specdec_cli.vllm.proposer import PROPOSERS, ProposerSettings

SECONDS = 5  # per call: generous on a loaded 2-core machine, short against a hang
VOCAB = TINY_VOCAB
TARGET = TargetInfo(vocab_size=VOCAB, eos_token_ids=(TINY_EOS,))
BAD = [-1, -2, -(2**31), -(2**40), VOCAB, VOCAB + 1, 2**31 - 1, 2**31, 2**40]


class Hung(Exception):
    pass


@contextmanager
def time_limit(what: str):
    def expire(signum, frame):
        raise Hung(f"{what} did not return within {SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def contexts(rng: np.random.Generator, count: int = 40) -> list[list[int]]:
    """Valid contexts (repetitive, so that retrieval drafters draft) and ones with bad ids anywhere."""
    found = []
    for number in range(count):
        base = rng.integers(0, 8, size=int(rng.integers(2, 30))).tolist()  # few symbols: many repeats
        base = [token + 4 for token in base]  # not EOS
        if number % 2:
            for _ in range(int(rng.integers(1, 4))):
                base[int(rng.integers(0, len(base)))] = int(rng.choice(BAD))
        found.append(base)
    found += [[-1], [-1, -2, -1, -2, -1], [VOCAB], [2**40, 5, 2**40, 5], [5, 6, -1]]
    return found


def call(what: str, function, *args):
    """(result, None) or (None, the SpecdecError); anything else, or a hang, fails the test."""
    with time_limit(what):
        try:
            return function(*args), None
        except SpecdecError as exc:
            assert str(exc) and "\n" not in str(exc)
            return None, exc


def valid(tokens, vocab: int = VOCAB) -> bool:
    return all(0 <= int(token) < vocab for token in tokens)


def events(context: list[int], draft: Draft, hidden: int) -> tuple[StepEvent, StepEvent]:
    """A prefill of context[:-1] committing context[-1], then a step that drafted `draft` and committed one token."""
    prefill = StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[context[-1]],
                        prompt_tokens=context[:-1],
                        features=torch.zeros(max(len(context) - 1, 0), hidden))
    token = context[-1]
    step = StepEvent(kind="step", draft=draft, committed=[token],
                     scored_topk=[[token] * 8 for _ in range(len(draft) + 1)], features=torch.zeros(1, hidden))
    return prefill, step


def fuzz(drafter, name: str, rng: np.random.Generator, hidden: int = 8, vocab_known: bool = True) -> None:
    for context in contexts(rng):
        good = valid(context)
        prefill, _ = events(context, Draft.empty(name), hidden)
        _, error = call(f"{name}.observe(prefill {context})", drafter.observe, prefill)
        assert error is None or not good, (name, context, error)
        draft, error = call(f"{name}.propose({context})", drafter.propose, context, 8)
        assert error is None or not good, (name, context, error)
        if draft is not None:
            assert valid(draft.tokens, VOCAB if vocab_known else 2**31), (name, context, draft.tokens)
            _, step = events(context, draft, hidden)
            _, error = call(f"{name}.observe(step {context})", drafter.observe, step)
            assert error is None or not good, (name, context, error)


@pytest.mark.parametrize("name", [*sorted(DRAFTERS.keys() - {"none", "model", "eagle"}),
                                  *(f"sam+{aux}" for aux in AUX_CHOICES if aux not in ("model", "eagle"))])
def test_every_drafter_made_by_name(name):
    options = DrafterOptions(aded_time_budget=0.001)
    fuzz(make_drafter(name, options, TARGET), name, np.random.default_rng(len(name)))


def test_the_model_and_eagle_drafters_and_their_hybrids(tiny_llama):
    from specdec_cli.drafters.eagle_head import EagleHead, head_config_for

    hidden = tiny_llama.config.hidden_size
    torch.manual_seed(0)
    head = EagleHead(head_config_for(tiny_llama.config))

    def eagle():
        return EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama),
                            eos_token_ids=(TINY_EOS,))

    made = {
        "model": ModelDrafter(tiny_llama, draft_max=4, eos_token_ids=(TINY_EOS,)),
        "eagle": eagle(),
        "sam+model": SamDrafter(separators=(TINY_EOS,), aux=ModelDrafter(tiny_llama, draft_max=4), vocab_size=VOCAB),
        "sam+eagle": SamDrafter(separators=(TINY_EOS,), aux=eagle(), vocab_size=VOCAB),
    }
    for name, drafter in made.items():
        fuzz(drafter, name, np.random.default_rng(7), hidden=hidden)


def test_drafters_made_without_a_vocabulary_and_the_oracle():
    from specdec_cli.drafters.aded import AdedDrafter
    from specdec_cli.drafters.pld import PromptLookupDrafter
    from specdec_cli.drafters.recycle import RecycleDrafter

    rng = np.random.default_rng(3)
    fuzz(SamDrafter(separators=(TINY_EOS,)), "sam", rng, vocab_known=False)
    fuzz(PromptLookupDrafter(), "pld", rng, vocab_known=False)
    fuzz(AdedDrafter(time_budget=0.001), "aded", rng, vocab_known=False)
    fuzz(RecycleDrafter(VOCAB), "recycle", rng)
    fuzz(OracleDrafter([[5, 6, 7, 8]], draft_max=4), "oracle", rng)  # these two read no ids: never refuse
    fuzz(make_drafter("none", DrafterOptions(), TARGET), "none", rng)


def test_the_automata():
    rng = np.random.default_rng(11)
    for context in contexts(rng):
        dynamic = DynamicAutomaton(separators=(TINY_EOS,))
        for token in context:
            _, error = call(f"extend({token})", dynamic.extend, token)
            assert (error is None) == (0 <= token < 2**31), token
        static, error = call(f"build_static({context})", build_static, np.asarray(context, dtype=np.int64), VOCAB)
        assert (error is None) == valid(context), context
        for automaton in filter(None, (dynamic, static)):
            state, length = 0, 0
            for token in context:
                (state, length), _ = call(f"advance({token})", automaton.advance, state, length, token)
                continuation, _ = call("continuation", automaton.continuation, state, 8)
                assert valid(continuation, 2**31)


@pytest.mark.parametrize("drafter", sorted(PROPOSERS))
def test_every_vllm_proposer(drafter):
    """vLLM cannot be told of an error: a row with ids outside the vocabulary gets no draft; the others theirs."""
    rng = np.random.default_rng(5)
    proposer = PROPOSERS[drafter](None, settings=ProposerSettings(DrafterSettings(drafter)), target=TARGET,
                                  num_speculative_tokens=4)
    drafts, _ = call("the issue's row", proposer.propose, [[-1]], np.array([5]), np.array([[-1, -2, -1, -2, -1]]))
    assert drafts == [[]]
    for _ in range(30):
        rows = contexts(rng, 8)
        width = max(len(row) for row in rows) + 4
        table = np.full((len(rows), width), -1, dtype=np.int64)  # vLLM pads with placeholders
        for number, row in enumerate(rows):
            table[number, : len(row)] = row
        lengths = np.array([len(row) for row in rows])
        sampled = [[row[-1]] for row in rows]
        drafts, error = call(f"propose({rows})", proposer.propose, sampled, lengths, table)
        assert error is None and len(drafts) == len(rows)
        for row, draft in zip(rows, drafts):
            assert valid(draft) and (not draft or valid(row)), (row, draft)
    repeat = [5, 6, 7, 8, 9, 5, 6, 7]  # and valid rows still draft
    drafts, _ = call("a repeat", proposer.propose, [[7]], np.array([len(repeat)]), np.array([repeat]))
    assert drafts == [[8, 9, 5, 6]]
