"""A chat request's tools, read and checked: `tools`, `tool_choice` (`auto`, `none`, `required` or a named
function), `parallel_tool_calls`, and the messages a tool conversation adds (an assistant's `tool_calls`, `tool`
results).

`ToolUse` is what the worker needs: the functions, whether the model is offered them, and, where the request
makes a call compulsory (`required`, a named function), the grammar that makes the answer nothing but calls of
them (texts/tool_calls.py writes it in the model's format). Every fault is a 400 naming the field. The
formats themselves (prompt, parsing) are texts/tool_calls.py's; this file reads request bodies only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from ..decoding.grammar import GrammarSpec
from ..errors import SpecdecError
from ..texts.tool_calls import ToolFormat, call_grammar
from .api_errors import ApiError

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI's rule for function names (with llama.cpp's `.` and `:`)


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[dict, ...]  # OpenAI's {"type": "function", "function": {"name", "description", "parameters"}}
    choice: str = "auto"  # auto, none, required, or "function" (the one named in `function`)
    function: Optional[str] = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool["function"]["name"] for tool in self.tools)

    @property
    def offered(self) -> bool:
        return self.choice != "none"

    def grammar(self, fmt: ToolFormat) -> Optional[GrammarSpec]:
        """Where a call is compulsory, the grammar of an answer that is only calls (a 400 naming `tools` when a
        function's parameters are not a schema the grammar engine reads)."""
        if self.choice not in ("required", "function"):
            return None
        parallel = self.parallel and self.choice == "required"  # a named function: that one call
        spec = GrammarSpec("lark", call_grammar(fmt, self.tools, self.function, parallel))
        try:
            spec.compiled()
        except SpecdecError as error:
            raise ApiError(400, f"'tools': a function's parameters are not a JSON schema this server can keep "
                           f"({error})", param="tools") from None
        return spec


def tool_use(body: dict) -> Optional[ToolUse]:
    """The request's tools and how they may be used; None where it offers none."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' names a tool but 'tools' offers none", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be an array of tools", param="tools")
    checked = tuple(_tool(tool, index) for index, tool in enumerate(tools))
    names = [tool["function"]["name"] for tool in checked]
    if len(set(names)) < len(names):
        raise ApiError(400, "'tools' names a function twice", param="tools")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    mode, function = _choice(choice, names)
    return ToolUse(checked, mode, function, parallel is not False)


def _tool(tool: Any, index: int) -> dict:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or \
            not isinstance(tool.get("function"), dict):
        raise ApiError(400, f"{param} must be {{'type': 'function', 'function': {{'name': ...}}}}", param=param)
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ApiError(400, f"{param}.function.name must be 1-64 letters, digits, '_', '-', '.' or ':'",
                       param=f"{param}.function.name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(400, f"{param}.function.parameters must be a JSON schema (an object)",
                       param=f"{param}.function.parameters")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{param}.function.description must be a string", param=f"{param}.function.description")
    kept = {"name": name, **({"description": description} if description else {}),
            "parameters": parameters or {"type": "object", "properties": {}}}
    return {"type": "function", "function": kept}


def _choice(choice: Any, names: list[str]) -> tuple[str, Optional[str]]:
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, "'tool_choice' must be auto, none, required or {'type': 'function', 'function': "
                       "{'name': ...}}", param="tool_choice")
    if name not in names:
        raise ApiError(400, f"'tool_choice' names {name!r}, which 'tools' does not offer", param="tool_choice")
    return "function", name


def assistant_calls(message: dict, param: str) -> list[dict]:
    """An assistant message's `tool_calls`, checked: each {"id", "type": "function", "function": {"name",
    "arguments" (JSON text)}}."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ApiError(400, f"{param}.tool_calls must be an array", param=f"{param}.tool_calls")
    checked = []
    for index, call in enumerate(calls):
        where = f"{param}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", ""), str):
            raise ApiError(400, f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments' "
                           "(JSON text)}}}}", param=where)
        call_id = call.get("id")
        checked.append({"id": call_id if isinstance(call_id, str) else f"call_{index}", "type": "function",
                        "function": {"name": function["name"], "arguments": function.get("arguments") or "{}"}})
    return checked
