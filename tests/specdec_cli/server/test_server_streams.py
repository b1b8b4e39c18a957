"""A stream's text is its answer's: every delta of a streamed request, concatenated, equals the text the same request
gets whole, with stop strings inside one token, across two, at the start and at the end of the answer, for every
drafter, on the default model's byte-level tokenizer (whose tokens span many characters). And the rule that decides
what a stream may show, `stop_cut`, against brute force over every way the answer could go on.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from test_server import client_of, raw_request, serving

pytest.importorskip("openai")


def _answers_cut(text: str, stops: tuple[str, ...]) -> str:
    found = [text.find(stop) for stop in stops if stop in text]
    return text[: min(found)] if found else text


@pytest.mark.parametrize("seed", range(6))
def test_stop_cut_shows_exactly_what_no_continuation_can_take_back(seed):
    """For random texts and stop strings over a two-letter alphabet: what `stop_cut` shows is a prefix of the final
    answer however the text goes on (or ends there), and nothing longer is. A text that holds a stop string is the
    last the engine commits (it ends the answer at that step)."""
    from specdec_cli.texts.text_stream import stop_cut

    rng = random.Random(seed)
    for _ in range(300):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 7)))
        stops = tuple({"".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
        longest = max(len(stop) for stop in stops)
        if any(stop in text for stop in stops):  # the engine ended the answer at the step that showed this text
            finals = [_answers_cut(text, stops)]
        else:  # any continuation, committed in one step or several, ends the answer where it first shows a stop
            finals = [_answers_cut(text + "".join(more), stops)
                      for size in range(longest + 1) for more in itertools.product("ab", repeat=size)]
        common = finals[0]
        for final in finals[1:]:
            while not final.startswith(common):
                common = common[:-1]
        assert text[: stop_cut(text, stops)] == common, (text, stops)


def _stops_to_try(answer: str, token_ends: list[int]) -> dict[str, tuple[str, ...]]:
    """Stop strings placed in the answer: inside one token, across two, at its start, at its end, never there."""
    chosen: dict[str, tuple[str, ...]] = {"start": (answer[:2],), "end": (answer[-2:],), "absent": ("§§",)}
    starts = [0] + token_ends[:-1]
    for start, end in zip(starts, token_ends):
        if "inside" not in chosen and end - start >= 4:
            piece = answer[start + 1: start + 3]
            if answer.find(piece) == start + 1:
                chosen["inside"] = (piece,)
        if "across" not in chosen and start >= 2 and end - start >= 2:
            piece = answer[start - 1: start + 1]
            if answer.find(piece) == start - 1 and start - 1 > 0:
                chosen["across"] = (piece,)
    chosen["two stops"] = (answer[len(answer) // 2: len(answer) // 2 + 3], chosen.get("across", ("zz",))[0])
    chosen["newline"] = ("\n",)
    return chosen


def _drafter_names(loaded) -> list[str]:
    from specdec_cli.drafters import DRAFTERS, DrafterOptions, make_drafter, target_info
    from specdec_cli.errors import SpecdecError

    info = target_info(loaded.model, loaded.tokenizer)
    names = []
    for name in DRAFTERS:
        try:
            make_drafter(name, DrafterOptions(), info)
        except SpecdecError:  # needs a draft model (eagle, model): not what a stream's text depends on
            continue
        names.append(name)
    return names + ["sam+aded", "sam+recycle"]


def test_a_streamed_answer_with_stop_strings_is_the_answer_for_every_drafter(real_target):
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession, ChatSettings
    from specdec_cli.session.run_settings import DrafterSettings, RunSettings
    from specdec_cli.texts.prompt_ids import format_prompt

    loaded = real_target("float32", "auto")
    question = "List three colors of the rainbow, one per line, then say which one you like best and why."
    prompt = format_prompt(loaded.tokenizer, [{"role": "user", "content": question}])  # token ids: a chat turn
    names = _drafter_names(loaded)
    assert {"none", "sam", "pld", "aded", "recycle"} <= set(names)
    checked = 0
    for name in names:
        settings = ChatSettings(RunSettings(drafter=DrafterSettings(name), generation=GenerationConfig(
            max_new_tokens=48)))
        with serving(ChatSession(loaded.model, loaded.tokenizer, settings), name="smollm2") as server:
            client = client_of(server)
            status, _, plain = raw_request(server, "POST", "/completion", json.dumps(
                {"prompt": prompt, "n_predict": 48}).encode())
            assert status == 200, plain
            answer, tokens = plain["content"], plain["tokens"]
            token_ends = [len(loaded.tokenizer.decode(tokens[: index + 1], skip_special_tokens=True))
                          for index in range(len(tokens))]
            stops = _stops_to_try(answer, token_ends)
            assert {"inside", "across"} <= set(stops), (answer, stops)
            for where, stop in stops.items():
                expected = _answers_cut(answer, stop)
                whole = client.completions.create(model="m", prompt=prompt, max_tokens=48, stop=list(stop))
                streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
                    model="m", prompt=prompt, max_tokens=48, stop=list(stop), stream=True) if chunk.choices)
                assert whole.choices[0].text == expected, (name, where, stop)
                assert streamed == expected, (name, where, stop, streamed, expected)
                checked += 1
            chat = [{"role": "user", "content": "List three colors."}]
            for stop in (["\n"], ["e"], ["Blue"], ["."]):
                whole_chat = client.chat.completions.create(model="m", messages=chat, max_tokens=48, stop=stop)
                chunks = client.chat.completions.create(model="m", messages=chat, max_tokens=48, stop=stop, stream=True)
                streamed_chat = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
                assert streamed_chat == whole_chat.choices[0].message.content, (name, stop)
                assert not any(one in streamed_chat for one in stop)
    assert checked >= 7 * len(names)
