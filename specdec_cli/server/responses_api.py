"""OpenAI's Responses API (`POST /v1/responses`), the one newer clients speak (the OpenAI Agents SDK, `openai`'s
`client.responses`): a request read as the chat completion it amounts to, and the answer shaped as a `response`
object, whole or as its stream of typed events.

Read: `input` (a string, or message items: `role` user, system, developer or assistant; `content` a string or
`input_text`/`output_text` parts), `instructions` (a system message first), `max_output_tokens`, `temperature`,
`top_p`, `stream`, `text.format` (`text`, `json_object`, `json_schema`: the grammar chat completions keep) and
specdec's `speculative`. Refused by name (400), since this server does not carry them out: tools and tool items,
`previous_response_id` and `conversation` (nothing is stored), `background`, `truncation: "auto"`, `reasoning`,
`top_logprobs`, `include`, `prompt`, and input other than text. Fields that change nothing here (`store`,
`metadata`, `user`, `service_tier`, ...) are ignored.

Written: the `response` object (`output`: one assistant message with one `output_text` part; `status`
"completed", or "incomplete" with `incomplete_details.reason` "max_output_tokens"; `usage` as input/output tokens)
and, streamed, `response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` per piece, then the `.done` events and
`response.completed` (or `response.incomplete`), each numbered by `sequence_number`; specdec's `timings` ride on
the response object. Builders and readers only: app.py runs the job.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from .api_errors import ApiError
from .requests import CompletionRequest, chat_request
from .responses import Outcome, timings

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")
# field -> is it set to something this server does not carry out?
REFUSED = {"tools": lambda value: bool(value), "tool_choice": lambda value: value not in (None, "none", "auto"),
           "previous_response_id": lambda value: value is not None, "conversation": lambda value: value is not None,
           "background": lambda value: bool(value), "truncation": lambda value: value not in (None, "disabled"),
           "reasoning": lambda value: bool(value), "top_logprobs": lambda value: bool(value),
           "include": lambda value: bool(value), "prompt": lambda value: value is not None}


def responses_request(body: dict, max_tokens_limit: Optional[int]) -> CompletionRequest:
    """A /v1/responses body as the chat completion request it amounts to (checked: 400 naming the field)."""
    for name, asks in REFUSED.items():
        if asks(body.get(name)):
            raise ApiError(400, f"'{name}' is not carried out by this server's Responses API (it stores no "
                           "responses, calls no tools and reads text alone); leave it out", param=name)
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": messages}
    for name, chat_name in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                            ("stream", "stream"), ("speculative", "speculative")):
        if body.get(name) is not None:
            chat[chat_name] = body[name]
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise ApiError(400, "'text' must be an object", param="text")
    response_format = _format((text or {}).get("format"))
    if response_format is not None:
        chat["response_format"] = response_format
    try:
        return chat_request(chat, max_tokens_limit)
    except ApiError as error:  # named as this API names it
        names = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}
        param = names.get((error.param or "").split("[")[0], error.param)
        raise ApiError(error.status, str(error).replace(f"'{error.param}'", f"'{param}'"), param=param) from None


def _input_messages(value: Any) -> list[dict]:
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'input' must be a non-empty string or array of messages", param="input")
    messages = []
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else None
            raise ApiError(400, f"{param}: only message items are supported here, got {kind!r}", param=param)
        role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise ApiError(400, f"{param}.role must be one of {', '.join(ROLES)}", param=f"{param}.role")
        content = item.get("content")
        if isinstance(content, list):
            if not all(isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)
                       for part in content):
                raise ApiError(400, f"{param}.content: only text parts (input_text, output_text) are supported",
                               param=f"{param}.content")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise ApiError(400, f"{param}.content must be a string or an array of text parts",
                           param=f"{param}.content")
        messages.append({"role": role, "content": content})
    return messages


def _format(value: Any) -> Optional[dict]:
    """`text.format` as chat completions' `response_format` (None: free text)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "'text.format.type' must be text, json_object or json_schema", param="text.format")
    if value["type"] != "json_schema":
        return {"type": value["type"]}
    schema = {key: value[key] for key in ("name", "schema", "strict", "description") if key in value}
    return {"type": "json_schema", "json_schema": schema}


class ResponseIds:
    """One response's ids and creation time, and the request fields it echoes."""

    def __init__(self, model: str, body: dict):
        self.id = "resp_" + uuid.uuid4().hex
        self.message_id = "msg_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                     "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                     "metadata": body.get("metadata") or {}, "text": {"format": (body.get("text") or {}).get(
                         "format") or {"type": "text"}}}

    def message(self, text: str, done: bool) -> dict:
        content = [_part(text)] if done else []
        return {"type": "message", "id": self.message_id, "status": "completed" if done else "in_progress",
                "role": "assistant", "content": content}

    def response(self, outcome: Optional[Outcome]) -> dict:
        """The response object: in progress (no outcome yet), or done with its output and usage."""
        status, incomplete, output, used = "in_progress", None, [], None
        if outcome is not None:
            incomplete = {"reason": "max_output_tokens"} if outcome.finish_reason == "length" else None
            status = "incomplete" if incomplete else "completed"
            output = [self.message(outcome.text, done=True)]
            used = {"input_tokens": outcome.prompt_tokens,
                    "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
                    "output_tokens": outcome.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": incomplete, "model": self.model, "output": output,
                "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "usage": used, **self.echo}
        if outcome is not None:
            body["timings"] = timings(outcome)
        return body

    def opening(self) -> list[dict]:
        """The stream's first events: the response created and in progress, its message and text part opened."""
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [{"type": "response.created", "response": self.response(None)},
                {"type": "response.in_progress", "response": self.response(None)},
                {"type": "response.output_item.added", "output_index": 0, "item": self.message("", done=False)},
                {"type": "response.content_part.added", **where, "part": _part("")}]

    def delta(self, text: str) -> dict:
        return {"type": "response.output_text.delta", "item_id": self.message_id, "output_index": 0,
                "content_index": 0, "delta": text, "logprobs": []}

    def closing(self, outcome: Outcome) -> list[dict]:
        """The stream's last events: the text, part and message done, then the response completed or incomplete."""
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        whole = self.response(outcome)
        return [{"type": "response.output_text.done", **where, "text": outcome.text, "logprobs": []},
                {"type": "response.content_part.done", **where, "part": _part(outcome.text)},
                {"type": "response.output_item.done", "output_index": 0, "item": self.message(outcome.text, True)},
                {"type": f"response.{whole['status']}", "response": whole}]


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
