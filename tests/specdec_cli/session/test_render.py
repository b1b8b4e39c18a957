"""The live view is a pure function of step events: scripted events in, styled spans and numbers out."""

from __future__ import annotations

from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.session.transcript import TranscriptView


def decode(ids):
    return "".join(chr(i) for i in ids)


def ev(kind, draft, accepted, committed, seconds=0.5, source="pld"):
    return StepEvent(kind=kind, draft=Draft([ord(c) for c in draft], source), accepted_path=list(range(accepted)),
                     committed=[ord(c) for c in committed], verify_seconds=seconds)


def test_spans_accepted_target_rejected():
    view = TranscriptView(decode, "pld")
    view.add(ev("prefill", "", 0, "H", source="prefill"))
    assert [(s.text, s.kind) for s in view.spans()] == [("H", "target")]
    view.add(ev("step", "ello", 2, "elp"))  # 'e','l' accepted, 'l','o' rejected, target says 'p'
    assert [(s.text, s.kind) for s in view.committed] == [("H", "target"), ("e", "accepted"), ("l", "accepted"),
                                                          ("p", "target")]
    assert [(s.text, s.kind) for s in view.rejected] == [("l", "rejected"), ("o", "rejected")]
    view.add(ev("step", "!!", 2, "!!?"))  # fully accepted + bonus: the old rejected drafts are cleared
    assert view.rejected == []
    assert "".join(s.text for s in view.spans()) == "Help!!?"
    status = view.status()
    stats = status.stats
    assert stats.steps == 2 and stats.new_tokens == 7
    assert stats.drafted_tokens == 6 and stats.accepted_tokens == 4
    assert stats.acceptance_rate == 4 / 6
    assert stats.mean_accepted_tokens == (3 + 3) / 2
    assert stats.tokens_per_second == 7 / 1.5
    assert "pld" in status.line() and "tokens/step" in status.line()


def test_hidden_rejected_and_hybrid_source():
    view = TranscriptView(decode, "sam", show_rejected=False)
    view.add(ev("prefill", "", 0, "a", source="prefill"))
    view.add(ev("step", "xyz", 0, "b", source="sam-static"))
    assert view.rejected == [] and view.status().source == "sam-static"
    assert "(sam-static)" in view.status().line()


def test_plain_decoding_has_no_accepted_spans():
    view = TranscriptView(decode, "none")
    view.add(ev("prefill", "", 0, "a", source="prefill"))
    for char in "bcd":
        view.add(ev("step", "", 0, char, source="none"))
    assert {s.kind for s in view.spans()} == {"target"}
    assert view.status().stats.mean_accepted_tokens == 1.0
