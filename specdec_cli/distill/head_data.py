"""What a head trains on: token sequences cut into pieces, split into training and held-out pieces, the tokens it
drafts, and the target's features over every piece (in the feature store, feature_store.py).

A sequence is an answer of `specdec distill generate` (its prompt, then the target's answer) or a corpus's text.
Every position of a piece is context for the head's attention, but only the positions a draft is ever asked for
are taught and scored: those of the answer (`answer_from`, the prompt's length; a corpus's text is all answer).
A prompt's own text (a user's words, a template, a system prompt) is not what the head drafts, and on the
default data it is 45% of the positions.

This file computes nothing itself: the features come from the function its caller passes (eagle_train.py's last
hidden states, eagle3_train.py's three layers), or, for a sequence whose answering kept them (answer_features.py),
from that store: such a sequence is cut without its last token (its rows stop one short), and its pieces' rows are
the answering's, over the sequence's whole context. It does not train.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import SpecdecError
from ..texts.data_rows import read_rows
from .answer_features import HandedFeatures
from .data import items_digest
from .feature_store import FeatureStore, StorePart, feature_store, target_identity

MIN_PIECE = 8  # shorter pieces are dropped


@dataclass(frozen=True)
class EagleProgress:
    phase: str  # "features" | "train"
    done: int
    total: int
    loss: Optional[float] = None


def pieces(sequences: Sequence[Sequence[int]], max_len: int) -> list[list[int]]:
    """Sequences cut into pieces of at most max_len tokens (pieces shorter than MIN_PIECE tokens are dropped)."""
    return [piece for piece, _, _ in _cut(sequences, max_len, None)]


def _cut(sequences: Sequence[Sequence[int]], max_len: int,
         answer_starts: Optional[Sequence[int]]) -> list[tuple[list[int], int, tuple[int, int]]]:
    """(piece, its first answer position within the piece, 0 when all of it is answer, (its sequence, its start
    there)) for every piece."""
    out = []
    for index, sequence in enumerate(sequences):
        answer_from = 0 if answer_starts is None else int(answer_starts[index])
        for start in range(0, len(sequence), max_len):
            piece = list(sequence[start : start + max_len])
            if len(piece) >= MIN_PIECE:
                out.append((piece, max(0, answer_from - start), (index, start)))
    return out


def choose_head_tokens(pieces_: Sequence[Sequence[int]], size: int, vocab: int) -> Optional[list[int]]:
    """The `size` most frequent tokens of the data (ties by id); None = the whole vocabulary."""
    if size <= 0 or size >= vocab:
        return None
    counts = Counter(token for piece in pieces_ for token in piece)
    ranked = sorted(counts, key=lambda token: (-counts[token], token))[:size]
    filler = (token for token in range(vocab) if token not in counts)
    while len(ranked) < size:
        ranked.append(next(filler))
    return sorted(ranked)


def split_order(count: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """(training indices, held-out indices) of `count` pieces: `holdout` of them (at least one) kept apart at random
    with `seed`."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    held = max(1, round(count * holdout)) if holdout > 0 else 0
    return order[held:], order[:held]


@dataclass(frozen=True)
class HeadData:
    """Training sequences cut into pieces, split into training and held-out pieces, with the target's features
    (read from the feature store one piece at a time) and where each piece's answer begins."""

    pieces: list[list[int]]
    train: list[list[int]]
    held_out: list[list[int]]
    train_from: list[int]  # per training piece, its first answer position (the rows before are context only)
    held_from: list[int]  # the same per held-out piece
    head_tokens: Optional[list[int]]  # the tokens the head drafts (None = all)
    store: FeatureStore  # the training pieces' features, then the held-out pieces'
    reused: bool  # the store was read from disk (a resumed run), not computed

    @property
    def train_features(self) -> StorePart:  # [n, width] float32 per training piece
        return self.store.part(0, len(self.train))

    @property
    def held_features(self) -> StorePart:  # [n, width] float32 per held-out piece
        return self.store.part(len(self.train), len(self.store))


