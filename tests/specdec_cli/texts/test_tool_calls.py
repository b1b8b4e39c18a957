"""Tool calls in a model's own words (texts/tool_calls.py): the format told by the chat template, the prompt a
template is given (published hermes and Llama 3 templates' shapes, and the generic prompt for templates without
tools), answers read into calls the same whole or in pieces, and the grammar of a compulsory call, which the
engine keeps losslessly under every drafter. Pure functions, and the tiny model for the grammar."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.texts.chat_template import render_template
from specdec_cli.texts.tool_calls import ToolCallReader, call_grammar, template_inputs, tool_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
# the shapes of Qwen2.5's and Llama 3.1's published templates, cut to what tools touch
HERMES = ("{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
          "\n</tools><|im_end|>\n{%- endif %}{%- for message in messages %}"
          "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
          "{%- for call in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ call.function.name }}\", "
          "\"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
          "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
          "</tool_response><|im_end|>\n{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
          "{%- endif %}{%- endfor %}<|im_start|>assistant\n")
LLAMA3 = ("{%- for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n"
          "{%- if tools and loop.last %}Respond with {\"name\": ..., \"parameters\": ...}.{{ tools | tojson }}"
          "{%- endif %}{{ message.content }}<|eot_id|>{%- endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n")
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
MISTRAL = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"


class Template:
    """What render_template needs of a tokenizer."""

    special_tokens_map: dict = {}

    def __init__(self, text: str):
        self.text = text

    def get_chat_template(self) -> str:
        return self.text


def test_the_format_is_told_by_the_template():
    assert tool_format(HERMES) == "hermes"
    assert tool_format(LLAMA3) == "llama3"
    assert tool_format(CHATML) == "generic"
    for refused in (MISTRAL, None, ""):
        with pytest.raises(SpecdecError):
            tool_format(refused)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "content": "18 C", "tool_call_id": "a"},
    {"role": "tool", "content": "24 C", "tool_call_id": "b"},
]


def test_a_published_template_gets_tools_and_past_calls_as_it_expects():
    messages, tools = template_inputs("hermes", CONVERSATION, [WEATHER])
    text = render_template(Template(HERMES), messages, tools)
    assert json.dumps(WEATHER) in text  # offered as transformers passes tools
    assert '"arguments": {"city": "Paris"}}' in text  # arguments as an object, not a string of JSON
    assert "<tool_response>\n24 C\n</tool_response>" in text
    messages, tools = template_inputs("hermes", CONVERSATION, [WEATHER], offer=False)  # tool_choice none
    assert tools is None and "<tools>" not in render_template(Template(HERMES), messages, tools)
    assert '"parameters"' in render_template(Template(LLAMA3), *template_inputs("llama3", CONVERSATION[:2], [TIME]))


def test_a_template_without_tools_gets_them_in_the_system_message_and_the_history_as_text():
    messages, tools = template_inputs("generic", CONVERSATION, [WEATHER, TIME])
    assert tools is None
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools") and json.dumps(TIME) in messages[0]["content"]
    assert messages[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                      '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
                                      '{"city": "Rome"}}\n</tool_call>')
    assert messages[3]["content"] == "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n24 C\n</tool_response>"
    assert all(set(message) == {"role", "content"} for message in messages)
    alone, _ = template_inputs("generic", CONVERSATION[1:2], [TIME])
    assert alone[0]["role"] == "system" and "# Tools" in alone[0]["content"]
    assert template_inputs("generic", CONVERSATION[1:2], [TIME], offer=False)[0] == CONVERSATION[1:2]


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
# (format, answer) -> (content, [(name, arguments)])
ANSWERS = {
    ("hermes", CALL): ("", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("hermes", "Let me look.\n\n" + CALL + "\n" + CALL.replace("Paris", "Rome")): (
        "Let me look.", [("get_weather", {"city": "Paris", "unit": "celsius"}),
                         ("get_weather", {"city": "Rome", "unit": "celsius"})]),
    ("hermes", CALL[:-len("</tool_call>")]): ("", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("hermes", '{"name": "now", "arguments": {}}'): ("", [("now", {})]),  # tags left out
    ("hermes", '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>'): (
        '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>', []),  # a function not offered
    ("hermes", "<tool_call>\nnot json\n</tool_call> after"): ("<tool_call>\nnot json\n</tool_call> after", []),
    ("hermes", "Plain text with a < and {braces}.  "): ("Plain text with a < and {braces}.  ", []),
    ("hermes", '{"a": 1}'): ('{"a": 1}', []),
    ("generic", "x <tool_ca"): ("x <tool_ca", []),
    ("llama3", '{"name": "now", "parameters": {}}'): ("", [("now", {})]),
    ("llama3", '<|python_tag|>{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": '
               '{"city": "Oslo"}}'): ("", [("now", {}), ("get_weather", {"city": "Oslo"})]),
    ("llama3", "It is noon."): ("It is noon.", []),
    ("llama3", '{"name": "now", "parameters": {}} and more'): ('{"name": "now", "parameters": {}} and more', []),
}


def _read(fmt: str, answer: str, cuts: list[int]):
    """The answer fed in pieces cut at `cuts`: the content shown after each piece, the calls as they came, the
    final content."""
    reader = ToolCallReader(fmt, ["get_weather", "now"])
    shown, calls = [], []
    for start, end in zip([0] + cuts, cuts + [len(answer)]):
        calls += reader.add(answer[start:end])
        shown.append(reader.content())
    calls += reader.finish()
    return shown, calls, reader.content(final=True)


@pytest.mark.parametrize("fmt, answer", sorted(ANSWERS))
def test_an_answer_reads_the_same_whole_or_in_pieces_and_shown_content_is_never_taken_back(fmt, answer):
    content, expected = ANSWERS[fmt, answer]
    rng = random.Random(answer)
    splits = [[], list(range(1, len(answer)))] + [sorted(rng.sample(range(1, len(answer)), 3)) for _ in range(5)]
    for cuts in splits:
        shown, calls, final = _read(fmt, answer, cuts)
        assert final == content, cuts
        assert [(call.name, json.loads(call.arguments)) for call in calls] == expected, cuts
        assert all(final.startswith(piece) for piece in shown)  # what a stream showed stays
        assert all(later.startswith(earlier) for earlier, later in zip(shown, shown[1:]))
    assert len({call.id for call in calls}) == len(calls)


def test_calls_come_as_each_block_closes():
    reader = ToolCallReader("hermes", ["get_weather"])
    assert reader.add(CALL[:-3]) == []
    assert [call.name for call in reader.add(CALL[-3:])] == ["get_weather"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from specdec_cli.target_model.load.models import load_target

    return load_target(tiny_model_dir, "cpu", "float32")


@pytest.mark.parametrize("fmt, name, parallel", [("hermes", None, True), ("hermes", "get_weather", False),
                                                 ("llama3", None, False)])
def test_a_compulsory_call_is_a_call_of_an_offered_function_and_every_drafter_keeps_the_answer(
        loaded, fmt, name, parallel):
    """The tiny model answers under the call grammar: the answer reads as calls (of `name` where named) whose
    arguments validate against the function's parameters, and every drafter gives plain decoding's tokens."""
    from specdec_cli.decoding.engine import Engine, GenerationConfig
    from specdec_cli.decoding.grammar import GrammarSpec
    from specdec_cli.drafters import DrafterOptions, make_drafter, target_info

    tokenizer = loaded.tokenizer
    grammar = GrammarSpec("lark", call_grammar(fmt, [WEATHER, TIME], name, parallel))
    config = GenerationConfig(max_new_tokens=160, eos_token_ids=(tokenizer.eos_token_id,), draft_max=6,
                              grammar=grammar)
    prompt = tokenizer.encode("call a tool: <tool_call> get_weather now", add_special_tokens=False)
    answers = {}
    for drafter_name in ("none", "pld", "sam", "aded", "sam+recycle"):
        drafter = make_drafter(drafter_name, DrafterOptions(), target_info(loaded.model, tokenizer))
        answers[drafter_name] = Engine(loaded.model, tokenizer).generate(prompt, drafter, config)
    plain = answers["none"]
    assert all(generation.tokens == plain.tokens for generation in answers.values())
    assert plain.finish_reason == "eos"
    reader = ToolCallReader(fmt, ["get_weather", "now"])
    reader.add(tokenizer.decode(plain.tokens, skip_special_tokens=True))
    reader.finish()
    assert reader.calls and reader.content(final=True) == ""
    for call in reader.calls:
        assert name is None or call.name == name
        schema = {"get_weather": WEATHER, "now": TIME}[call.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.arguments), schema)
