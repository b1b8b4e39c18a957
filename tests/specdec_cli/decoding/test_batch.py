"""Several generations in one forward (decoding/batch.py, Engine.step_many): every answer token-identical to the
same request run alone, with every drafter, whatever joins and leaves at which step; sampled answers too where
the draws do not depend on drafts; a dropped generation changes no other's answer; one sequence's cache filled
with NaN reaches no other's. Tiny block models of two families (plain GQA, sliding windows) on the native
decoder, which scores several sequences at once."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import fixed_engine
from helpers import EOS, family_model

from specdec_cli import kernels
from specdec_cli.decoding.batch import Batch
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import quant
from specdec_cli.target_model.verify.exact_setup import NativeForward

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

VOCAB = 64
DRAFTERS = ["none", "pld", "sam", "aded", "recycle", "sam+aded"]
# repetitive prompts, so that retrieval drafters have something to draft
PROMPTS = [[1, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11], [1, 5, 6, 7, 8, 5, 6, 7, 8, 5], [1, 20, 21, 20, 21, 20],
           [1, 30, 31, 32, 33, 34, 35, 30, 31, 32], [1, 40], [1, 9, 9, 9, 9, 9, 9, 9], [1, 15, 16, 17, 15, 16]]
# (step at which it joins, prompt index): two at the start, the others joining while earlier ones run
SCHEDULE = [(0, 0), (0, 1), (2, 2), (3, 3), (3, 4), (7, 5), (12, 6)]


@pytest.fixture(scope="module", params=[("llama", "int4"), ("gemma2", "int8")], ids=["llama", "gemma2"])
def block_model(request):
    family, mode = request.param
    model = family_model(family, seed=11)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, mode, None))
    return model


def _config(**settings) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": 40, "eos_token_ids": (EOS,), "draft_max": 6, **settings})


def _drafter(name: str):
    return make_drafter(name, DrafterOptions(), TargetInfo(VOCAB, (EOS,)))


def _batched(engine, drafter_name: str, config: GenerationConfig, schedule=SCHEDULE, seeds=None, dropped=(),
             poisoned=()):
    """Run the schedule in one batch; the answers' tokens by prompt index, the widest step, the tokens drafted."""
    batch, runs, answers, widest, drafted, step = Batch(engine), {}, {}, 0, 0, 0
    pending = sorted(schedule)
    while pending or len(batch):
        while pending and pending[0][0] <= step:
            _, index = pending.pop(0)
            seeded = config if seeds is None else GenerationConfig(**{**config.__dict__, "seed": seeds[index]})
            run = batch.add(PROMPTS[index], _drafter(drafter_name), seeded)
            runs[index] = run
            if run.finish is not None:
                answers[index] = batch.close(run).tokens
        for index in dropped:
            if step == 3 and index in runs:
                batch.drop(runs[index])
        for index in poisoned:
            if step == 2 and index in runs:
                with torch.inference_mode():  # (the cache was made in inference mode, by the engine)
                    for layer in runs[index].cache.layers:
                        layer.key_buffer.fill_(math.nan)
                        layer.value_buffer.fill_(math.nan)
        widest = max(widest, len(batch))
        for run in batch.step():
            answers[next(index for index, held in runs.items() if held is run)] = batch.close(run).tokens
        step += 1
    for run in runs.values():
        drafted += sum(len(event.draft.tokens) for event in run.events if event.kind == "step")
    return answers, widest, drafted


def _alone(engine, config: GenerationConfig, seeds=None):
    return {index: engine.generate(prompt, _drafter("none"), config if seeds is None else
                                   GenerationConfig(**{**config.__dict__, "seed": seeds[index]})).tokens
            for index, prompt in enumerate(PROMPTS)}


@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_every_answer_of_a_batch_is_its_answer_alone(block_model, drafter_name):
    engine = fixed_engine(block_model)
    plain = _alone(engine, _config())
    assert isinstance(engine.forward, NativeForward) and engine.forward.outcome.state == "on"
    answers, widest, drafted = _batched(engine, drafter_name, _config())
    assert answers == plain, drafter_name
    assert widest >= 4  # sequences did share forwards
    if drafter_name != "none":
        assert drafted > 0  # drafts were verified inside batched steps


