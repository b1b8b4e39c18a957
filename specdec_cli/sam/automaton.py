"""Suffix automata over token ids: the static one (built in C, flat arrays) and the dynamic one (Python).

Both answer the same three questions for a *match state* `(state, match_len)`, the longest suffix of the
tokens seen so far that occurs in the automaton's text (docs/methods.md, section 2):

- `advance(state, match_len, token)`: the match state after one more token (follow suffix links until a
  transition on `token` exists, then take it; or fall back to the root with length 0);
- `continuation(state, max_tokens)`: the tokens that follow the earliest occurrence of the match,
  `text[min_endpos + 1:]`, stopping before a separator token and at the end of the text, never padded;
- `count(state)` (static only): how often the state's strings occur in the text;
- `frequent_continuation(state, max_tokens)` (static only): the continuation most of the match's occurrences
  take, token by token (as suffix trees over past outputs draft), rather than the earliest occurrence's.

`StaticAutomaton` holds struct-of-arrays data (int32 numpy arrays, possibly memory-mapped from an index
file) with transitions in CSR form; `build_static` makes one from a token array with the C extension.
`DynamicAutomaton` grows one token at a time (`extend`) for the running conversation: flat Python lists
per state and one dict for all transitions, no Python object per state.

This module does not read or write files (see index.py) and does not choose drafts (see drafters/sam.py).
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from ..errors import TOKEN_LIMIT, SpecdecError, TokenIdError  # ids < 2**31: int32 texts, keys (state << 32) | id

ROOT = 0
NO_STATE = -1


def _cut_at_separator(tokens: list[int], separators: frozenset[int]) -> list[int]:
    for position, token in enumerate(tokens):
        if token in separators:
            return tokens[:position]
    return tokens


class StaticAutomaton:
    """A finished suffix automaton as flat int32 arrays; never extended after the build."""

    def __init__(
        self,
        *,
        text: np.ndarray,
        link: np.ndarray,
        length: np.ndarray,
        min_endpos: np.ndarray,
        count: np.ndarray,
        trans_offsets: np.ndarray,
        trans_tokens: np.ndarray,
        trans_targets: np.ndarray,
        separators: Iterable[int] = (),
    ) -> None:
        self.text = text
        self.link = link
        self.length = length
        self.min_endpos = min_endpos
        self._count = count
        self.trans_offsets = trans_offsets
        self.trans_tokens = trans_tokens
        self.trans_targets = trans_targets
        self.separators = frozenset(int(token) for token in separators)

    @property
    def num_states(self) -> int:
        return len(self.link)

    @property
    def num_transitions(self) -> int:
        return len(self.trans_tokens)

    def arrays(self) -> dict[str, np.ndarray]:
        """The automaton's arrays by name (the text included), as stored in an index file."""
        return {
            "text": self.text,
            "link": self.link,
            "length": self.length,
            "min_endpos": self.min_endpos,
            "count": self._count,
            "trans_offsets": self.trans_offsets,
            "trans_tokens": self.trans_tokens,
            "trans_targets": self.trans_targets,
        }

    def transition(self, state: int, token: int) -> int:
        """Target of `state` on `token`, or -1 (binary search in the state's sorted CSR slice)."""
        begin = int(self.trans_offsets[state])
        end = int(self.trans_offsets[state + 1])
        if end - begin == 1:  # the common case away from the root
            return int(self.trans_targets[begin]) if int(self.trans_tokens[begin]) == token else NO_STATE
        if end == begin:
            return NO_STATE
        at = begin + int(np.searchsorted(self.trans_tokens[begin:end], token))
        if at < end and int(self.trans_tokens[at]) == token:
            return int(self.trans_targets[at])
        return NO_STATE

    def advance(self, state: int, match_len: int, token: int) -> tuple[int, int]:
        while True:
            target = self.transition(state, token)
            if target != NO_STATE:
                return target, match_len + 1
            if state == ROOT:
                return ROOT, 0
            state = int(self.link[state])
            match_len = int(self.length[state])

    def continuation(self, state: int, max_tokens: int) -> list[int]:
        if state == ROOT or max_tokens <= 0:
            return []
        start = int(self.min_endpos[state]) + 1
        return _cut_at_separator(self.text[start : start + max_tokens].tolist(), self.separators)

    def count(self, state: int) -> int:
        return int(self._count[state])

    def frequent_continuation(self, state: int, max_tokens: int) -> list[int]:
        """The continuation most occurrences take: from `state`, again and again the transition whose target
        occurs most often (the smaller token on a tie), stopped before a separator or where the text ends. A
        transition on `token` leads to the state of the matched string plus `token`, so its count is how often
        that token followed the match."""
        tokens: list[int] = []
        if state == ROOT:
            return tokens
        while len(tokens) < max_tokens:
            begin, end = int(self.trans_offsets[state]), int(self.trans_offsets[state + 1])
            if begin == end:
                break
            targets = self.trans_targets[begin:end]  # [children]
            best = int(np.argmax(self._count[targets]))  # the first maximum: tokens are sorted ascending
            token = int(self.trans_tokens[begin + best])
            if token in self.separators:
                break
            tokens.append(token)
            state = int(targets[best])
        return tokens


