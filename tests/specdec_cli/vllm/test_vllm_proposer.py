"""specdec's vLLM proposers without vLLM: rows shaped like vLLM's runner hands them over (vllm_proposer.py)."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.drafters import DrafterOptions, TargetInfo
from specdec_cli.errors import SpecdecError
from specdec_cli.session.run_settings import DrafterSettings
from specdec_cli.vllm.proposer import IDLE_STEPS, PldProposer, RequestTracker, SamProposer
from specdec_cli.vllm.proposer_settings import ProposerSettings, proposer_path

TARGET = TargetInfo(vocab_size=1000, eos_token_ids=(0,))


def batch(sequences: list[list[int]], width: int = 256) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """vLLM's arguments for these rows: sampled ids (the newest token), lengths, and the token table."""
    table = np.zeros((len(sequences), width), dtype=np.int32)  # [rows, max_model_len]
    for row, tokens in enumerate(sequences):
        table[row, : len(tokens)] = tokens
    lengths = np.array([len(tokens) for tokens in sequences], dtype=np.int32)
    return [[tokens[-1]] for tokens in sequences], lengths, table


def proposer(kind=SamProposer, drafter: str = "sam", draft_max: int = 4) -> SamProposer:
    return kind(None, settings=ProposerSettings(DrafterSettings(drafter)), target=TARGET,
                num_speculative_tokens=draft_max)


def test_sam_drafts_the_continuation_of_a_repeat_and_respects_the_budget():
    prop = proposer(draft_max=4)
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    assert prop.propose(*batch([text])) == [[8, 9, 10, 11]]
    pld = proposer(PldProposer, "pld", draft_max=3)
    assert pld.propose(*batch([text])) == [[8, 9, 10]]


def test_rows_without_a_sampled_token_and_rows_at_the_context_end_get_no_draft():
    prop = proposer()
    sampled, lengths, table = batch([[5, 6, 5], [5, 6, 5]])
    sampled[0] = []  # vLLM: this request did not sample this step (a chunked prefill)
    prop.max_model_len = 4  # the second row is one token from the end of the context
    assert prop.propose(sampled, lengths, table) == [[], []]


def test_a_request_keeps_its_drafter_when_it_moves_between_rows():
    prop = proposer()
    first, second = [1, 2, 3, 4, 1, 2], [7, 8, 9, 7, 8]
    prop.propose(*batch([first, second]))
    created = [id(seq.drafter) for seq in prop.tracker.sequences.values()]
    prop.propose(*batch([second + [9], first + [3]]))  # each grew by a token, and they swapped rows
    assert prop.tracker.stats.created == 2 and prop.tracker.stats.reused == 2
    assert [id(seq.drafter) for seq in prop.tracker.sequences.values()] == created[::-1]  # most recent last


def test_two_requests_with_one_prompt_get_a_drafter_each():
    prop = proposer()
    prompt = [3, 4, 5, 3, 4]
    prop.propose(*batch([prompt, prompt]))
    assert prop.tracker.stats.created == 2
    prop.propose(*batch([prompt + [5], prompt + [9]]))  # they diverge: each still finds its own
    assert prop.tracker.stats.created == 2 and len(prop.tracker) == 2


def test_finished_requests_are_dropped_and_hundreds_stay_bounded():
    prop = proposer()
    rng = np.random.default_rng(0)
    for _group in range(10):  # 500 requests, 50 in flight at a time, each for 3 steps
        group = [list(rng.integers(1, 1000, size=20)) for _ in range(50)]
        for step in range(3):
            prop.propose(*batch([tokens + [7] * step for tokens in group]))
        assert len(prop.tracker) <= 50 + 50  # the previous group waits out IDLE_STEPS at most
        for _ in range(IDLE_STEPS + 1):  # steps in which these requests no longer appear: they finished
            prop.propose(*batch([[1, 2, 3]]))
        assert len(prop.tracker) <= 2
    assert prop.tracker.stats.created == 500 + 1  # one per request, and one for the filler row (never growing)
    capped = RequestTracker(lambda: proposer().tracker.new_drafter(), max_growth=5, max_sequences=8)
    taken = capped.begin_step()
    for number in range(100):
        capped.find(number, np.array([number, number + 1]), taken)
    assert len(capped) == 8  # the least recently used went first


def test_settings_come_from_the_environment_and_are_checked(monkeypatch):
    monkeypatch.setenv("SPECDEC_VLLM_DRAFTER", '{"drafter": "sam+pld"}')
    assert ProposerSettings.from_environment("sam").drafter.name == "sam+pld"
    monkeypatch.setenv("SPECDEC_VLLM_DRAFTER", "{not json")
    with pytest.raises(SpecdecError, match="not valid JSON"):
        ProposerSettings.from_environment("sam")
    monkeypatch.setenv("SPECDEC_VLLM_DRAFTER", '{"drafter": "sam", "temperature": 1}')
    with pytest.raises(SpecdecError, match="JSON object"):
        ProposerSettings.from_environment("sam")
    with pytest.raises(SpecdecError, match="verifies chains"):
        ProposerSettings(DrafterSettings("aded")).check()
    with pytest.raises(SpecdecError, match="sam drafter"):
        ProposerSettings(DrafterSettings("pld", DrafterOptions(index="x.sam"))).check()
    assert proposer_path("pld") == "specdec_cli.vllm.proposer.PldProposer"


def test_short_matches_are_not_drafted_in_vllm():
    """vLLM verifies every drafted token: a one-token match's continuation is not worth a verified row there."""
    text = [5, 6, 7, 8, 9, 5]  # the newest token matches once, one token long
    assert proposer().propose(*batch([text])) == [[]]
    loose = SamProposer(None, settings=ProposerSettings(DrafterSettings("sam"), min_match=1), target=TARGET,
                        num_speculative_tokens=4)
    assert loose.propose(*batch([text]))[0][:1] == [6]
