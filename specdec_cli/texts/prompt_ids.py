"""How a conversation becomes the target's token ids, the one place prompts do (chat, serve, bench and distill
all format theirs here): the tokenizer's chat template with the generation prompt, a system message first when
given, or the raw text with `raw=True`. A template is rendered in transformers' sandbox, bounded in size, and a
failing one is a one-line SpecdecError. It does not load tokenizers (target_model/ does) nor decode answers.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import SpecdecError


def format_prompt(tokenizer: Any, messages: list[dict], raw: bool = False) -> list[int]:
    """Token ids for a conversation ending in a user turn (raw: the concatenated contents, no template)."""
    if raw:
        text = "".join(message["content"] for message in messages if message["role"] != "system")
        return list(tokenizer(text)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdecError("this model's tokenizer has no chat template; use --raw")
    text = render_template(tokenizer, messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def first_turn_ids(tokenizer: Any, text: str, raw: bool = False) -> list[int]:
    """Token ids for a conversation of one user turn, `text` (a prompt's first turn, as distill and vLLM's bench
    answer it)."""
    return format_prompt(tokenizer, [{"role": "user", "content": text}], raw)


MAX_TEMPLATE_OUTPUT = 1 << 20  # characters a chat template may render for one prompt (a real one renders kilobytes)


def render_template(tokenizer: Any, messages: list[dict]) -> str:
    """The chat template rendered with the generation prompt, as transformers' apply_chat_template renders it (its
    sandboxed environment, its special tokens), but piece by piece: a template that renders more than
    MAX_TEMPLATE_OUTPUT characters is stopped there, and one that fails (a syntax error, a sandbox refusal, its own
    raise_exception) is a SpecdecError carrying the template's own message."""
    try:
        utils: Any = importlib.import_module("transformers.utils.chat_template_utils")
    except ImportError:  # pragma: no cover - another transformers layout: rendered whole, failures still one line
        utils = None
    compile_template = getattr(utils, "_compile_jinja_template", None)
    plain = getattr(utils, "_plain_template_data", None) or (lambda data: data)
    try:
        if compile_template is None:  # pragma: no cover
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return _bounded([text])
        template = compile_template(tokenizer.get_chat_template())
        settings = plain({**tokenizer.special_tokens_map})
        pieces = template.generate(messages=plain(messages), tools=None, documents=None, add_generation_prompt=True,
                                   **settings)
        return _bounded(pieces)
    except SpecdecError:
        raise
    except RecursionError:
        raise SpecdecError("the chat template failed: it recurses too deeply") from None
    except Exception as exc:  # jinja2's TemplateError and whatever the template's own expressions raise
        kind = type(exc).__name__
        message = " ".join(str(exc).split())[:300] or kind
        line = getattr(exc, "lineno", None)
        where = f" at line {line}" if isinstance(line, int) and kind == "TemplateSyntaxError" else ""
        raise SpecdecError(f"the chat template failed ({kind}{where}): {message}") from exc


def _bounded(pieces: Any) -> str:
    kept, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_TEMPLATE_OUTPUT:
            raise SpecdecError(f"the chat template renders more than {MAX_TEMPLATE_OUTPUT:,} characters for this "
                               "prompt; stopped there (is the template broken? --raw skips it)")
        kept.append(piece)
    return "".join(kept)
