"""Suffix automata against brute force: exhaustive over short strings, hypothesis over longer ones.

Checked for the static (C-built) automaton: minimality (one state per end-position class), the state of
every substring (length range, earliest end position, occurrence count), transitions exist exactly for
substrings, continuation of the earliest occurrence (stopping at the separator, never padded), and the
longest-suffix match reached by `advance`. The dynamic automaton must equal a static build at every
prefix, and the drafter's order (advance, then extend) must still give the longest match.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_cli.sam.automaton import ROOT, DynamicAutomaton, StaticAutomaton, build_static

SEPARATOR = 0  # token 0 plays the EOS: continuations stop before it


def substring_ends(text: tuple[int, ...]) -> dict[tuple[int, ...], list[int]]:
    """Every distinct non-empty substring -> sorted end positions (index of its last token)."""
    ends: dict[tuple[int, ...], list[int]] = {}
    for start in range(len(text)):
        for stop in range(start + 1, len(text) + 1):
            ends.setdefault(text[start:stop], []).append(stop - 1)
    for positions in ends.values():
        positions.sort()
    return ends


def longest_suffix_in(query: tuple[int, ...], substrings) -> int:
    for length in range(len(query), 0, -1):
        if query[len(query) - length :] in substrings:
            return length
    return 0


def expected_continuation(text, end: int, max_tokens: int) -> list[int]:
    following = list(text[end + 1 : end + 1 + max_tokens])
    return following[: following.index(SEPARATOR)] if SEPARATOR in following else following


def check_against_brute_force(text: tuple[int, ...], alphabet: int, substrings=None, max_tokens: int = 6):
    """Check the static automaton of `text` on `substrings` (default: all); returns it and the brute force."""
    automaton = build_static(np.array(text, dtype=np.int32), vocab_size=alphabet, separators=(SEPARATOR,))
    ends = substring_ends(text)
    link, length = automaton.link.tolist(), automaton.length.tolist()
    min_endpos, count = automaton.min_endpos.tolist(), automaton.arrays()["count"].tolist()
    offsets, tokens, targets = (automaton.trans_offsets.tolist(), automaton.trans_tokens.tolist(),
                                automaton.trans_targets.tolist())
    transitions = {}
    for state in range(automaton.num_states):
        row = tokens[offsets[state] : offsets[state + 1]]
        assert row == sorted(row)  # CSR slices are sorted by token
        for at in range(offsets[state], offsets[state + 1]):
            transitions[state, tokens[at]] = targets[at]

    # Minimal: one state per distinct end-position set, plus the root.
    assert automaton.num_states == 1 + len({tuple(positions) for positions in ends.values()})
    assert link[ROOT] == -1 and length[ROOT] == 0 and count[ROOT] == len(text)

    for substring in substrings if substrings is not None else ends:
        state = ROOT
        for token in substring:
            state = transitions[state, token]
        positions = ends[substring]
        assert length[link[state]] < len(substring) <= length[state]
        assert min_endpos[state] == positions[0]
        assert count[state] == automaton.count(state) == len(positions)
        for token in range(alphabet):
            assert ((state, token) in transitions) == (substring + (token,) in ends)
        assert automaton.continuation(state, max_tokens) == expected_continuation(text, positions[0], max_tokens)
    assert automaton.continuation(ROOT, max_tokens) == []
    return automaton, ends


def check_advance(automaton, query: tuple[int, ...], substrings) -> None:
    state, match_len = ROOT, 0
    for position, token in enumerate(query):
        state, match_len = automaton.advance(state, match_len, token)
        assert match_len == longest_suffix_in(query[: position + 1], substrings)
        if match_len:
            assert automaton.length[automaton.link[state]] < match_len <= automaton.length[state]


def test_exhaustive_ternary_strings_up_to_length_8():
    rng = random.Random(3)
    for size in range(1, 9):
        for text in itertools.product(range(3), repeat=size):
            automaton, ends = check_against_brute_force(text, 3)
            check_advance(automaton, tuple(rng.randrange(3) for _ in range(10)), ends)


def test_empty_and_single_token_texts():
    empty = build_static(np.zeros(0, dtype=np.int32), vocab_size=5)
    assert empty.num_states == 1 and empty.num_transitions == 0
    assert empty.advance(ROOT, 0, 3) == (ROOT, 0)
    run = build_static(np.full(50, 2, dtype=np.int32), vocab_size=3)
    assert run.num_states == 51 and run.num_transitions == 50
    state, match_len = ROOT, 0
    for _ in range(60):
        state, match_len = run.advance(state, match_len, 2)
    assert match_len == 50
    assert run.advance(state, match_len, 1) == (ROOT, 0)


def test_build_rejects_out_of_range_tokens():
    with pytest.raises(ValueError):
        build_static(np.array([0, 1, 7], dtype=np.int32), vocab_size=4)
    with pytest.raises(ValueError):
        build_static(np.array([0, -1], dtype=np.int32), vocab_size=4)


small_texts = st.integers(min_value=2, max_value=4).flatmap(
    lambda alphabet: st.tuples(st.just(alphabet), st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=160))
)


@settings(max_examples=60, deadline=None)
@given(small_texts, st.randoms(use_true_random=False))
def test_longer_random_strings(alphabet_and_text, rng):
    alphabet, tokens = alphabet_and_text
    text = tuple(tokens)
    ends = substring_ends(text)
    sample = rng.sample(sorted(ends), min(len(ends), 150))
    automaton, _ = check_against_brute_force(text, alphabet, substrings=sample, max_tokens=10)
    query = tuple(rng.randrange(alphabet) for _ in range(40))
    check_advance(automaton, query, ends)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.lists(st.integers(0, k - 1), min_size=0, max_size=70)))
def test_dynamic_equals_static_at_every_prefix(tokens):
    dynamic = DynamicAutomaton()
    for position, token in enumerate(tokens):
        dynamic.extend(token)
        expected = build_static(np.array(tokens[: position + 1], dtype=np.int32), vocab_size=4).arrays()
        got = dynamic.to_arrays()
        for name, array in expected.items():
            assert np.array_equal(got[name], array), name


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.lists(st.integers(0, k - 1), min_size=1, max_size=80)))
def test_advance_then_extend_finds_the_longest_earlier_match(tokens):
    """The drafter's order: the match state, advanced before the token is added, survives the clones
    that adding it makes, and its continuation is the text after the earliest earlier occurrence."""
    dynamic = DynamicAutomaton(separators=(SEPARATOR,))
    state, match_len = ROOT, 0
    for position, token in enumerate(tokens):
        state, match_len = dynamic.advance(state, match_len, token)
        earlier = substring_ends(tuple(tokens[:position]))
        assert match_len == longest_suffix_in(tuple(tokens[: position + 1]), earlier)
        dynamic.extend(token)
        if match_len:
            suffix = tuple(tokens[position + 1 - match_len : position + 1])
            first_end = earlier[suffix][0]
            assert dynamic.continuation(state, 5) == expected_continuation(tuple(tokens[: position + 1]), first_end, 5)
        else:
            assert dynamic.continuation(state, 5) == []


def test_dynamic_and_static_advance_agree_on_a_long_text():
    rng = random.Random(11)
    tokens = [rng.randrange(6) for _ in range(3000)]
    dynamic = DynamicAutomaton()
    for token in tokens:
        dynamic.extend(token)
    static = build_static(np.array(tokens, dtype=np.int32), vocab_size=6)
    assert isinstance(static, StaticAutomaton)
    dynamic_state = static_state = ROOT
    dynamic_len = static_len = 0
    for _ in range(2000):
        token = rng.randrange(6)
        dynamic_state, dynamic_len = dynamic.advance(dynamic_state, dynamic_len, token)
        static_state, static_len = static.advance(static_state, static_len, token)
        assert (dynamic_state, dynamic_len) == (static_state, static_len)
        assert dynamic.continuation(dynamic_state, 7) == static.continuation(static_state, 7)


def test_continuation_is_never_padded_and_stops_at_separator():
    text = np.array([5, 6, 7, 0, 5, 6, 8], dtype=np.int32)
    automaton = build_static(text, vocab_size=9, separators=(0,))
    state, match_len = ROOT, 0
    for token in (5, 6):
        state, match_len = automaton.advance(state, match_len, token)
    assert match_len == 2
    assert automaton.continuation(state, 10) == [7]  # the earliest occurrence, cut before the separator
    state, match_len = automaton.advance(state, match_len, 8)
    assert automaton.continuation(state, 10) == []  # end of text: nothing, not padding


def frequent_by_brute_force(text: list[int], matched: list[int], max_tokens: int, separators: set) -> list[int]:
    """Extend the matched string by the token that most often follows its occurrences (smaller on a tie)."""
    out: list[int] = []
    current = list(matched)
    while len(out) < max_tokens:
        follows: dict[int, int] = {}
        for end in range(len(current), len(text)):
            if text[end - len(current) : end] == current:
                follows[text[end]] = follows.get(text[end], 0) + 1
        if not follows:
            break
        token = min(follows, key=lambda candidate: (-follows[candidate], candidate))
        if token in separators:
            break
        out.append(token)
        current.append(token)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_the_frequent_continuation_follows_the_most_common_next_token(tokens, query):
    automaton = build_static(np.array(tokens, dtype=np.int32), vocab_size=4, separators=(0,))
    state, match_len = ROOT, 0
    for token in query:
        state, match_len = automaton.advance(state, match_len, token)
    matched = query[len(query) - match_len :] if match_len else []
    expected = frequent_by_brute_force(tokens, matched, 6, {0}) if match_len else []
    assert automaton.frequent_continuation(state, 6) == expected


def test_the_frequent_continuation_differs_from_the_earliest_occurrence():
    text = np.array([5, 6, 7, 0, 5, 6, 8, 0, 5, 6, 8, 9], dtype=np.int32)
    automaton = build_static(text, vocab_size=10, separators=(0,))
    state, match_len = ROOT, 0
    for token in (5, 6):
        state, match_len = automaton.advance(state, match_len, token)
    assert automaton.continuation(state, 3) == [7]  # the earliest occurrence
    # two of three occurrences go on with 8; after "5 6 8" an EOS and a 9 tie and the smaller, the EOS, ends it
    assert automaton.frequent_continuation(state, 3) == [8]