@torch.inference_mode()
@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.8, "top_p": 0.9}])
def test_sampled_answers_of_a_batch_are_their_answers_alone_with_their_seeds(block_model, settings):
    """Without drafts a sampled answer's draws are the same alone or batched: the same tokens with the same seed."""
    engine = fixed_engine(block_model)
    seeds = [50 + index for index in range(len(PROMPTS))]
    alone = _alone(engine, _config(**settings), seeds)
    answers, _, _ = _batched(engine, "none", _config(**settings), seeds=seeds)
    assert answers == alone
    assert len({tuple(tokens) for tokens in answers.values()}) > 1


def test_a_dropped_or_poisoned_sequence_changes_no_other_answer(block_model):
    engine = fixed_engine(block_model)
    plain = _alone(engine, _config())
    answers, _, _ = _batched(engine, "sam", _config(), dropped=(1,))
    assert 1 not in answers and all(answers[index] == plain[index] for index in answers)
    answers, _, _ = _batched(engine, "pld", _config(), poisoned=(0,))
    assert answers[0] != plain[0]  # the poisoned sequence went wrong...
    assert all(answers[index] == plain[index] for index in answers if index != 0)  # ...and no other did


def test_a_batch_of_one_and_a_forward_that_cannot_batch_step_alone(tiny_llama):
    """transformers' modules score one sequence at a time: the batch steps its generations one by one, exactly."""
    engine = fixed_engine(tiny_llama, exact=True)
    assert not hasattr(engine.forward, "many")
    plain = {index: engine.generate(prompt, _drafter("none"), _config()).tokens for index, prompt in
             enumerate(PROMPTS[:3])}
    answers, _, _ = _batched(engine, "pld", _config(), schedule=[(0, 0), (0, 1), (1, 2)])
    assert answers == plain


def _counting_many(engine):
    """Record each batched forward's blocks (token counts) and kept logits rows."""
    calls, many = [], engine.forward.many

    def counted(blocks, keep=None):
        calls.append(([len(tokens) for tokens, _, _ in blocks], list(keep) if keep is not None else None))
        return many(blocks, keep)

    engine.forward.many = counted
    return calls


def test_a_new_prompt_is_computed_in_pieces_beside_the_others(block_model):
    """A prompt joining a batch never stops the others: each step computes a piece of it in the rows the others
    leave (no logits but its last row's), its first token comes with its last piece, and every answer is its
    answer alone."""
    engine = fixed_engine(block_model)
    long_prompt = [1, *[(3 * position) % 50 + 2 for position in range(70)]]  # longer than a forward's rows
    plain = {0: engine.generate(PROMPTS[0], _drafter("none"), _config()).tokens,
             1: engine.generate(long_prompt, _drafter("none"), _config()).tokens}
    rows = engine.forward.rows
    calls = _counting_many(engine)
    batch = Batch(engine)
    first = batch.add(PROMPTS[0], _drafter("none"), _config())
    batch.step()  # its prompt
    batch.step()  # its first step
    second = batch.add(long_prompt, _drafter("none"), _config())
    assert second.computed == 0 and not second.new_tokens  # nothing computed at once
    steps_before, calls_before = len(first.new_tokens), len(calls)
    while second.computed is not None:
        batch.step()
    pieces = calls[calls_before:]
    assert all(sizes[0] == 1 and sum(sizes) <= rows for sizes, _ in pieces)  # beside the first sequence's step
    assert sum(sizes[1] for sizes, _ in pieces) == len(long_prompt)
    assert [keep[1] for _, keep in pieces] == [0] * (len(pieces) - 1) + [1]
    assert len(pieces) >= 2 and len(first.new_tokens) - steps_before == len(pieces)  # it went on meanwhile
    answers = {}
    while len(batch):
        for run in batch.step():
            answers[0 if run is first else 1] = batch.close(run).tokens
    assert answers == plain


