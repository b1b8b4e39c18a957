"""benchmarks/replay_drafters.py: replaying recorded answers through the engine's planner, without a model, on
hand-made documents: the accepted path, a repeating answer drafted by prompt lookup, `--forget` as answering each
recorded row alone, and `--cost` charging another curve."""

from __future__ import annotations

import argparse
import json

import pytest
from helpers import benchmark_script

from specdec_cli.decoding.draft import Draft

VOCAB = 64
PHRASE = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def _row(category: str, prompt: list[int], answer: list[int]) -> dict:
    return {"category": category, "prompt": prompt, "answer": answer, "topk": [[token] * 8 for token in answer]}


def _document(rows: list[dict], cost: dict | None = None) -> dict:
    return {"version": 1, "target": "hand-made", "vocab_size": VOCAB, "eos_token_ids": [1], "fingerprint": "hand",
            "cost": cost or {"1": 0.010, "2": 0.011, "4": 0.012, "8": 0.014, "16": 0.020}, "rows": rows}


def _repeating(category: str, offset: int) -> dict:
    """A prompt that holds a phrase and an answer that says it twice: prompt lookup's case."""
    phrase = [token + offset for token in PHRASE]
    return _row(category, [2, 3, *phrase, 4], [*phrase, 15, *phrase])


def test_the_accepted_path_is_the_longest_prefix_of_the_draft_the_answer_follows():
    replay = benchmark_script("replay_drafters")
    assert replay.accepted_path(Draft([7, 8, 9], "pld"), [7, 8, 4, 5]) == [0, 1]
    assert replay.accepted_path(Draft([3, 8], "pld"), [7, 8]) == []
    tree = Draft([7, 3, 8], "aded", parents=[-1, -1, 0])  # 7 -> 8 and 3 both from the root
    assert replay.accepted_path(tree, [7, 8, 9]) == [0, 2]


def test_an_answer_that_repeats_its_prompt_is_drafted_and_costs_fewer_passes():
    replay = benchmark_script("replay_drafters")
    document = _document([_repeating("code", 0)])
    per_category, per_source = replay.replay("pld", document, None, 8)
    tokens, seconds, passes = per_category["code"]
    assert tokens == 2 * len(PHRASE) + 1 and passes < tokens  # several tokens a verify pass
    assert seconds < tokens * 0.010  # faster than plain decoding's t(1) a token on this curve
    steps, verified, accepted = per_source["pld"]
    assert 0 < accepted <= verified


def test_forget_replays_each_answer_as_if_it_were_the_only_one():
    replay = benchmark_script("replay_drafters")
    rows = [_repeating("code", 0), _repeating("code", 20), _row("qa", [2, 3, 4], [30, 31, 32, 33, 34, 35])]
    together, _ = replay.replay("sam+aded", _document(rows), None, 8, forget=True)
    alone = [replay.replay("sam+aded", _document([row]), None, 8)[0] for row in rows]
    for category in ("code", "qa"):
        expected = [sum(result[category][field] for result in alone if category in result) for field in range(3)]
        assert together[category][0] == expected[0] and together[category][2] == expected[2]
        assert together[category][1] == pytest.approx(expected[1], abs=0.05)  # (drafting time is measured)
    learned, _ = replay.replay("sam+aded", _document(rows), None, 8)  # the planner and tables carried over
    assert learned["code"][2] <= together["code"][2]


def test_cost_charges_the_curve_given_instead_of_the_recorded_one(tmp_path, capsys):
    replay = benchmark_script("replay_drafters")
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(_document([_repeating("code", 0)])))
    args = argparse.Namespace(answers=str(path), drafters="pld", index=None, draft_max=8, remember=False,
                              forget=False, cost=None)
    replay.replay_all(args)
    flat = capsys.readouterr().out
    replay.replay_all(argparse.Namespace(**{**vars(args), "cost": "1:0.010,2:0.030,4:0.060,8:0.120,16:0.240"}))
    steep = capsys.readouterr().out
    speedup = {name: float(out.splitlines()[1].split()[1].rstrip("x")) for name, out in (("flat", flat),
                                                                                          ("steep", steep))}
    assert speedup["flat"] > 1.2 and speedup["steep"] < speedup["flat"]
