"""OpenAI's Responses API (`POST /v1/responses`, server/responses_api.py) through the real `openai` client: the
answer is the chat completion's for the same messages (instructions as the system message), whole and streamed
(the events typed and numbered as the client parses them, their deltas the whole text), with and without drafts;
a JSON schema keeps its grammar; the cut answer is "incomplete"; what the server does not carry out is a 400
naming the field. Reading bodies is also tried without a server."""

from __future__ import annotations

import json

import pytest
from test_server import _chat_settings, client_of, raw_request, serving

from specdec_cli.server.api_errors import ApiError
from specdec_cli.server.responses_api import responses_request

openai = pytest.importorskip("openai")

ASK = "Name three colours."


@pytest.fixture(scope="module")
def tiny_session(tiny_model_dir):
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(tiny_model_dir, max_new_tokens=24))
    return session


def test_a_response_is_the_chat_completions_answer_whole_and_streamed(tiny_session):
    with serving(tiny_session) as server:
        client = client_of(server)
        chat = client.chat.completions.create(
            model="m", max_tokens=24, messages=[{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": ASK}])
        whole = client.responses.create(model="m", instructions="Be brief.", input=ASK, max_output_tokens=24)
        assert whole.object == "response" and whole.output_text == chat.choices[0].message.content
        assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
        assert whole.usage.output_tokens == chat.usage.completion_tokens
        assert whole.usage.input_tokens == chat.usage.prompt_tokens
        plain = client.responses.create(model="m", instructions="Be brief.", input=[
            {"role": "user", "content": [{"type": "input_text", "text": ASK}]}], max_output_tokens=24,
            extra_body={"speculative": {"n_max": 0}})
        assert plain.output_text == whole.output_text  # the same answer without drafts
        events = list(client.responses.create(model="m", instructions="Be brief.", input=ASK, max_output_tokens=24,
                                              stream=True))
        kinds = [event.type for event in events]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"]
        assert kinds[-1] == f"response.{whole.status}" and "response.output_text.done" in kinds
        assert [event.sequence_number for event in events] == list(range(len(events)))
        deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
        assert deltas == whole.output_text == events[-1].response.output_text
        traced = list(client.responses.create(model="m", instructions="Be brief.", input=ASK, max_output_tokens=24,
                                              stream=True, extra_body={"speculative": {"trace": True}}))
        assert [event.type for event in traced] == kinds  # (a trace's steps are chat's, not this API's)
        assert "".join(event.delta for event in traced if event.type == "response.output_text.delta") == deltas


def test_a_cut_answer_is_incomplete_and_a_schema_is_kept(tiny_session):
    with serving(tiny_session) as server:
        client = client_of(server)
        cut = client.responses.create(model="m", input=ASK, max_output_tokens=2)
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
        schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 8}},
                  "required": ["colour"], "additionalProperties": False}
        shaped = client.responses.create(model="m", input=ASK, max_output_tokens=60, text={"format": {
            "type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
        assert set(json.loads(shaped.output_text)) == {"colour"}


def test_what_is_not_carried_out_is_a_400_naming_it(tiny_session):
    with serving(tiny_session) as server:
        client = client_of(server)
        for asked, param in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                             ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
                             ({"max_output_tokens": 0}, "max_output_tokens")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model="m", input=ASK, **asked)
            assert refused.value.body["param"] == param, asked
        status, _, answer = raw_request(server, "POST", "/v1/responses", b'{"input": []}')
        assert status == 400 and answer["error"]["param"] == "input"


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "instructions": 3}, "instructions"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
])
def test_bodies_are_read_or_refused_by_name(body, param):
    with pytest.raises(ApiError) as refused:
        responses_request(body, None)
    assert refused.value.status == 400 and refused.value.param == param and "\n" not in str(refused.value)


def test_a_body_reads_as_its_chat_completion():
    request = responses_request({"model": "m", "instructions": "Be brief.", "max_output_tokens": 7,
                                 "temperature": 0.5, "input": [{"role": "developer", "content": "x"},
                                                               {"type": "message", "role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "hello"},
                                                               {"role": "user", "content": "again"}],
                                 "store": True, "metadata": {"a": "b"}}, None)
    assert [message["role"] for message in request.messages] == ["system", "system", "user", "assistant", "user"]
    assert (request.max_tokens, request.temperature, request.kind) == (7, 0.5, "chat")
