"""The prompt cache: the KV entries of the last generation, kept so that the next prompt that begins with the same
tokens (a chat client resending the whole conversation every turn) computes only what is new.

`PromptCache` holds one KV cache and the token ids it holds entries for (the prompt and the answer, the answer's
newest token excepted: the engine's invariant between steps). `take(prompt_ids)` hands the engine the cache cut
back to the longest common prefix with the new prompt (never the whole prompt: its last token is always computed,
since its logits choose the first new token) and how many of the prompt's tokens it already holds; `keep` stores
the cache back once a generation finished. A generation that fails or is stopped midway keeps nothing (its cache
may hold entries of rows that were never committed): the next prompt is computed whole.

Where the forward is row-invariant (block weights, `--exact`), the engine computes every prompt, cached or not, in
blocks of at most its row-invariant size (engine.py, `prefill`), from the first token or after the cached ones:
an entry is then the same whichever block computed it, so an answer depends only on its tokens, never on what the
cache held, and `chat`, `serve`, `bench` and `chat --compare` give the same answer to the same prompt. This file
keeps entries; the engine computes them (engine.py) and the rollback helpers cut them (target_model/verify/rollback.py).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..target_model.verify.rollback import truncate_cache


class PromptCache:
    """The KV entries of one earlier context, and the token ids they were computed for."""

    def __init__(self) -> None:
        self.cache: Optional[Any] = None
        self.tokens: list[int] = []

    def common_prefix(self, prompt_ids: Sequence[int]) -> int:
        """How many of the prompt's first tokens the cache holds (at most all but its last token)."""
        if self.cache is None:
            return 0
        limit = min(len(self.tokens), len(prompt_ids) - 1)
        common = 0
        while common < limit and self.tokens[common] == prompt_ids[common]:
            common += 1
        return common

    def take(self, prompt_ids: Sequence[int]) -> tuple[Optional[Any], int]:
        """The held KV cache for this prompt and how many of its first tokens it already holds, or (None, 0) when it
        holds none of them (the engine starts a cache of its own); the cache leaves this object (a failed
        generation leaves it empty)."""
        common = self.common_prefix(prompt_ids)
        cache, self.cache, self.tokens = self.cache, None, []
        if cache is None or common == 0:
            return None, 0
        truncate_cache(cache, common)
        return cache, common

    def keep(self, cache: Any, tokens: Sequence[int]) -> None:
        """Hold `cache`, whose entries are those of `tokens`, for the next prompt."""
        if cache.get_seq_length() != len(tokens):
            self.clear()  # entries that do not match the text are never reused
            return
        self.cache, self.tokens = cache, list(tokens)

    def clear(self) -> None:
        self.cache, self.tokens = None, []

    def __len__(self) -> int:
        return len(self.tokens)
