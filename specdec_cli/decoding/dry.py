"""DRY ("don't repeat yourself"), the sequence penalty llama.cpp's server takes (`dry_multiplier`, ...): a token that
would extend a stretch of the context already seen earlier is penalised, the more the longer the stretch.

For a row whose context (prompt, answer and draft path; its last `last_n` tokens) ends in the tokens s, each earlier
place where s's last L tokens also stand (L >= `allowed_length`) makes the token that followed there cost
`multiplier * base ** (L - allowed_length)` (the longest such L per token; the exponent capped where float32 would
overflow). A stretch is not counted back past the latest sequence breaker (by default a line end, ':', '"' or
'*'), and a token whose text holds a breaker is never penalised. These are the semantics of llama.cpp's DRY sampler
(after koboldcpp's, after text-generation-webui's), breakers matched as llama.cpp matches them: a token whose text
holds the breaker, or whose text ends in the breaker's beginning followed by the tokens of its rest.

Pure functions over token lists; `Run.shaped` applies `dry_penalties` to each verify row after the repetition
penalties (llama.cpp's order), so a drafted row is judged as plain decoding judges the same position. What this
file does not do: read request bodies (server/requests.py) or choose tokens.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import SpecdecError

DEFAULT_BREAKERS = ("\n", ":", '"', "*")  # llama-server's dry_sequence_breakers
MAX_BREAKER_CHARS = 40  # a longer breaker is cut to this (llama.cpp's limit)
MAX_TAIL_TOKENS = 20  # the tokens of a breaker's rest that are matched (llama.cpp's limit)
MAX_BREAKERS = 64  # the most breakers a request may give
FLOAT32_MAX_LOG = 88.7228391  # log of float32's largest value: the exponent's cap is this over log(base)


@dataclass(frozen=True)
class DryPenalty:
    """llama-server's DRY settings: `multiplier` (0 = off), `base`, `allowed_length`, `last_n` (the tokens looked
    back over; -1: the whole context, 0: off) and the sequence breakers as text."""

    multiplier: float
    base: float = 1.75
    allowed_length: int = 2
    last_n: int = -1
    breakers: tuple[str, ...] = DEFAULT_BREAKERS

    @property
    def on(self) -> bool:
        return self.multiplier != 0 and self.last_n != 0

    def check(self) -> None:
        if not 0 <= self.multiplier < math.inf:
            raise SpecdecError(f"dry_multiplier must be a number >= 0 (0 = off), got {self.multiplier}",
                               setting="dry_multiplier")
        if not 1 <= self.base < math.inf:
            raise SpecdecError(f"dry_base must be a number >= 1, got {self.base}", setting="dry_base")
        if self.allowed_length < 0:
            raise SpecdecError(f"dry_allowed_length must be >= 0, got {self.allowed_length}",
                               setting="dry_allowed_length")
        if self.last_n < -1:
            raise SpecdecError(f"dry_penalty_last_n must be >= -1 (-1: the whole context, 0: off), got {self.last_n}",
                               setting="dry_penalty_last_n")
        if not 0 < len(self.breakers) <= MAX_BREAKERS or not all(self.breakers):
            raise SpecdecError(f"dry_sequence_breakers must be 1 to {MAX_BREAKERS} non-empty strings",
                               setting="dry_sequence_breakers")


@dataclass(frozen=True)
class Breakers:
    """The breakers as token sequences: each head token's possible tails (the tokens after it that complete a
    breaker; () when the head's own text holds one), and the tokens whose text holds one (never penalised)."""

    tails: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    whole: frozenset[int] = frozenset()


_BREAKERS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Breakers]]" = weakref.WeakKeyDictionary()


def breakers_for(tokenizer: Any, breakers: Sequence[str]) -> Breakers:
    """`breakers` as `tokenizer`'s token sequences (made once per tokenizer and breaker set)."""
    made = _BREAKERS.setdefault(tokenizer, {})
    key = tuple(breakers)
    if key not in made:
        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        made[key] = token_breakers(token_texts(tokenizer), encode, key)
    return made[key]


def token_texts(tokenizer: Any) -> list[str]:
    """Each token id's text alone, special tokens written out."""
    ids = [[token] for token in range(len(tokenizer))]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode_batch(ids, skip_special_tokens=False)
    return [tokenizer.decode(one, skip_special_tokens=False) for one in ids]