def state_capacity(num_tokens: int) -> int:
    """Upper bound on the number of states of a text of `num_tokens` tokens."""
    return max(2 * num_tokens, 1)


def transition_capacity(num_tokens: int) -> int:
    """Upper bound on the number of transitions (3n - 4 for n >= 3; 3n covers the short texts too)."""
    return max(3 * num_tokens, 1)


def build_static(
    tokens: np.ndarray, vocab_size: Optional[int] = None, separators: Iterable[int] = ()
) -> StaticAutomaton:
    """Build the automaton of `tokens` (int32 ids in [0, vocab_size)) with the C extension.

    The state and transition arrays are allocated at their worst-case sizes and sliced to the real ones;
    the unused tails are never touched, so they cost address space, not memory.
    """
    try:
        from . import _native  # type: ignore[attr-defined]  # the C extension, built by pip install
    except ImportError as exc:  # a source checkout that was never built
        raise SpecdecError(
            "the suffix-automaton builder (specdec_cli.sam._native) is not compiled: run `pip install -e .` "
            f"or `python setup.py build_ext --inplace` ({exc})"
        ) from exc

    given = np.asarray(tokens)
    if given.ndim != 1:
        raise ValueError("tokens must be a 1-d array")
    low, high = (int(given.min()), int(given.max())) if len(given) else (0, 0)
    if vocab_size is None:
        vocab_size = high + 1
    if low < 0 or high >= min(vocab_size, TOKEN_LIMIT):  # checked before the int32 cast, which would wrap them
        bad = low if low < 0 else high
        raise TokenIdError(f"token id {bad} is outside the vocabulary (ids 0 to {min(vocab_size, TOKEN_LIMIT) - 1})")
    text = np.ascontiguousarray(given, dtype=np.int32)
    n = len(text)
    states = state_capacity(n)
    link = np.empty(states, dtype=np.int32)
    length = np.empty(states, dtype=np.int32)
    min_endpos = np.empty(states, dtype=np.int32)
    count = np.empty(states, dtype=np.int32)
    trans_offsets = np.empty(states + 1, dtype=np.int32)
    trans_tokens = np.empty(transition_capacity(n), dtype=np.int32)
    trans_targets = np.empty(transition_capacity(n), dtype=np.int32)
    num_states, num_transitions = _native.build(
        text, int(vocab_size), link, length, min_endpos, count, trans_offsets, trans_tokens, trans_targets
    )
    return StaticAutomaton(
        text=text,
        link=link[:num_states],
        length=length[:num_states],
        min_endpos=min_endpos[:num_states],
        count=count[:num_states],
        trans_offsets=trans_offsets[: num_states + 1],
        trans_tokens=trans_tokens[:num_transitions],
        trans_targets=trans_targets[:num_transitions],
        separators=separators,
    )


