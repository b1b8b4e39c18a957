"""The one prompt loader: files (JSONL or text), suites (builtin, distill), first turns, and how many are kept.

(The JSONL row formats and their errors are tested in test_bench.py.)
"""

from __future__ import annotations

import json

import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.texts.prompts import MT_BENCH, load_prompt_file, load_prompts, load_suite

ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write a story."]},
    {"prompt": "hi", "category": "copy"},
    {"prompt": "hi", "category": "copy"},  # the same prompt again
    {"prompt": "bye", "category": "math"},
]


@pytest.fixture()
def spec_bench(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def test_a_text_file_holds_one_prompt_a_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  two lines:\\nsecond  \n", encoding="utf-8")
    first, second = load_prompt_file(path)
    assert (first.id, first.category, first.turns) == ("1", "prompts", ("first prompt",))
    assert (second.id, second.turns) == ("3", ("two lines:\nsecond",))
    path.write_text("\n \n", encoding="utf-8")
    with pytest.raises(SpecdecError, match="no prompts"):
        load_prompt_file(path)


def test_jsonl_rows_in_a_file_of_another_name_are_rows(tmp_path):
    path = tmp_path / "question.txt"
    path.write_text(json.dumps(ROWS[0]) + "\n", encoding="utf-8")
    [conversation] = load_prompt_file(path)
    assert conversation.category == MT_BENCH and conversation.source_category == "writing"
    assert conversation.turns == ("Write a poem.", "Shorter.")


def test_limit_is_per_category_and_max_prompts_in_all(spec_bench):
    every = load_prompts(str(spec_bench))
    assert [c.id for c in every] == ["81", "82", "3", "4", "5"] and len(every[0].turns) == 2
    assert [c.id for c in load_prompts(str(spec_bench), limit=1)] == ["81", "3", "5"]
    assert [c.id for c in load_prompts(str(spec_bench), limit=1, max_prompts=2)] == ["81", "3"]
    assert [c.id for c in load_prompts(str(spec_bench), categories=["copy"])] == ["3", "4"]


def test_first_turns_alone_and_a_prompt_asked_again_dropped(spec_bench):
    chosen = load_prompts(str(spec_bench), first_turns=True)
    assert [(c.id, c.turns) for c in chosen] == [("81", ("Write a poem.",)), ("82", ("Write a story.",)),
                                                 ("3", ("hi",)), ("5", ("bye",))]


def test_the_distill_suite_is_a_fixed_shuffled_mix():
    suite = load_suite("distill")
    assert len(suite) == len({c.first_turn for c in suite}) > 200
    assert len({c.category for c in suite[:20]}) >= 4  # any prefix is a mix
    assert suite == load_suite("distill")  # deterministic
    assert all(c.id.startswith(c.category + "-") for c in suite)


def test_the_library_suite_asks_about_the_standard_library_in_four_ways():
    """Every kind of prompt, unique, deterministic, each id naming the function it asks about; none is a
    benchmark's prompt; suites joined with a comma come in order."""
    suite = load_suite("library")
    assert len(suite) == len({c.first_turn for c in suite}) == len({c.id for c in suite}) > 500
    assert {c.category for c in suite} == {"code", "explain", "summarize", "qa"}
    assert len({c.category for c in suite[:12]}) >= 3  # any prefix is a mix
    assert suite == load_suite("library")
    assert not [c.id for c in suite if " at 0x" in c.first_turn]  # an address would change from run to run
    for conversation in suite:
        kind, qualified = conversation.id.split("-", 2)[1:]
        assert kind == conversation.category
        if kind in ("code", "qa", "summarize"):
            assert qualified in conversation.first_turn
    builtin = {c.first_turn for c in load_suite("builtin")}
    assert not builtin & {c.first_turn for c in suite}
    joined = load_suite("distill, library")
    assert joined == load_suite("distill") + suite
    with pytest.raises(SpecdecError, match="unknown suite 'nope'"):
        load_suite("distill,nope")


@pytest.mark.parametrize("file, suite, limit, max_prompts, needle", [
    ("x.jsonl", "builtin", None, None, "not both"),
    (None, None, None, None, "give the prompts"),
    (None, "nope", None, None, "unknown suite 'nope'; choose one of: builtin, humaneval, distill, library"),
    (None, "builtin", 0, None, "limit must be >= 1"),
    (None, "builtin", None, 0, "max_prompts must be >= 1"),
])
def test_loader_errors(file, suite, limit, max_prompts, needle):
    with pytest.raises(SpecdecError, match=needle):
        load_prompts(file, suite, limit=limit, max_prompts=max_prompts)
