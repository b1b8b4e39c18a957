"""Batched answer generation for distill (distill/batched.py): the same greedy answers as one by one."""

from __future__ import annotations

import pytest
from conftest import TINY_EOS, TINY_VOCAB, _tiny, hf_greedy

PROMPTS = [[5, 9, 13], [7, 8, 9, 10, 11, 12, 40, 41, 42], [3], [20, 21, 22, 23, 24], [49, 48, 47, 46, 45, 44, 43]]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_batched_answers_equal_one_by_one_greedy_answers(kind, batch_size):
    from specdec_cli.distill.batched import greedy_batches

    model = _tiny(kind)
    expected = [hf_greedy(model, prompt, 12) for prompt in PROMPTS]
    answers = greedy_batches(model, PROMPTS, max_new_tokens=12, eos_token_ids=[TINY_EOS], batch_size=batch_size)
    assert sorted(answer.index for answer in answers) == list(range(len(PROMPTS)))
    for answer in answers:
        assert answer.tokens == expected[answer.index]
        assert answer.finish_reason == ("eos" if answer.tokens[-1] == TINY_EOS else "length")


def test_an_answer_that_ends_early_stops_while_the_batch_goes_on():
    from specdec_cli.distill.batched import greedy_batches

    model = _tiny("llama")
    plain = [hf_greedy(model, prompt, 12, eos=None) for prompt in PROMPTS]
    # an EOS that ends the first answer early and never occurs in the second
    end = next(k for k in range(1, 12) if plain[0][k] not in plain[1] and plain[0][k] not in plain[0][:k])
    eos = plain[0][end]
    answers = {answer.index: answer for answer in greedy_batches(model, PROMPTS, max_new_tokens=12,
                                                                 eos_token_ids=[eos], batch_size=5)}
    assert answers[0].tokens == plain[0][: end + 1] and answers[0].finish_reason == "eos"
    assert answers[1].tokens == plain[1] and answers[1].finish_reason == "length"
    assert 0 < eos < TINY_VOCAB


def test_generate_data_in_batches_resumes_and_keeps_finished_rows(tmp_path):
    from helpers import make_tokenizer

    from specdec_cli.distill.generate import generate_data
    from specdec_cli.texts.data_rows import read_rows
    from specdec_cli.texts.prompts import Conversation

    model, tokenizer = _tiny("llama"), make_tokenizer()
    texts = ["hello there", "add 2 and 3.", "name a colour.", "write one word.", "what is a cat?"]
    items = [Conversation(str(number), "prompts", (text,)) for number, text in enumerate(texts)]
    data = tmp_path / "answers.jsonl"
    seen = []

    def stop_after_three(progress):
        seen.append(progress.done)
        if progress.done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_data(model, tokenizer, "tiny", items, str(data), max_new_tokens=8, batch_size=2,
                      on_progress=stop_after_three)
    kept = read_rows(str(data))
    assert len(kept) == 3 and seen == [1, 2, 3]  # rows are whole and written as they finish
    summary = generate_data(model, tokenizer, "tiny", items, str(data), max_new_tokens=8, batch_size=2)
    assert (summary.written, summary.skipped, summary.rows) == (2, 3, 5)
    rows = read_rows(str(data))
    for row in rows:
        assert row["answer_ids"] == hf_greedy(model, row["prompt_ids"], 8)
    with pytest.raises(Exception, match="greedy"):
        generate_data(model, tokenizer, "tiny", items, str(data), max_new_tokens=8, batch_size=2, temperature=0.5)
