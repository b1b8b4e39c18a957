"""Tools through `specdec serve`, as the `openai` client uses them: `tools` with `tool_choice` auto, none, required
and a named function; the calls come back in OpenAI's shape, whole and streamed (the same calls), validate
against the functions' parameters, and are the same with drafts and without; a tool conversation's second turn
(the call and its `tool` result in the history) is answered; bad tool fields are 400s naming them. The tiny model
(a template without tools: specdec's generic prompt) and the default model (a two-step conversation)."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
from test_server import _chat_settings, _sam_settings, client_of, raw_request, serving

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tiny_session(tiny_model_dir):
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(tiny_model_dir, max_new_tokens=120))
    return session


def _calls(message) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or ()]


def _streamed(client, **request) -> tuple[str, list[tuple[str, dict]], str]:
    """A streamed request's content, its calls (assembled by index, as clients do) and finish reason."""
    content, calls, finish = [], {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for call in delta.tool_calls or ():
            held = calls.setdefault(call.index, {"name": "", "arguments": ""})
            assert call.id and call.type == "function"
            held["name"] += call.function.name or ""
            held["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content), [(call["name"], json.loads(call["arguments"])) for _, call in sorted(calls.items())], \
        finish


def test_a_compulsory_call_comes_back_whole_and_streamed_the_same_with_or_without_drafts(tiny_session):
    functions = {"get_weather": WEATHER, "now": TIME}
    with serving(tiny_session) as server:
        client = client_of(server)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            request = {"model": "m", "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice,
                       "max_tokens": 120}
            whole = client.chat.completions.create(**request)
            plain = client.chat.completions.create(**request, extra_body={"speculative": {"n_max": 0}})
            message = whole.choices[0].message
            assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
            calls = _calls(message)
            assert calls and calls == _calls(plain.choices[0].message)
            assert _streamed(client, **request) == ("", calls, "tool_calls")
            assert len({call.id for call in message.tool_calls}) == len(calls)
            if choice != "required":
                assert [name for name, _ in calls] == ["get_weather"]  # the named function, once
            for name, arguments in calls:
                jsonschema.validate(arguments, functions[name]["function"]["parameters"])


def test_auto_and_none_answer_as_the_model_writes(tiny_session):
    """auto: whatever the model writes (text here: the tiny model's), streamed the same; none: the tools are not
    offered, so the answer is the one to the conversation without them."""
    with serving(tiny_session) as server:
        client = client_of(server)
        request = {"model": "m", "messages": ASK, "tools": [WEATHER], "max_tokens": 30}
        auto = client.chat.completions.create(**request, tool_choice="auto")
        content, calls, finish = _streamed(client, **request, tool_choice="auto")
        assert (auto.choices[0].message.content or "", _calls(auto.choices[0].message),
                auto.choices[0].finish_reason) == (content, calls, finish)
        none = client.chat.completions.create(**request, tool_choice="none")
        bare = client.chat.completions.create(model="m", messages=ASK, max_tokens=30)
        assert none.choices[0].message.content == bare.choices[0].message.content
        assert none.choices[0].message.tool_calls is None


def test_a_second_turn_reads_the_call_and_its_result(tiny_session):
    """The history holds the assistant's call and the tool's result: the prompt is the generic format's, and the
    answer is what the session's chat path gives that prompt."""
    from specdec_cli.texts.prompt_ids import format_prompt
    from specdec_cli.texts.tool_calls import template_inputs

    call = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    with serving(tiny_session) as server:
        answer = client_of(server).chat.completions.create(model="m", messages=history, tools=[TIME], max_tokens=20)
    checked = [dict(ASK[0]), {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}]
    messages, _ = template_inputs("generic", checked, [TIME])
    assert "<tool_response>\n12:00\n</tool_response>" in messages[-1]["content"]
    prompt = format_prompt(tiny_session.tokenizer, messages)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("fields, param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [TIME, TIME]}, "tools"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [TIME], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": 3}}]},
                   {"role": "user", "content": "x"}]}, "messages[0].tool_calls[0]"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, "messages[0].tool_call_id"),
])
def test_bad_tool_fields_are_400s_naming_them(tiny_session, fields, param):
    with serving(tiny_session) as server:
        status, _, body = raw_request(server, "POST", "/v1/chat/completions", json.dumps(
            {"messages": ASK, "max_tokens": 4, **fields}).encode())
    assert status == 400 and body["error"]["param"] == param, body
    assert "\n" not in body["error"]["message"]


def test_a_template_that_writes_calls_in_another_format_is_refused(tiny_model_dir):
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(tiny_model_dir, max_new_tokens=4))
    session.tokenizer.chat_template = "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
    with serving(session) as server:
        status, _, body = raw_request(server, "POST", "/v1/chat/completions", json.dumps(
            {"messages": ASK, "tools": [TIME]}).encode())
        assert status == 400 and body["error"]["param"] == "tools" and "format" in body["error"]["message"]
        status, _, _ = raw_request(server, "POST", "/v1/chat/completions", json.dumps({"messages": ASK}).encode())
        assert status == 200  # requests without tools are answered as before


def test_the_default_model_holds_a_two_step_tool_conversation(real_target):
    """The real `openai` client: the model is made to call get_weather, the call's result goes back as a `tool`
    message, and the model answers in text (tool_choice none), the same with drafts and without."""
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession

    loaded = real_target("float32", "auto")
    session = ChatSession(loaded.model, loaded.tokenizer, _sam_settings(replace(GenerationConfig(max_new_tokens=64))))
    with serving(session, name="smollm2") as server:
        client = client_of(server)
        first = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, TIME],
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert first.choices[0].finish_reason == "tool_calls"
        call = first.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        result = json.dumps({"temperature": 18, "unit": "celsius", "sky": "cloudy"})
        history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": result}]
        answers = [client.chat.completions.create(model="smollm2", messages=history, tools=[WEATHER, TIME],
                                                  tool_choice="none", **extra)
                   for extra in ({}, {"extra_body": {"speculative": {"n_max": 0}}})]
        asked = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="none",
                                               max_tokens=1)
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    assert answers[0].choices[0].message.content and answers[0].choices[0].message.tool_calls is None
    assert answers[0].usage.prompt_tokens > asked.usage.prompt_tokens + 20  # the call and its result were read

