"""SamDrafter with scripted engine events (no model): source choice, multi-turn prompts, draft lengths,
separators, the auxiliary-drafter hook, and make_sam_drafter's checks of an index against the target."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.decoding.draft import NOTHING, Draft, Drafter, StepEvent
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.drafters.sam import ALPHA, SamDrafter, make_sam_drafter
from specdec_cli.errors import SpecdecError
from specdec_cli.sam.automaton import build_static
from specdec_cli.sam.index import save_index

EOS = 0


def prefill(prompt, first_token) -> StepEvent:
    return StepEvent(kind="prefill", draft=Draft.empty("none"), committed=[first_token], prompt_tokens=list(prompt))


def step(*committed) -> StepEvent:
    return StepEvent(kind="step", draft=Draft.empty("none"), accepted_path=list(range(len(committed) - 1)),
                     committed=list(committed))


def static_of(tokens):
    return build_static(np.array(tokens, dtype=np.int32), vocab_size=100, separators=(EOS,))


def test_is_a_drafter_and_drafts_nothing_without_a_match():
    drafter = SamDrafter(separators=(EOS,))
    assert isinstance(drafter, Drafter) and drafter.name == "sam"
    drafter.observe(prefill([1, 2, 3], 4))
    draft = drafter.propose([1, 2, 3, 4], 8)
    assert draft.tokens == [] and draft.is_chain


def test_dynamic_draft_continues_the_earliest_occurrence():
    drafter = SamDrafter(separators=(EOS,))
    drafter.observe(prefill([5, 6, 7, 8, 9, 5, 6], 7))
    assert drafter.dynamic_len == 3  # "5 6 7" occurred before
    draft = drafter.propose([5, 6, 7, 8, 9, 5, 6, 7], 10)
    assert draft.source == "sam-dynamic" and draft.match_len == 3
    assert draft.tokens == [8, 9, 5, 6, 7]  # all there is: not padded to 10


def test_draft_length_adapts_to_the_match_length():
    text = list(range(1, 40))
    drafter = SamDrafter(separators=(EOS,), draft_max=64)
    drafter.observe(prefill(text + [1], 2))  # match length 2 ("1 2")
    assert drafter.propose(text + [1, 2], 64).tokens == list(range(3, 3 + 1 + ALPHA * 2))
    drafter.observe(step(3))  # match length 3
    assert len(drafter.propose(text + [1, 2, 3], 64).tokens) == 1 + ALPHA * 3
    assert len(drafter.propose(text + [1, 2, 3], 4).tokens) == 4  # the budget bounds it
    unbounded = SamDrafter(separators=(EOS,))  # no draft_max of its own: the engine's budget bounds it
    unbounded.observe(prefill(text + [1], 2))
    assert unbounded.draft_max is None and unbounded.propose(text + [1, 2], 64).tokens == list(range(3, 12))


def test_source_choice_with_l_bias():
    corpus = [10, 11, 12, 13, 14, 15, 16, 17, EOS]
    prompt = [30, 31, 10, 11, 12, 13]
    for l_bias in range(7):
        drafter = SamDrafter(static_of(corpus), separators=(EOS,), l_bias=l_bias)
        drafter.observe(prefill(prompt, 14))
        assert (drafter.dynamic_len, drafter.static_len) == (0, 5)
        draft = drafter.propose(prompt + [14], 8)
        if 5 - l_bias > 0:
            assert draft == Draft(tokens=[15, 16, 17], source="sam-static", match_len=5)  # stops before EOS
        else:  # the dynamic automaton is chosen, and it has no match: no draft
            assert draft == Draft.empty("sam-dynamic")


def test_ties_go_to_the_dynamic_automaton():
    corpus = [1, 2, 3, 50, 51, EOS]
    drafter = SamDrafter(static_of(corpus), separators=(EOS,), l_bias=0)
    drafter.observe(prefill([1, 2, 3, 60, 61, 1, 2], 3))  # dynamic "1 2 3" = 3, static "1 2 3" = 3
    assert drafter.dynamic_len == drafter.static_len == 3
    draft = drafter.propose([1, 2, 3, 60, 61, 1, 2, 3], 8)
    assert draft.source == "sam-dynamic" and draft.tokens[:2] == [60, 61]
    drafter.l_bias = -1  # static 3 - (-1) > 3: the static automaton wins
    assert drafter.propose([1, 2, 3, 60, 61, 1, 2, 3], 8).tokens == [50, 51]


def test_stops_at_eos_in_the_conversation_too():
    drafter = SamDrafter(separators=(EOS,))
    drafter.observe(prefill([7, 8, EOS, 9, 7], 8))
    assert drafter.propose([7, 8, EOS, 9, 7, 8], 8).tokens == []  # "7 8" was followed by EOS only


def test_multi_turn_prompt_feeds_only_new_tokens():
    drafter = SamDrafter(separators=(EOS,))
    turn_one = [1, 2, 3, 4]
    drafter.observe(prefill(turn_one, 5))
    drafter.observe(step(6, 7))
    conversation = turn_one + [5, 6, 7]
    assert drafter.dynamic.text == conversation
    automaton = drafter.dynamic
    turn_two = conversation + [EOS, 20, 1, 2]
    drafter.observe(prefill(turn_two, 3))
    assert drafter.dynamic is automaton  # extended, not rebuilt
    assert drafter.dynamic.text == turn_two + [3]
    assert drafter.propose(turn_two + [3], 8).tokens == [4, 5, 6, 7]
    # A prompt that does not extend the conversation starts over.
    drafter.observe(prefill([9, 9, 8], 7))
    assert drafter.dynamic is not automaton and drafter.dynamic.text == [9, 9, 8, 7]
    assert drafter.dynamic_len == 0


def test_multi_turn_keeps_the_static_match_in_step():
    corpus = [1, 2, 3, 4, 5, 6, EOS]
    drafter = SamDrafter(static_of(corpus), separators=(EOS,), l_bias=0)
    drafter.observe(prefill([40, 1], 2))
    assert drafter.static_len == 2
    drafter.observe(prefill([40, 1, 2, 3], 4))  # the same conversation, re-sent with one more token
    assert drafter.static_len == 4 and drafter.dynamic.text == [40, 1, 2, 3, 4]
    drafter.observe(prefill([2, 3], 4))  # a new conversation: the static match restarts too
    assert drafter.static_len == 3


def test_propose_without_events_follows_the_context():
    drafter = SamDrafter(separators=(EOS,))
    assert drafter.propose([1, 2, 3, 1, 2], 4).tokens == [3, 1, 2]
    assert drafter.propose([4, 4], 4).tokens == [4]  # diverged: started over


class RecordingDrafter:
    name = "aux"
    needs = NOTHING

    def __init__(self):
        self.events, self.calls = [], 0

    def propose(self, context, budget):
        self.calls += 1
        return Draft(tokens=[99], source="aux")

    def observe(self, event):
        self.events.append(event.kind)

    def reset(self):
        self.events.append("reset")


def test_a_hybrid_merges_both_drafts_and_the_threshold_gates_the_automata():
    """With an auxiliary both draft every step and their drafts become one tree (merge.py); below l_threshold the
    automata's match is left out and the auxiliary's draft is the whole tree."""
    aux = RecordingDrafter()
    drafter = SamDrafter(separators=(EOS,), l_threshold=3, aux=aux)
    drafter.observe(prefill([1, 2, 3, 9, 1], 2))  # dynamic match "1 2" = 2 < 3
    alone = drafter.propose([1, 2, 3, 9, 1, 2], 8)
    assert alone.source == "aux" and alone.tokens == [99] and alone.confidence is not None
    drafter.observe(step(3))  # "1 2 3" = 3: not below the threshold
    merged = drafter.propose([1, 2, 3, 9, 1, 2, 3], 8)
    assert merged.source == "sam-dynamic+aux" and set(merged.tokens) == {9, 1, 2, 3, 99}
    assert merged.parents is not None and merged.parents.count(-1) == 2  # two branches off the root
    assert aux.events == ["prefill", "step"] and aux.calls == 2


def test_default_sam_is_the_automata_alone_and_a_hybrid_merges_with_its_auxiliary():
    """By default `sam` is the automata alone (`sam+none`); `sam+aded` (or `--aux aded`) merges the automata's
    chain with ADED's draft, and ADED's alone is the draft where nothing matches."""
    from specdec_cli.drafters.aded import AdedDrafter

    target = TargetInfo(vocab_size=100, eos_token_ids=(EOS,))
    plain = make_drafter("sam", DrafterOptions(), target)
    assert plain.aux is None and plain.l_threshold == 1 and plain.l_bias == 3
    assert make_drafter("sam+none", DrafterOptions(), target).aux is None
    hybrid = make_drafter("sam", DrafterOptions(aux="aded"), target)
    assert isinstance(hybrid.aux, AdedDrafter) and isinstance(make_drafter("sam+aded", DrafterOptions(), target).aux,
                                                              AdedDrafter)
    assert make_drafter("sam+recycle", DrafterOptions(aux="none"), target).aux.name == "recycle"  # name wins
    for bad in ("sam", "sam+pld", "bogus"):  # no nested hybrids
        with pytest.raises(SpecdecError, match="auxiliary drafter must be one of"):
            make_drafter("sam", DrafterOptions(aux=bad), target)
    hybrid.observe(prefill([5, 6, 7, 5, 6, 7, 8], 5))  # 5 was seen before: sam drafts its continuation
    assert hybrid.propose([5, 6, 7, 5, 6, 7, 8, 5], 8).source.startswith("sam-dynamic")
    hybrid.observe(step(9))  # 9 is new: no match anywhere, ADED's draft alone (when it has one)
    assert hybrid.propose([5, 6, 7, 5, 6, 7, 8, 5, 9], 8).source in ("aded", "sam-dynamic")


def write_index(path, fingerprint="sha256:aaaa", eos_id=EOS, vocab_size=100):
    automaton = static_of([1, 2, 3, 4, EOS])
    save_index(path, automaton, {"tokenizer_fingerprint": fingerprint, "vocab_size": vocab_size, "eos_id": eos_id})
    return str(path)


def test_make_sam_drafter_loads_a_matching_index(tmp_path):
    index = write_index(tmp_path / "ok.sam")
    target = TargetInfo(vocab_size=100, eos_token_ids=(EOS,), fingerprint="sha256:aaaa")
    drafter = make_drafter("sam", DrafterOptions(index=index, l_bias=1), target, 6)
    assert isinstance(drafter, SamDrafter) and drafter.draft_max == 6 and drafter.static is not None
    drafter.observe(prefill([8, 1, 2], 3))
    assert drafter.propose([8, 1, 2, 3], 8) == Draft(tokens=[4], source="sam-static", match_len=3)
    assert make_sam_drafter(DrafterOptions(), target).static is None  # no index: dynamic only


def test_make_sam_drafter_refuses_another_tokenizer(tmp_path):
    index = write_index(tmp_path / "other.sam", fingerprint="sha256:bbbb")
    target = TargetInfo(vocab_size=100, eos_token_ids=(EOS,), fingerprint="sha256:aaaa")
    with pytest.raises(SpecdecError) as caught:
        make_sam_drafter(DrafterOptions(index=index), target)
    assert "sha256:bbbb" in str(caught.value) and "sha256:aaaa" in str(caught.value)


def test_make_sam_drafter_refuses_other_eos_or_larger_vocabulary(tmp_path):
    target = TargetInfo(vocab_size=100, eos_token_ids=(EOS,), fingerprint="sha256:aaaa")
    with pytest.raises(SpecdecError, match="EOS"):
        make_sam_drafter(DrafterOptions(index=write_index(tmp_path / "eos.sam", eos_id=4)), target)
    with pytest.raises(SpecdecError, match="vocabulary"):
        make_sam_drafter(DrafterOptions(index=write_index(tmp_path / "vocab.sam", vocab_size=500)), target)
    with pytest.raises(SpecdecError, match="not found"):
        make_sam_drafter(DrafterOptions(index=str(tmp_path / "absent.sam")), target)


def test_a_static_draft_can_follow_the_most_frequent_continuation():
    """Off by default (the earliest occurrence's continuation); `frequent` drafts what most occurrences go on with."""
    corpus = [10, 11, 12, 13, EOS, 10, 11, 12, 14, 15, EOS, 10, 11, 12, 14, 15, EOS]
    prompt = [30, 31, 10, 11]  # then 12: "10 11 12" matches the corpus three times, the conversation not at all
    for frequent, expected in ((False, [13]), (True, [14, 15])):
        drafter = SamDrafter(static_of(corpus), separators=(EOS,), l_bias=0, frequent=frequent)
        drafter.observe(prefill(prompt, 12))
        draft = drafter.propose(prompt + [12], 8)
        assert draft.source == "sam-static" and draft.tokens == expected
