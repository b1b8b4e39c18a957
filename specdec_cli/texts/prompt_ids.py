"""How a conversation becomes the target's token ids, the one place prompts do (chat, serve, bench and distill
all format theirs here): the tokenizer's chat template with the generation prompt, a system message first when
given, or the raw text with `raw=True`. A template is rendered as transformers renders it (chat_template.py),
bounded in size, and a failing one is a one-line SpecdecError. It does not load tokenizers (target_model/ does)
nor decode answers.

`next_turn_ids` is what every next turn of a conversation begins with, whatever the user writes next: the
conversation so far, then the template's end of its last answer and start of a user turn (ChatML's
`<|im_end|>\n<|im_start|>user\n`). A chat or a server computes it into the prompt cache while nobody waits
(`Engine.compute_ahead`).
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import SpecdecError
from .chat_template import render_template


def format_prompt(tokenizer: Any, messages: list[dict], raw: bool = False,
                  tools: Optional[list[dict]] = None) -> list[int]:
    """Token ids for a conversation ending in a user turn (raw: the concatenated contents, no template); `tools`
    are passed to the template as transformers passes them (texts/tool_calls.py prepares both)."""
    if raw:
        text = "".join(message["content"] for message in messages if message["role"] != "system")
        return list(tokenizer(text)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdecError("this model's tokenizer has no chat template; use --raw")
    text = render_template(tokenizer, messages, tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def with_system(messages: list[dict], system: Optional[str]) -> list[dict]:
    """The conversation with `system` (a session's --system) as its first message, unless it has one of its own:
    the one place a default system message is added (chat and serve)."""
    if not system or any(message["role"] == "system" for message in messages):
        return list(messages)
    return [{"role": "system", "content": system}, *messages]


def first_turn_ids(tokenizer: Any, text: str, raw: bool = False) -> list[int]:
    """Token ids for a conversation of one user turn, `text` (a prompt's first turn, as distill and vLLM's bench
    answer it)."""
    return format_prompt(tokenizer, [{"role": "user", "content": text}], raw)


_USER_WORDS = ("Hello", "1 ?")  # two next messages sharing no first character: what they share is the template's


def next_turn_ids(tokenizer: Any, conversation: list[dict]) -> list[int]:
    """Token ids every next prompt of `conversation` (ending in the assistant's answer) begins with: the prompts
    for two different next user messages, as far as they agree. Where the template tokenizes a message's first
    characters together with what precedes them, the agreement stops earlier: a shorter beginning, never a wrong
    one for these two (a next prompt that differs sooner shares less of it with the cache, nothing else)."""
    first, second = (format_prompt(tokenizer, [*conversation, {"role": "user", "content": words}])
                     for words in _USER_WORDS)
    common = 0
    while common < min(len(first), len(second)) and first[common] == second[common]:
        common += 1
    return first[:common]