def test_prompts_are_computed_alone_when_the_others_fill_the_forward(block_model):
    """With as many sequences as a forward has rows, a new prompt cannot wait for room: it is computed whole."""
    engine = fixed_engine(block_model)
    plain = engine.generate(PROMPTS[1], _drafter("none"), _config(max_new_tokens=4)).tokens
    batch, config = Batch(engine), _config(max_new_tokens=60, eos_token_ids=())
    for index in range(engine.forward.rows):
        batch.add(PROMPTS[index % len(PROMPTS)], _drafter("none"), config)
    while batch.prompts:
        batch.step()  # the prompts computed, several a forward
    assert len(batch.runs) == engine.forward.rows
    late = batch.add(PROMPTS[1], _drafter("none"), _config(max_new_tokens=4))
    batch.step()
    assert late.computed is None and late.new_tokens
    batch.drop(late)
    pending = batch.add(PROMPTS[2], _drafter("none"), _config())
    batch.drop(pending)  # a waiting prompt dropped leaves at once
    assert all(run is not pending for run in [*batch.runs, *batch.prompts])
    assert engine.generate(PROMPTS[1], _drafter("none"), _config(max_new_tokens=4)).tokens == plain


@pytest.mark.parametrize("drafter_name", ["none", "sam", "recycle"])
def test_min_new_tokens_in_a_batch_is_each_answer_alone(block_model, drafter_name):
    """An early token declared end-of-text and barred for the first 15 (the server's `min_tokens`): each batched
    answer goes past it as the same request alone does."""
    engine = fixed_engine(block_model)
    eos = _alone(engine, _config())[0][2]
    free, barred = _config(eos_token_ids=(eos,)), _config(eos_token_ids=(eos,), min_new_tokens=15)
    alone = _alone(engine, barred)
    assert alone[0] != _alone(engine, free)[0] and eos not in alone[0][:15]  # the bar changed an answer
    answers, widest, _ = _batched(engine, drafter_name, barred)
    assert answers == alone and widest >= 4


@pytest.mark.parametrize("drafter_name", ["none", "sam", "recycle"])
def test_a_logit_bias_and_penalties_in_a_batch_are_each_answer_alone(block_model, drafter_name):
    """Answers with and without a logit bias or penalties (the server's `logit_bias`, `presence_penalty`,
    `frequency_penalty`, `repetition_penalty`, llama.cpp's window) share forwards: each is the answer its request
    gets alone by plain decoding."""
    engine = fixed_engine(block_model)
    plain = _alone(engine, _config())
    penalties = [{"presence_penalty": 1.0, "frequency_penalty": 0.5}, {"repetition_penalty": 1.8}]  # OpenAI's, vLLM's
    windowed = {"repetition_penalty": 1.5, "presence_penalty": 1.0, "penalty_last_n": 4}  # llama.cpp's
    configs = [_config(logit_bias=((plain[index][1], -100.0), (5, 2.0))) if index % 3 == 1 else
               _config(**penalties[index // 3 % 2]) if index % 3 == 2 else
               _config(**windowed) if index else _config() for index in range(len(PROMPTS))]
    alone = [engine.generate(prompt, _drafter("none"), config).tokens for prompt, config in zip(PROMPTS, configs)]
    assert any(alone[index] != plain[index] for index in range(1, len(PROMPTS), 3))  # the biases changed answers
    assert any(alone[index] != plain[index] for index in range(2, len(PROMPTS), 3))  # and the penalties
    assert any(alone[index] != plain[index] for index in range(3, len(PROMPTS), 3))  # and llama.cpp's window
    batch = Batch(engine)
    runs = [batch.add(prompt, _drafter(drafter_name), config) for prompt, config in zip(PROMPTS, configs)]
    widest = 0
    while len(batch):
        widest = max(widest, len(batch))
        batch.step()
    assert [run.new_tokens for run in runs] == alone and widest >= 4


def test_a_callback_that_ends_its_answer_in_a_batch_leaves_the_others_whole(block_model):
    """A server's limit (an event callback returning True) ends that answer after the event, in a batched step
    too: its tokens are the beginning of its answer alone, every other answer is whole."""
    engine = fixed_engine(block_model)
    config = _config()
    plain = _alone(engine, config)
    batch, events = Batch(engine), []

    def enough(event) -> bool:
        events.append(event)
        return sum(len(one.committed) for one in events) >= 4

    runs = [batch.add(prompt, _drafter("pld"), config, on_event=enough if index == 1 else None)
            for index, prompt in enumerate(PROMPTS[:4])]
    answers = {}
    while len(batch):
        for run in batch.step():
            answers[runs.index(run)] = batch.close(run)
    cut = answers[1]
    assert cut.finish_reason == "length" and 4 <= len(cut.tokens) < len(plain[1])
    assert cut.tokens == plain[1][: len(cut.tokens)]
    assert all(answers[index].tokens == plain[index] for index in (0, 2, 3))
