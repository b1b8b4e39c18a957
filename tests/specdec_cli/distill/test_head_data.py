"""What a head trains on (distill/head_data.py): pieces that remember where their answer begins, and training that
teaches the answers' positions alone when asked (`prompt_loss` off), the prompts' staying context."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.distill.eagle_train import EagleTrainConfig, HeadKind, train_eagle
from specdec_cli.distill.head_data import _cut, split_order


def test_each_piece_knows_where_its_answer_begins():
    sequence = list(range(100, 130))  # 30 tokens, the answer from position 10
    cut = _cut([sequence, list(range(40, 52))], max_len=8, answer_starts=[10, 0])
    assert [(piece[0], start) for piece, start, _ in cut] == [(100, 10), (108, 2), (116, 0), (40, 0)]
    assert [len(piece) for piece, _, _ in cut] == [8, 8, 8, 8]  # the 6-token tails are dropped
    assert [origin for _, _, origin in cut] == [(0, 0), (0, 8), (0, 16), (1, 0)]  # (sequence, start)
    assert [start for _, start, _ in _cut([sequence], 8, None)] == [0, 0, 0]  # no prompt: every position taught
    train, held = split_order(20, 0.25, seed=3)
    assert sorted(train + held) == list(range(20)) and len(held) == 5 and split_order(20, 0.25, seed=3) == (train, held)


def test_the_prompts_positions_are_context_only_when_asked(tiny_llama):
    """Row j of step u (0-based) predicts the feature at j + 1 + u: taught from the answer's first position on; a
    run whose pieces are all prompt changes nothing; prompt_loss (the default) teaches every row."""
    sequences = [list(range(1, 21)), list(range(21, 41)), list(range(5, 25))]
    config = EagleTrainConfig(steps=3, lr=1e-2, head_vocab=0, holdout=0.34, prompt_loss=False, unroll=2)
    kind = HeadKind(tiny_llama, sequences, config, answer_starts=[12, 12, 12])
    kind.start(None)
    assert [kind.taught_from(0, unroll) for unroll in (0, 1)] == [11, 10]
    every = HeadKind(tiny_llama, sequences, EagleTrainConfig(steps=3, head_vocab=0, holdout=0.34),
                     answer_starts=[12] * 3)
    every.start(None)
    assert every.taught_from(0, 0) == 0

    torch.manual_seed(0)
    untouched, result = train_eagle(tiny_llama, sequences, config, answer_starts=[20, 20, 20])  # all prompt
    fresh = HeadKind(tiny_llama, sequences, config, answer_starts=[20] * 3)
    fresh.start(None)
    for (name, value), other in zip(untouched.state_dict().items(), fresh.head.state_dict().values()):
        assert torch.equal(value, other), name
    assert result["report"]["top1_agreement_after"] is None  # no held-out answer to score
    taught, _ = train_eagle(tiny_llama, sequences, config, answer_starts=[12, 12, 12])
    assert any(not torch.equal(value, other) for value, other in
               zip(taught.state_dict().values(), fresh.head.state_dict().values()))


def test_the_targets_greedy_choices_are_taken_a_few_rows_at_a_time():
    """greedy_along reads the whole vocabulary's logits GREEDY_ROWS positions at a time: the same choices as all
    positions at once, for pieces shorter and longer than that."""
    from specdec_cli.distill.eagle_train import GREEDY_ROWS, greedy_along

    torch.manual_seed(3)
    lm_head = torch.nn.Linear(16, 5000, bias=False)
    finals = [torch.randn(length, 16) for length in (1, GREEDY_ROWS - 1, GREEDY_ROWS, 2 * GREEDY_ROWS + 7)]
    with torch.no_grad():
        whole = [lm_head(final).argmax(-1) for final in finals]
    for got, expected in zip(greedy_along(lm_head, finals), whole):
        assert torch.equal(got, expected)


def test_agreement_taken_a_few_positions_at_a_time_is_the_whole_formula():
    """_agreement reads the whole-vocabulary distributions AGREEMENT_ROWS positions at a time: the same matches and
    the same TVDs, to the bit, as all positions at once (a head's tokens plus those seen so far allowed)."""
    from specdec_cli.distill.evaluate import AGREEMENT_ROWS, Candidate, LogitRows, Reference, _agreement

    torch.manual_seed(4)
    vocab, prompt, answer = 300, 9, 2 * AGREEMENT_ROWS + 5
    ids = torch.randint(0, vocab, (1, prompt + answer))
    start, end = prompt - 1, prompt + answer - 1
    target_logits = torch.randn(end - start, vocab) * 3
    reference = Reference(ids, start, end, target_logits, None)
    draft_logits = torch.randn(end - start, vocab) * 3
    head_tokens = list(range(0, vocab, 3))
    got = _agreement(Candidate(None, lambda _: draft_logits, head_tokens), reference)
    allowed = torch.zeros(end - start, vocab, dtype=torch.bool)
    allowed[:, head_tokens] = True
    for row in range(end - start):
        allowed[row, ids[0, : start + row + 1]] = True
    masked = draft_logits.masked_fill(~allowed, float("-inf"))
    tvd = 0.5 * (torch.softmax(target_logits, -1) - torch.softmax(masked, -1)).abs().sum(-1)
    assert got == (int((masked.argmax(-1) == target_logits.argmax(-1)).sum()), float(tvd.sum()), end - start)
    whole = _agreement(Candidate(None, lambda _: draft_logits), reference)
    assert whole[0] == int((draft_logits.argmax(-1) == target_logits.argmax(-1)).sum())
    # logits read out of states a few rows at a time (a head's), a zero first row among them: the same numbers
    states, weight = torch.randn(end - start - 1, 16), torch.randn(vocab, 16)

    def read_out(rows: torch.Tensor) -> torch.Tensor:  # row-invariant by construction: each row's own products
        return (rows[:, None, :] * weight[None]).sum(-1)  # [r, V]

    dense = torch.cat([torch.zeros(1, vocab), read_out(states)])  # [m, V]
    along = LogitRows(states, read_out, vocab, zero_rows=1)
    assert along.shape == dense.shape and torch.equal(along.rows(0, end - start), dense)
    assert _agreement(Candidate(None, lambda _: along, head_tokens), reference) == _agreement(
        Candidate(None, lambda _: dense, head_tokens), reference)


@pytest.mark.parametrize("blocks", [False, True])
def test_the_targets_logits_read_out_in_pieces_are_those_of_its_forward(blocks):
    """With the target's LM head at hand, the evaluation's reference keeps the last states and reads the logits
    out of them a few rows at a time: on block weights the same bits as the forward's logits, on transformers'
    modules the same numbers to rounding, the same argmaxes."""
    from helpers import family_model

    from specdec_cli import kernels
    from specdec_cli.distill.evaluate import AGREEMENT_ROWS, _target_along
    from specdec_cli.drafters.target import target_weights
    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant
    from specdec_cli.target_model.verify.exact_setup import states_forward

    if blocks and not kernels.available():
        pytest.skip("specdec's CPU kernels are not compiled")
    model = family_model("qwen2", seed=5)
    if blocks:
        quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    forward, weights = states_forward(model), target_weights(model)
    prompt = [1, *range(10, 19)]
    answer = torch.randint(4, 64, (2 * AGREEMENT_ROWS + 3,), generator=torch.Generator().manual_seed(2)).tolist()
    whole = _target_along(forward, prompt, answer)
    pieces = _target_along(forward, prompt, answer, weights=weights)
    read = pieces.target_logits.rows(0, len(answer))
    assert read.shape == whole.target_logits.shape == pieces.target_logits.shape
    assert torch.equal(read.argmax(-1), whole.target_logits.argmax(-1))
    if blocks:
        assert torch.equal(read, whole.target_logits)
    else:
        torch.testing.assert_close(read, whole.target_logits)
