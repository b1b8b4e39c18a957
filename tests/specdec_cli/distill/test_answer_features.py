"""The target's features kept while it answers (distill/answer_features.py, plain_many's `keep_features`): the rows
a head's training would compute, stored beside the data file, read back by a sequence's tokens, and used by
head_data.py instead of a forward."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import fixed_engine
from helpers import EOS, PROMPTS, family_model, make_tokenizer

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.decoding.plain_many import FeatureKeeper, plain_many
from specdec_cli.distill.answer_features import (
    INDEX,
    ROWS,
    AnswerFeatures,
    answers_folder,
    check_answers_folder,
    computed_by,
    handed_features,
)
from specdec_cli.distill.eagle_train import EagleTrainConfig, last_states
from specdec_cli.distill.head_data import head_data
from specdec_cli.errors import SpecdecError
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import quant
from specdec_cli.target_model.native.native import ROW_INVARIANT_ROWS

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")


@pytest.fixture(scope="module")
def block_llama():
    model = family_model("llama", vocab=96, seed=5)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    return model


def _states(model, sequence) -> torch.Tensor:
    """The rows training would compute [n, hidden] (in inference mode: the decoder's buffers were made in it)."""
    with torch.inference_mode():
        return last_states(model)(sequence)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to bfloat16's rounding (the store's) and the two forwards' summation orders."""
    return got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))


@needs_kernels
def test_answers_keep_the_features_training_would_compute_and_stay_the_same_answers(block_llama):
    long = [1, *torch.randint(4, 90, (ROW_INVARIANT_ROWS + 9,), generator=torch.Generator().manual_seed(2)).tolist()]
    prompts = [*PROMPTS, [1, 7, 7, 7, 7, 9], long]  # (the long one computed in pieces beside the others' steps)
    config = GenerationConfig(max_new_tokens=12, eos_token_ids=(EOS,))
    engine = fixed_engine(block_llama)
    forward = engine.forward
    plain = plain_many(forward, prompts, config, width=3)
    kept = plain_many(forward, prompts, config, width=3, keep_features=True)
    assert sorted((answer.index, answer.tokens) for answer in kept) == \
        sorted((answer.index, answer.tokens) for answer in plain)  # the same answers
    assert all(answer.features is None for answer in plain)
    for answer in kept:
        sequence = [*prompts[answer.index], *answer.tokens]
        assert answer.features is not None and answer.features.dtype == torch.bfloat16
        assert answer.features.shape == (len(sequence) - 1, block_llama.config.hidden_size)  # all but the newest
        assert _close(answer.features.float(), _states(block_llama, sequence)[:-1]), answer.index
        alone = FeatureKeeper()  # its prompt computed whole, its answer alone: the same bits
        engine.generate(prompts[answer.index], alone, config)
        assert torch.equal(answer.features, alone.features()), answer.index


def test_kept_rows_are_read_back_by_their_tokens_and_survive_a_crash(tmp_path):
    data = tmp_path / "answers.data.jsonl"
    folder = answers_folder(data)
    assert folder.name == "answers.data.features"
    first, second = [1, 2, 3, 4], [5, 6, 7]
    rows = torch.randn(3, 8), torch.randn(2, 8)
    store = AnswerFeatures(folder, "sha256:aa", 8)
    store.add(first, rows[0])
    store.add(second, rows[1])
    store.add(first, rows[0])  # (an answer seen again is kept once)
    with pytest.raises(ValueError):
        store.add([9, 9], torch.randn(2, 8))  # rows for every position but the newest, no more
    handed = handed_features(data, "sha256:aa", 8)
    assert handed is not None and len(handed) == 2 and handed.locate(second) == 3 and handed.locate([5, 6]) is None
    for tokens, want in zip((first, second), rows):
        assert torch.equal(handed.rows(tokens), want.to(torch.bfloat16).float())
    assert handed_features(data, "sha256:bb", 8) is None and handed_features(data, "sha256:aa", 16) is None
    # a crash: rows past the last whole line, and a line cut short
    with open(folder / ROWS, "ab") as handle:
        handle.write(b"\0" * 40)
    with open(folder / INDEX, "a", encoding="utf-8") as handle:
        handle.write('{"tokens": "x", "off')
    again = AnswerFeatures(folder, "sha256:aa", 8)
    assert again.end == 5 and (folder / ROWS).stat().st_size == 5 * 8 * 2
    again.add([8, 8, 8], torch.ones(2, 8))
    assert [json.loads(line)["offset"] for line in (folder / INDEX).read_text().splitlines()] == [0, 3, 5]
    handed = handed_features(data, "sha256:aa", 8)
    assert handed is not None and torch.equal(handed.rows([8, 8, 8]), torch.ones(2, 8))
    AnswerFeatures(folder, "sha256:cc", 8)  # another target's: started again
    assert handed_features(data, "sha256:aa", 8) is None and (folder / ROWS).stat().st_size == 0


