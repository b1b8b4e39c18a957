"""The prompt cache: the KV entries of the last generations, kept so that a next prompt that begins with the same
tokens (a chat client resending the whole conversation every turn) computes only what is new.

`PromptCache` holds the KV caches of up to `entries` earlier contexts (one by default, as `chat` and a one-slot
server need; `serve --parallel N` keeps N, so each conversation goes back to the entries of its own last turn) and
the token ids each holds entries for (the prompt and the answer, the answer's newest token excepted: the engine's
invariant between steps). `take(prompt_ids)` hands the engine the held cache with the longest common prefix with
the new prompt (never the whole prompt: its last token is always computed, since its logits choose the first new
token) and how many of the prompt's tokens it already holds. A cache that the prompt extends whole (the same
conversation, resent) leaves this object; with more than one entry, a cache the prompt shares only a beginning with
(another conversation's system prompt) stays for its own conversation and the prompt gets a copy of that beginning.
`keep` stores a cache back once a generation finished, in place of an entry it extends, else beside the others
(the least recently used beyond `entries` dropped). A generation that fails or is stopped midway keeps nothing
(its cache may hold entries of rows that were never committed): the next prompt is computed whole.

Where the forward is row-invariant (block weights, `--exact`), the engine computes every prompt, cached or not, in
blocks of at most its row-invariant size (engine.py, `prefill`), from the first token or after the cached ones:
an entry is then the same whichever block computed it, so an answer depends only on its tokens, never on what the
cache held, and `chat`, `serve`, `bench` and `chat --compare` give the same answer to the same prompt. This file
keeps entries; the engine computes them (engine.py) and the rollback helpers cut them (target_model/verify/rollback.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..target_model.verify.rollback import truncate_cache


@dataclass
class _Entry:
    cache: Any
    tokens: list[int]


class PromptCache:
    """The KV entries of up to `entries` earlier contexts, and the token ids they were computed for."""

    def __init__(self, entries: int = 1) -> None:
        if entries < 1:
            raise ValueError("a prompt cache holds at least one entry")
        self.entries = entries
        self.held: list[_Entry] = []  # least recently used first

    @staticmethod
    def _common(entry: _Entry, prompt_ids: Sequence[int]) -> int:
        """How many of the prompt's first tokens the entry holds (at most all but the prompt's last token)."""
        limit = min(len(entry.tokens), len(prompt_ids) - 1)
        common = 0
        while common < limit and entry.tokens[common] == prompt_ids[common]:
            common += 1
        return common

    def _best(self, prompt_ids: Sequence[int]) -> tuple[Optional[_Entry], int]:
        """The entry holding the most of the prompt's beginning (the most recent of equals), and how much."""
        best, most = None, 0
        for entry in self.held:
            common = self._common(entry, prompt_ids)
            if common >= most and common > 0:
                best, most = entry, common
        return best, most

    def common_prefix(self, prompt_ids: Sequence[int]) -> int:
        """How many of the prompt's first tokens a held cache holds (at most all but its last token)."""
        return self._best(prompt_ids)[1]

    def take(self, prompt_ids: Sequence[int]) -> tuple[Optional[Any], int]:
        """The held KV cache for this prompt and how many of its first tokens it already holds, or (None, 0) when
        none holds any of them (the engine starts a cache of its own). With one entry the cache always leaves this
        object (a failed generation leaves it empty); with more, a cache the prompt does not extend whole stays
        and the prompt gets a copy of the common beginning (where the cache can copy one)."""
        best, common = self._best(prompt_ids)
        if self.entries == 1:
            self.held = []  # one entry: whatever the prompt, it is this generation's (or nobody's)
        if best is None:
            return None, 0
        copy_prefix = getattr(best.cache, "copy_prefix", None)
        if self.entries > 1 and common < len(best.tokens) and copy_prefix is not None:
            self._touch(best)
            return copy_prefix(common), common
        if best in self.held:
            self.held.remove(best)
        truncate_cache(best.cache, common)
        return best.cache, common

    def keep(self, cache: Any, tokens: Sequence[int]) -> None:
        """Hold `cache`, whose entries are those of `tokens`, for a next prompt: in place of an entry whose tokens
        begin these (the same conversation, further on), the least recently used entry dropped beyond `entries`."""
        tokens = list(tokens)
        if self.entries == 1:
            self.held = []
        if cache.get_seq_length() != len(tokens):
            return  # entries that do not match the text are never reused
        self.held = [entry for entry in self.held if entry.tokens != tokens[: len(entry.tokens)]]
        self.held.append(_Entry(cache, tokens))
        del self.held[: max(0, len(self.held) - self.entries)]

    def continued_by(self, tokens: Sequence[int], at_least: int) -> Optional[tuple[Any, int]]:
        """The held cache that `tokens` continue, cut to the tokens they share with it, and how many it holds:
        the entry sharing the most of their beginning, at least `at_least` tokens (the conversation's own, not
        another's that shares a system prompt), or None. Where a conversation's next turn is computed ahead
        (`grown` records it); an answer whose last tokens read back otherwise (`.\\n\\n` generated as two line ends)
        loses them here as its next prompt would lose them."""
        best, common = self._best(list(tokens) + [-1])  # (every token of `tokens` may be held)
        if best is None or common < at_least or common >= len(tokens):
            return None
        if common < len(best.tokens):
            truncate_cache(best.cache, common)
            best.tokens = best.tokens[:common]
        return best.cache, common

    def grown(self, cache: Any, tokens: Sequence[int]) -> None:
        """The held `cache` now holds entries for `tokens` (computed on from what it held): the most recent."""
        for entry in self.held:
            if entry.cache is cache:
                entry.tokens = list(tokens)
                self._touch(entry)
                return

    def _touch(self, entry: _Entry) -> None:
        self.held.remove(entry)
        self.held.append(entry)

    def clear(self) -> None:
        self.held = []

    def __len__(self) -> int:
        """Tokens held by the most recently used entry (0: none)."""
        return len(self.held[-1].tokens) if self.held else 0
