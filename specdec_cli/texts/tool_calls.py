"""Tool calls in a model's own words: how its chat template offers functions, how its answers call them, and the
grammar that makes an answer a call.

Three formats, told apart by the chat template's text:
- `hermes`: the template writes `<tool_call>` (Qwen2.5, Qwen3, Hermes 2/3, SmolLM3): the model answers
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call, text before them allowed;
- `llama3`: a Llama 3.x template (`<|start_header_id|>` and tools): the whole answer is one JSON object
  `{"name": ..., "parameters": {...}}` (an optional `<|python_tag|>` first);
- `generic`: a template that knows nothing of tools (SmolLM2, Gemma, ...): the functions are described in the system
  message in the hermes format's terms, past calls and results are written as text, and answers are read as
  hermes answers. A template that offers tools in another format (Mistral's `[TOOL_CALLS]`, ...) is refused, not
  guessed at.

The template gets tools as transformers passes them (`tools=[{"type": "function", "function": {...}}]`) and past
calls with their arguments as objects (`tool_call.function.arguments`), as the published templates expect.
Nothing here generates or streams: `ToolCallReader` reads an answer's text as it grows (the server streams what it
says may be shown). Arguments are returned as JSON text, as OpenAI's API carries them.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

from ..errors import SpecdecError

ToolFormat = Literal["hermes", "llama3", "generic"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def openai(self, index: Optional[int] = None) -> dict:
        """OpenAI's shape of the call (with `index` in a stream's delta)."""
        body = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return body if index is None else {"index": index, **body}


def tool_format(template: Optional[str]) -> ToolFormat:
    """How the model behind `template` calls tools (see the module docstring); a SpecdecError where it is none
    specdec reads."""
    if not template:
        raise SpecdecError("tools need the model's chat template, and this model has none (or the server runs --raw)")
    if OPEN in template:
        return "hermes"
    if "<|start_header_id|>" in template and re.search(r"\btools\b", template):
        return "llama3"
    if re.search(r"\btools\b", template):
        raise SpecdecError("this model's chat template writes tool calls in a format specdec does not read (it reads "
                           "Hermes/Qwen <tool_call> blocks and Llama 3 JSON calls)")
    return "generic"


# -- the prompt ------------------------------------------------------------------------------------------------------

def template_inputs(fmt: ToolFormat, messages: Sequence[dict], tools: Sequence[dict],
                    offer: bool = True) -> tuple[list[dict], Optional[list[dict]]]:
    """The messages and tools to render the template with: `tools` are OpenAI's tool objects, offered to the
    model unless `offer` is false (`tool_choice: none`); messages may hold assistant `tool_calls` (arguments as
    JSON text) and `tool` results."""
    if fmt != "generic":
        return [_native_message(message) for message in messages], (list(tools) if offer and tools else None)
    rendered: list[dict] = []
    previous = None  # the role of the message before: consecutive tool results make one user message
    for message in messages:
        if message["role"] == "tool":
            result = f"<tool_response>\n{message['content']}\n</tool_response>"
            if previous == "tool":
                rendered[-1]["content"] += "\n" + result
            else:
                rendered.append({"role": "user", "content": result})
        elif message.get("tool_calls"):
            calls = "\n".join(f"{OPEN}\n{_call_json(call)}\n{CLOSE}" for call in message["tool_calls"])
            rendered.append({"role": "assistant", "content": "\n".join(filter(None, (message["content"], calls)))})
        else:
            rendered.append({"role": message["role"], "content": message["content"]})
        previous = message["role"]
    if offer and tools:
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": rendered[0]["content"] + "\n\n" + _tools_prompt(tools)}
        else:
            rendered.insert(0, {"role": "system", "content": _tools_prompt(tools)})
    return rendered, None


def _native_message(message: dict) -> dict:
    if not message.get("tool_calls"):
        return dict(message)
    calls = [{**call, "function": {**call["function"], "arguments": _arguments_object(call["function"]["arguments"])}}
             for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _arguments_object(arguments: str) -> Any:
    """A past call's arguments as the object templates write (`| tojson`); text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _call_json(call: dict) -> str:
    function = call["function"]
    return json.dumps({"name": function["name"], "arguments": _arguments_object(function["arguments"])},
                      ensure_ascii=False)


def _tools_prompt(tools: Sequence[dict]) -> str:
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more of these functions to help with the user's request. Their "
            f"signatures, as JSON:\n<tools>\n{listed}\n</tools>\n\nTo call a function, answer with a JSON object "
            f"holding its name and arguments between {OPEN} tags, one block a call:\n{OPEN}\n"
            f'{{"name": "<function name>", "arguments": {{<the arguments as a JSON object>}}}}\n{CLOSE}')


# -- the answer -----------------------------------------------------------------------------------------------------

