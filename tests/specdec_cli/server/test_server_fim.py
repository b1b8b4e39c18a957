"""Fill in the middle through the server: llama-server's `/infill` (what llama.vim and llama.vscode send) and
OpenAI's `suffix` on `/v1/completions`, on a tiny model whose vocabulary has Qwen2.5-Coder's FIM tokens. The
answer is what plain decoding writes after the FIM prompt (texts/fim.py), drafted or not; `n_indent` and
`t_max_predict_ms` end it where llama-server does; a model without FIM tokens refuses both in one line. And
llama-server's stream of `/completion` and `/infill` (Continue's llama.cpp provider streams `/completion`)."""

from __future__ import annotations

import http.client
import json

import pytest
from conftest import make_fim_model_dir
from test_server import _chat_settings, raw_request, serving

pytest.importorskip("openai")

INFILL = {"input_prefix": "def f(a):\n    ", "input_suffix": "\n\nprint(f(2))\n",
          "input_extra": [{"filename": "util.py", "text": "def g(b):\n    return b\n"}], "prompt": "ret",
          "n_predict": 24}


@pytest.fixture(scope="module")
def fim_session(tmp_path_factory):
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(make_fim_model_dir(tmp_path_factory.mktemp("fim")), max_new_tokens=24))
    return session


def _plain_middle(session, parts, max_new_tokens: int) -> list[int]:
    """What plain decoding writes after the FIM prompt of `parts`, ending where a middle ends."""
    from specdec_cli.decoding.engine import Engine, GenerationConfig
    from specdec_cli.drafters.none import NoDrafter
    from specdec_cli.texts.fim import fim_end_ids, fim_prompt, find_fim_tokens

    fim = find_fim_tokens(session.tokenizer)
    ends = (*session.generation.eos_token_ids, *fim_end_ids(session.tokenizer, fim))
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=ends)
    engine = Engine(session.engine.model, session.tokenizer)
    return engine.generate(fim_prompt(session.tokenizer, fim, parts), NoDrafter(), config).tokens


def test_infill_and_suffix_answer_as_plain_decoding_of_the_fim_prompt(fim_session):
    from specdec_cli.texts.fim import FimParts

    with serving(fim_session) as server:
        status, _, body = raw_request(server, "POST", "/infill", json.dumps(INFILL).encode())
        assert status == 200, body
        parts = FimParts(prefix=INFILL["input_prefix"], suffix=INFILL["input_suffix"], middle="ret",
                         extra=(("util.py", "def g(b):\n    return b\n"),))
        expected = _plain_middle(fim_session, parts, 24)
        assert body["tokens"] == expected  # drafted by the server's sam, the same tokens
        assert body["content"] == fim_session.tokenizer.decode(expected, skip_special_tokens=True)
        assert body["stop_type"] in ("eos", "limit") and body["tokens_predicted"] == len(expected)
        # OpenAI's suffix: the prompt before the gap, the suffix after it (no other files)
        asked = {"prompt": INFILL["input_prefix"], "suffix": INFILL["input_suffix"], "max_tokens": 24}
        status, _, text = raw_request(server, "POST", "/v1/completions", json.dumps(asked).encode())
        assert status == 200, text
        alone = _plain_middle(fim_session, FimParts(prefix=INFILL["input_prefix"], suffix=INFILL["input_suffix"]), 24)
        assert text["choices"][0]["text"] == fim_session.tokenizer.decode(alone, skip_special_tokens=True)
        assert text["usage"]["completion_tokens"] == len(alone)


def test_bad_infill_bodies_are_400_naming_the_field(fim_session):
    with serving(fim_session) as server:
        for body, param in (({"input_suffix": ""}, "input_prefix"), ({"input_prefix": ""}, "input_suffix"),
                            ({**INFILL, "input_extra": [{"filename": "a"}]}, "input_extra"),
                            ({**INFILL, "prompt": 3}, "prompt"), ({**INFILL, "n_indent": -1}, "n_indent"),
                            ({**INFILL, "t_max_predict_ms": "soon"}, "t_max_predict_ms"),
                            ({**INFILL, "stream": "yes"}, "stream")):
            status, _, answer = raw_request(server, "POST", "/infill", json.dumps(body).encode())
            assert status == 400 and answer["error"]["param"] == param, answer
        status, _, answer = raw_request(server, "POST", "/v1/completions",
                                        json.dumps({"prompt": [5, 6], "suffix": "x"}).encode())
        assert status == 400 and answer["error"]["param"] == "suffix"