def head_data(target: Any, sequences: Sequence[Sequence[int]], config: Any, what: dict, width: int,
              features: Callable[[Sequence[int]], Any], folder: Optional[Path] = None,
              on_progress: Optional[Callable[[EagleProgress], None]] = None,
              answer_starts: Optional[Sequence[int]] = None, handed: Optional[HandedFeatures] = None) -> HeadData:
    """Pieces of at most `config.max_len` tokens, `config.holdout` of them kept apart at random (`config.seed`),
    the head's tokens (the training pieces' most frequent `config.head_vocab`), and `features(piece)` [n, width]
    for every piece: read from the store in `folder` when it holds them for this target, these pieces and `what`,
    else computed into it. `answer_starts`: each sequence's first answer position (None: all answer); `handed`: the
    rows the answering kept, read instead of computed for the sequences it holds."""
    kept = [None if handed is None else handed.locate(sequence) for sequence in sequences]  # row offsets, or None
    cut = _cut([sequence if offset is None else sequence[:-1] for sequence, offset in zip(sequences, kept)],
               config.max_len, answer_starts)
    if len(cut) < 2:
        raise SpecdecError("too little data to train a head: give answers from `specdec distill generate` or a "
                           "corpus with at least two pieces of 8+ tokens")
    train_order, held_order = split_order(len(cut), config.holdout, config.seed)
    train, held_out = [cut[index][0] for index in train_order], [cut[index][0] for index in held_order]
    head_tokens = choose_head_tokens(train, config.head_vocab, int(target.config.vocab_size))
    ordered = train + held_out
    origins = [cut[index][2] for index in train_order + held_order]  # (sequence, start) of each ordered piece
    key = {**what, "target": target_identity(target), "pieces": items_digest(ordered)}

    def compute(index: int) -> Any:
        sequence, start = origins[index]
        offset = kept[sequence]
        rows = None if handed is None or offset is None else handed.read(offset + start, len(ordered[index]))
        if rows is None:  # [n, width]: the answering's where kept, else computed
            rows = features(ordered[index])
        if on_progress is not None:
            on_progress(EagleProgress("features", index + 1, len(ordered)))
        return rows

    store, reused = feature_store(folder, key, len(ordered), width, compute)
    return HeadData([piece for piece, _, _ in cut], train, held_out, [cut[index][1] for index in train_order],
                    [cut[index][1] for index in held_order], head_tokens, store, reused)


def training_sequences(tokenizer: Any, fingerprint: str, target_name: str, data: Optional[str],
                       corpus: Sequence[str] = ()) -> tuple[list[list[int]], list[int], dict]:
    """Token sequences to train on: each answer of a `distill generate` file (prompt and answer together,
    checked against the target's tokenizer) and the text of any corpus files; each one's first answer position
    (its prompt's length; 0 for a corpus); and their sizes."""
    from ..texts.corpus import iter_documents, tokenize_documents
    from ..texts.corpus_inputs import CorpusStats, resolve_inputs

    sequences: list[list[int]] = []
    answer_starts: list[int] = []
    if data:
        for row in read_rows(data, fingerprint, target_name):
            prompt = [int(token) for token in row["prompt_ids"]]
            sequences.append(prompt + [int(token) for token in row["answer_ids"]])
            answer_starts.append(len(prompt))
    answers = sum(len(sequence) for sequence in sequences)
    corpus_tokens = 0
    if corpus:
        stats = CorpusStats()
        ids, _ = tokenize_documents(iter_documents(resolve_inputs(list(corpus), stats=stats), "text", stats), tokenizer)
        sequences.append([int(token) for token in ids])
        answer_starts.append(0)
        corpus_tokens = int(len(ids))
    if not sequences or not answers + corpus_tokens:
        raise SpecdecError("no training data: give --data (answers from `specdec distill generate`) or --corpus")
    sizes = {"answer_tokens": answers, "corpus_tokens": corpus_tokens, "data": data, "corpus": list(corpus)}
    return sequences, answer_starts, sizes
