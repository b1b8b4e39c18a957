"""Request fields of OpenAI's and llama-server's APIs that this server does not honour, refused by name.

A client that offers tools or asks for Mirostat sampling and silently gets an answer made without them cannot
tell that its request was not carried out. So every field those APIs define that would change the answer (or add
to it) and that specdec does not carry out gets a 400 naming it, when it is set to anything but its neutral value
(`presence_penalty: 0`, `tools: []` are accepted). Fields that change nothing here (`user`, `store`, `metadata`,
`service_tier`, `parallel_tool_calls` without tools, `prediction`, `n_keep`, ...) and unknown fields are ignored,
as llama-server ignores them.

This file only decides; requests.py and llama_api.py call `refuse_unhonoured` on every body before reading it.
"""

from __future__ import annotations

from typing import Any, Callable

from .api_errors import ApiError


def _set(value: Any) -> bool:
    """Anything but null, false, 0, an empty string, array or object."""
    return value not in (None, False, 0, "", [], {})


def _given(value: Any) -> bool:
    """Anything but null: an empty object asks too (web_search_options: {} turns web search on)."""
    return value is not None


def _not_one(value: Any) -> bool:
    return value is not None and value != 1


def _not_text_only(value: Any) -> bool:
    return value is not None and value != ["text"]


def _tool_choice(value: Any) -> bool:
    return value is not None and value != "none"


def _top_n_sigma(value: Any) -> bool:
    return value is not None and value != -1 and value != 0


# field -> (is it set to something that would change the answer?, what it asks for)
UNHONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (_set, "tool calls"),
    "tool_choice": (_tool_choice, "tool calls"),
    "functions": (_set, "function calls"),
    "function_call": (_tool_choice, "function calls"),
    "repetition_penalty": (_not_one, "vLLM's repetition penalty over the whole context (/completion takes "
                           "llama.cpp's repeat_penalty and repeat_last_n; the /v1 routes take either)"),
    "typical_p": (_not_one, "typical sampling"),
    "tfs_z": (_not_one, "tail-free sampling"),
    "mirostat": (_set, "Mirostat sampling"),
    "dynatemp_range": (_set, "dynamic temperature"),
    "xtc_probability": (_set, "XTC sampling"),
    "top_n_sigma": (_top_n_sigma, "top-n-sigma sampling"),
    "echo": (_set, "the prompt echoed in the answer"),
    "suffix": (_set, "a suffix (fill-in-the-middle: /v1/completions carries it out)"),
    "best_of": (_not_one, "several answers to choose from"),
    "audio": (_set, "audio output"),
    "modalities": (_not_text_only, "output other than text"),
    "web_search_options": (_given, "web search"),
}


def refuse_unhonoured(body: dict, honoured: tuple[str, ...] = ()) -> None:
    """A 400 naming the first field of `body` that asks for what this server does not carry out (`honoured`: those
    of the table the endpoint at hand carries out: chat completions take tools)."""
    for name, (changes_answer, what) in UNHONOURED.items():
        if name in body and name not in honoured and changes_answer(body[name]):
            raise ApiError(400, f"'{name}' asks for {what}, which this server does not support; leave it out "
                           "(the answer would not be what was asked for)", param=name)