class ToolCallReader:
    """An answer's text read as it grows: the content that may be shown now, and the calls as each completes.

    hermes and generic: text before the first `<tool_call>` is content (an end that may begin the tag, and
    whitespace at the end, held back until what follows shows); each closed block is a call. Every format: an
    answer that begins with `{` (or Llama's python tag) is held whole and read at the end as bare JSON calls
    (Llama 3's way; small models leave hermes' tags out too); any other is content.
    A block that is not a call of an offered function (not JSON, another name) ends the reading: the answer is
    content if no call came before it. Feeding the whole text at once gives what feeding it in pieces gives."""

    def __init__(self, fmt: ToolFormat, names: Sequence[str]):
        self.fmt = fmt
        self.names = frozenset(names)
        self.text = ""
        self.calls: list[ToolCall] = []
        self._blocks = 0  # closed blocks read
        self._failed = False

    def add(self, piece: str) -> list[ToolCall]:
        """Take more of the answer's text; the calls it completes."""
        self.text += piece
        if self.fmt == "llama3" or self._failed:
            return []
        start = self.text.find(OPEN)
        if start < 0:
            return []
        blocks = self.text[start:].split(OPEN)[1:]
        new: list[ToolCall] = []
        for block in blocks[self._blocks:]:
            if CLOSE not in block:
                break
            call = self._call(block.split(CLOSE, 1)[0])
            self._blocks += 1
            if call is None:
                self._failed = True
                break
            new.append(call)
        self.calls += new
        return new

    def content(self, final: bool = False) -> str:
        """The content that may be shown now (final: the answer's whole content)."""
        start = self.text.find(OPEN) if self.fmt != "llama3" else -1
        if start >= 0:
            return self.text if final and not self.calls else self.text[:start].rstrip()
        if _may_be_json_call(self.text):
            return ("" if self.calls else self.text) if final else ""
        if final or self.fmt == "llama3":
            return self.text
        return self.text[:len(self.text) - _held(self.text)].rstrip()

    def finish(self) -> list[ToolCall]:
        """The answer has ended: the calls not returned yet (a last block left open, an answer of bare JSON)."""
        start = self.text.find(OPEN) if self.fmt != "llama3" else -1
        if start < 0:
            self.calls = self._json_calls(self.text) if _may_be_json_call(self.text) else []
            return list(self.calls)
        blocks = self.text[start:].split(OPEN)[1:]
        if not self._failed and len(blocks) > self._blocks and CLOSE not in blocks[self._blocks]:
            call = self._call(blocks[self._blocks])  # the answer ended inside a block
            if call is not None:
                self.calls.append(call)
                return [call]
        return []

    def _call(self, body: str) -> Optional[ToolCall]:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        return self._named(value, "arguments")

    def _named(self, value: Any, key: str) -> Optional[ToolCall]:
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        arguments = value.get(key, value.get("arguments", {}))
        if isinstance(arguments, str):
            arguments = _arguments_object(arguments)
        if not isinstance(arguments, dict):
            return None
        return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))

    def _json_calls(self, text: str) -> list[ToolCall]:
        """An answer of bare JSON calls (Llama 3's way, and small models' who leave out hermes' tags): one, or
        several separated by `;` or new lines; none unless the whole answer is calls."""
        text = text.strip()
        text = text[len(PYTHON_TAG):].lstrip() if text.startswith(PYTHON_TAG) else text
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(text):
            try:
                value, end = decoder.raw_decode(text, at)
            except ValueError:
                return []
            call = self._named(value, "parameters")
            if call is None:
                return []
            calls.append(call)
            at = end
            while at < len(text) and text[at] in "; \n\t":
                at += 1
        return calls


def _may_be_json_call(text: str) -> bool:
    """Whether the answer so far may still turn out to be nothing but JSON calls."""
    head = text.lstrip()
    return not head or head[0] == "{" or PYTHON_TAG.startswith(head[:len(PYTHON_TAG)])


def _held(text: str) -> int:
    """How much of the end of `text` may begin the opening tag."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:size]):
            return size
    return 0


# -- the grammar of a call --------------------------------------------------------------------------------------

def call_grammar(fmt: ToolFormat, tools: Sequence[dict], name: Optional[str] = None, parallel: bool = True) -> str:
    """A Lark grammar (llguidance's, with `%json`) of an answer that is nothing but calls: of the function
    `name`, or of any of `tools`; one or more (`parallel`) in hermes' blocks, one in llama3's JSON."""
    chosen = [tool["function"] for tool in tools if name is None or tool["function"]["name"] == name]
    key = "parameters" if fmt == "llama3" else "arguments"
    shapes = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                key: function.get("parameters") or {"type": "object"}},
               "required": ["name", key], "additionalProperties": False} for function in chosen]
    schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    body = json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}}, ensure_ascii=False)
    if fmt == "llama3":
        return f"start: call\ncall: %json {body}\n"
    calls = 'call ("\\n" call)*' if parallel else "call"
    return f'start: {calls}\ncall: "{OPEN}\\n" body "\\n{CLOSE}"\nbody: %json {body}\n'