class DynamicAutomaton:
    """An online suffix automaton over a growing token list (the conversation).

    Per-state data are flat lists; all transitions share one dict keyed by `(state << 32) | token`.
    Each state also keeps a linked list of its transition tokens (`_first_edge`, `_edge_token`,
    `_next_edge`), read only when the state is cloned. State numbering matches the C builder, so the
    arrays of both are comparable one to one (`to_arrays`).
    """

    def __init__(self, separators: Iterable[int] = ()) -> None:
        self.separators = frozenset(int(token) for token in separators)
        self.text: list[int] = []
        self.link: list[int] = [NO_STATE]
        self.length: list[int] = [0]
        self.min_endpos: list[int] = [NO_STATE]
        self._is_clone: list[bool] = [False]
        self._transitions: dict[int, int] = {}
        self._first_edge: list[int] = [-1]
        self._edge_token: list[int] = []
        self._next_edge: list[int] = []
        self._last = ROOT

    def __len__(self) -> int:
        return len(self.text)

    @property
    def num_states(self) -> int:
        return len(self.link)

    @property
    def num_transitions(self) -> int:
        return len(self._transitions)

    def _new_state(self, length: int, link: int, min_endpos: int, is_clone: bool) -> int:
        self.link.append(link)
        self.length.append(length)
        self.min_endpos.append(min_endpos)
        self._is_clone.append(is_clone)
        self._first_edge.append(-1)
        return len(self.link) - 1

    def _add_edge(self, state: int, token: int, target: int) -> None:
        self._transitions[(state << 32) | token] = target
        self._edge_token.append(token)
        self._next_edge.append(self._first_edge[state])
        self._first_edge[state] = len(self._edge_token) - 1

    def extend(self, token: int) -> None:
        """Append one token to the text (the classic online construction). An id outside [0, 2**31) is refused:
        packed into a transition key it would collide with every state's (a negative one made the walk loop)."""
        if not 0 <= token < TOKEN_LIMIT:
            raise TokenIdError(f"token id {token} is outside [0, {TOKEN_LIMIT}): not a token of any vocabulary")
        transitions = self._transitions
        link, length = self.link, self.length
        position = len(self.text)
        self.text.append(token)
        cur = self._new_state(length[self._last] + 1, NO_STATE, position, False)
        state = self._last
        while state != NO_STATE and ((state << 32) | token) not in transitions:
            self._add_edge(state, token, cur)
            state = link[state]
        if state == NO_STATE:
            link[cur] = ROOT
        else:
            split = transitions[(state << 32) | token]
            if length[state] + 1 == length[split]:
                link[cur] = split
            else:
                clone = self._new_state(length[state] + 1, link[split], self.min_endpos[split], True)
                edge = self._first_edge[split]
                while edge != -1:
                    edge_token = self._edge_token[edge]
                    self._add_edge(clone, edge_token, transitions[(split << 32) | edge_token])
                    edge = self._next_edge[edge]
                while state != NO_STATE and transitions.get((state << 32) | token) == split:
                    transitions[(state << 32) | token] = clone
                    state = link[state]
                link[split] = clone
                link[cur] = clone
        self._last = cur

    def advance(self, state: int, match_len: int, token: int) -> tuple[int, int]:
        if not 0 <= token < TOKEN_LIMIT:  # in no text (extend refuses it): matches nothing
            return ROOT, 0
        link, length, transitions = self.link, self.length, self._transitions
        # A clone made by `extend` since the last advance may now own the matched string: re-home it.
        while state != ROOT and match_len <= length[link[state]]:
            state = link[state]
        while True:
            target = transitions.get((state << 32) | token)
            if target is not None:
                return target, match_len + 1
            if state == ROOT:
                return ROOT, 0
            state = link[state]
            match_len = length[state]

    def continuation(self, state: int, max_tokens: int) -> list[int]:
        if state == ROOT or max_tokens <= 0:
            return []
        start = self.min_endpos[state] + 1
        return _cut_at_separator(self.text[start : start + max_tokens], self.separators)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The same arrays a static build of `text` produces (occurrence counts computed here)."""
        num_states = self.num_states
        count = [0 if clone else 1 for clone in self._is_clone]
        count[ROOT] = 0
        for state in sorted(range(1, num_states), key=self.length.__getitem__, reverse=True):
            count[self.link[state]] += count[state]
        by_state: list[list[tuple[int, int]]] = [[] for _ in range(num_states)]
        for key, target in self._transitions.items():
            by_state[key >> 32].append((key & 0xFFFFFFFF, target))
        offsets = [0]
        tokens: list[int] = []
        targets: list[int] = []
        for edges in by_state:
            edges.sort()
            tokens.extend(token for token, _ in edges)
            targets.extend(target for _, target in edges)
            offsets.append(len(tokens))
        as_array = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
        return {
            "text": as_array(self.text),
            "link": as_array(self.link),
            "length": as_array(self.length),
            "min_endpos": as_array(self.min_endpos),
            "count": as_array(count),
            "trans_offsets": as_array(offsets),
            "trans_tokens": as_array(tokens),
            "trans_targets": as_array(targets),
        }