def test_a_folder_specdec_did_not_write_is_refused_untouched(tmp_path):
    data = tmp_path / "mine.jsonl"
    folder = answers_folder(data)
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(SpecdecError, match="not a folder of answers' features"):
        check_answers_folder(data)
    with pytest.raises(SpecdecError):
        AnswerFeatures(folder, "sha256:aa", 8)
    assert sorted(path.name for path in folder.iterdir()) == ["notes.txt"]


def test_a_head_reads_the_kept_rows_instead_of_computing_them(tmp_path, tiny_llama):
    width = int(tiny_llama.config.hidden_size)
    sequences = [list(range(1, 22)), list(range(21, 40)), list(range(5, 30))]
    store = AnswerFeatures(answers_folder(tmp_path / "d.jsonl"), *computed_by(tiny_llama))
    kept_rows = torch.randn(len(sequences[0]) - 1, width)
    store.add(sequences[0], kept_rows)  # the first sequence's rows were kept; the others are computed
    handed = handed_features(tmp_path / "d.jsonl", *computed_by(tiny_llama))
    computed = []

    def features(piece):
        computed.append(list(piece))
        return torch.zeros(len(piece), width)

    config = EagleTrainConfig(head_vocab=0, holdout=0.34, max_len=12)
    data = head_data(tiny_llama, sequences, config, {"kind": "eagle"}, width, features, tmp_path / "store",
                     handed=handed)
    assert sorted(data.pieces) == sorted([list(range(1, 13)), list(range(13, 21)),  # (the kept one: a token short)
                                          list(range(21, 33)), list(range(5, 17)), list(range(17, 29))])
    assert sorted(piece[0] for piece in computed) == [5, 17, 21]  # never the kept one's
    ordered = data.train + data.held_out
    for index, piece in enumerate(ordered):
        rows = data.store[index]
        if piece[0] in (1, 13):
            start = piece[0] - 1
            assert torch.equal(rows, kept_rows[start : start + len(piece)].to(torch.bfloat16).float())
        else:
            assert not rows.any()


@needs_kernels
def test_answering_for_a_head_keeps_its_features_beside_the_data(tmp_path, block_llama):
    from specdec_cli.distill.generate import generate_data
    from specdec_cli.texts.data_rows import read_rows
    from specdec_cli.texts.prompts import Conversation

    tokenizer = make_tokenizer()
    assert len(tokenizer) <= block_llama.config.vocab_size
    items = [Conversation(str(number), "prompts", (text,)) for number, text in
             enumerate(["hello there", "add 2 and 3.", "name a colour."])]
    data = tmp_path / "answers.jsonl"
    generate_data(block_llama, tokenizer, "tiny", items, str(data), max_new_tokens=6, batch_size=2,
                  keep_features=True)
    handed = handed_features(data, *computed_by(block_llama))
    rows = read_rows(str(data))
    assert handed is not None and len(handed) == len(rows) == 3
    for row in rows:
        sequence = [*row["prompt_ids"], *row["answer_ids"]]
        assert _close(handed.rows(sequence), _states(block_llama, sequence)[:-1])
    student = tmp_path / "student.jsonl"  # not asked: nothing kept
    generate_data(block_llama, tokenizer, "tiny", items, str(student), max_new_tokens=6, batch_size=2)
    assert not answers_folder(student).exists()