def token_breakers(texts: Sequence[str], encode: Any, breakers: Sequence[str]) -> Breakers:
    """Which tokens begin a breaker, and with which tails: a token whose text holds the breaker whole (no tail), or
    whose text ends in the breaker's beginning (the tokens of the breaker's rest, at most MAX_TAIL_TOKENS)."""
    tails: dict[int, list[tuple[int, ...]]] = {}
    for breaker in breakers:
        breaker = breaker[:MAX_BREAKER_CHARS]
        for token, text in enumerate(texts):
            if breaker in text:
                found = [()]
            else:  # each place the text's end is the breaker's beginning
                found = [tuple(encode(breaker[len(text) - start :])[:MAX_TAIL_TOKENS])
                         for start in range(len(text)) if breaker.startswith(text[start:])]
            for tail in found:
                if tail not in tails.setdefault(token, []):
                    tails[token].append(tail)
    whole = frozenset(token for token, ends in tails.items() if () in ends)
    return Breakers({token: tuple(ends) for token, ends in tails.items() if ends}, whole)


def dry_rows(logits: Any, context: Sequence[int], draft: Any, dry: DryPenalty, breakers: Breakers) -> Any:
    """`logits` [rows, vocab] of a block after `context` (the prompt and the answer so far) and `draft`'s paths,
    less each row's DRY penalties (written into `logits`, a caller's copy; rows past the draft are padding)."""
    import torch

    paths = [[]] if draft is None else draft.row_paths()[: logits.shape[0]]  # row r: the path to node r - 1
    kept = np.asarray(context[-dry.last_n :] if dry.last_n > 0 else context, dtype=np.int64)
    for row, path in enumerate(paths):
        window = np.concatenate([kept, np.asarray(path, dtype=np.int64)])
        found = dry_penalties(window[-dry.last_n :] if dry.last_n > 0 else window, dry, breakers)
        if found:
            index = torch.tensor(list(found), dtype=torch.long, device=logits.device)
            logits[row, index] -= torch.tensor(list(found.values()), dtype=torch.float32).to(logits.device,
                                                                                             logits.dtype)
    return logits


def dry_penalties(window: np.ndarray, dry: DryPenalty, breakers: Breakers) -> dict[int, float]:
    """The penalty for each token that would extend a repeat after `window` (a row's last `last_n` tokens of
    prompt, answer and path; int64 [n]); {} when nothing would."""
    count = len(window)
    if not dry.on or count <= dry.allowed_length:
        return {}
    limit = _repeat_limit(window, breakers)
    if limit < dry.allowed_length:
        return {}
    # each earlier place the last token stands, and how far back the text before it matches the context's end
    ends = np.flatnonzero(window[:-1] == window[-1])  # [m] end positions
    lengths = np.ones(len(ends), dtype=np.int64)  # [m]
    alive = np.arange(len(ends))
    back = 1
    while len(alive) and back < limit:
        before = ends[alive] - back
        alive = alive[(before >= 0) & (window[np.maximum(before, 0)] == window[count - 1 - back])]
        lengths[alive] += 1
        back += 1
    # an allowed length of 0 counts every token after the first as extending a repeat of none
    longest: dict[int, int] = dict.fromkeys(window[1:].tolist(), 0) if dry.allowed_length == 0 else {}
    for end, length in zip(ends.tolist(), lengths.tolist()):  # (each at most `limit`)
        if length >= dry.allowed_length:
            token = int(window[end + 1])
            longest[token] = max(longest.get(token, 0), length)
    # the exponent capped where float32 would overflow (none for a base of about 1, or one past float32's range)
    found = int(FLOAT32_MAX_LOG / math.log(dry.base)) if dry.base > 1.000001 else 0
    cap = found if found > 0 else math.inf
    return {token: dry.multiplier * dry.base ** min(length - dry.allowed_length, cap)
            for token, length in longest.items() if token not in breakers.whole}


def _repeat_limit(window: np.ndarray, breakers: Breakers) -> int:
    """How many tokens at the window's end follow its latest breaker (its whole length when it holds none)."""
    count = len(window)
    for back in range(count):  # the head's distance from the end
        tails = breakers.tails.get(int(window[count - 1 - back]))
        if tails is None:
            continue
        after = window[count - back :].tolist()  # the tokens after the head
        longest = max((len(tail) for tail in tails if len(tail) <= back and list(tail) == after[: len(tail)]),
                      default=-1)
        if longest >= 0:
            return back - longest
    return count