def test_a_model_without_fim_tokens_refuses_in_one_line(tiny_model_dir):
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(tiny_model_dir))
    with serving(session) as server:
        for path, body in (("/infill", INFILL), ("/v1/completions", {"prompt": "def f(", "suffix": ")"})):
            status, _, answer = raw_request(server, "POST", path, json.dumps(body).encode())
            assert status == 400 and "fill-in-the-middle" in answer["error"]["message"], answer


def test_n_indent_and_the_time_limit_end_the_answer_as_llama_server_does(tmp_path):
    from specdec_cli.session.chat import open_session
    from specdec_cli.texts.fim import FimParts, cut_at_indent

    session, _ = open_session(_chat_settings(make_fim_model_dir(tmp_path / "newlines", newline_bias=40.0),
                                             max_new_tokens=40))
    parts = FimParts(prefix=INFILL["input_prefix"], suffix=INFILL["input_suffix"])
    plain = _plain_middle(session, parts, 40)
    plain_text = session.tokenizer.decode(plain, skip_special_tokens=True)
    assert plain_text.count("\n") >= 2  # (the model writes line breaks: the limits have lines to judge)
    asked = {"input_prefix": parts.prefix, "input_suffix": parts.suffix, "n_predict": 40}
    with serving(session) as server:
        status, _, body = raw_request(server, "POST", "/infill", json.dumps({**asked, "n_indent": 4}).encode())
        assert status == 200, body
        cut = cut_at_indent(plain_text, 4)
        assert cut is not None and body["content"] == plain_text[:cut] and body["stop_type"] == "limit"
        assert body["tokens_predicted"] < len(plain) and body["tokens"] == plain[: body["tokens_predicted"]]
        assert len(session.tokenizer.decode(body["tokens"][:-1])) < len(body["content"])  # the fewest that hold it
        status, _, undrafted = raw_request(server, "POST", "/infill", json.dumps(
            {**asked, "n_indent": 4, "speculative": {"n_max": 0}}).encode())
        assert (undrafted["content"], undrafted["tokens"]) == (body["content"], body["tokens"])
        # a time limit long past: the answer ends at the first step that has a line break
        status, _, body = raw_request(server, "POST", "/infill",
                                      json.dumps({**asked, "t_max_predict_ms": 1, "t_max_prompt_ms": 5}).encode())
        assert status == 200, body
        assert "\n" in body["content"] and plain_text.startswith(body["content"]) and body["stop_type"] == "limit"
        assert body["tokens"] == plain[: body["tokens_predicted"]]


def _llama_stream(server, path: str, body: dict) -> list[dict]:
    """The events of a llama-server-style stream (`data: {...}` lines, no [DONE])."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request("POST", path, json.dumps({**body, "stream": True}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
        lines = response.read().decode().split("\n")
    finally:
        connection.close()
    assert "data: [DONE]" not in lines
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_completion_and_infill_stream_as_llama_server_streams(fim_session):
    with serving(fim_session) as server:
        for path, body in (("/completion", {"prompt": "def f(a):", "n_predict": 16, "n_probs": 2}),
                           ("/infill", {**INFILL, "n_predict": 16})):
            status, _, whole = raw_request(server, "POST", path, json.dumps(body).encode())
            assert status == 200, whole
            events = _llama_stream(server, path, body)
            pieces, last = events[:-1], events[-1]
            assert all(event["stop"] is False for event in pieces) and last["stop"] is True
            assert "".join(event["content"] for event in pieces) == whole["content"] and last["content"] == ""
            assert last["tokens"] == whole["tokens"] and last["stop_type"] == whole["stop_type"]
            assert "timings" in last and last["tokens_predicted"] == whole["tokens_predicted"]
            if "n_probs" in body:  # each piece carries its tokens' probabilities: together, the whole answer's
                streamed = [entry for event in pieces for entry in event["completion_probabilities"]]
                wanted = whole["completion_probabilities"]  # (a dense float32 model: the two requests' prompts
                assert [entry["id"] for entry in streamed] == [entry["id"] for entry in wanted]  # were computed
                assert [entry["logprob"] for entry in streamed] == pytest.approx(  # in other blocks: close, not
                    [entry["logprob"] for entry in wanted], rel=1e-4)  # the same bits)
        status, _, refused = raw_request(server, "POST", "/infill", json.dumps(
            {**INFILL, "stream": True, "n_indent": 4}).encode())
        assert status == 400 and refused["error"]["param"] == "n_indent"
