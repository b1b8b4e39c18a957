"""Chat templates rendered as transformers' `apply_chat_template` renders them, with jinja2 directly.

transformers compiles a tokenizer's chat template in a sandboxed jinja2 environment of its own
(`transformers.utils.chat_template_utils._compile_jinja_template`): trim_blocks and lstrip_blocks, the loop
controls extension and a `{% generation %}` block tag, a `tojson` that keeps non-ASCII characters and HTML as they
are, `raise_exception`, `strftime_now`, and a `dict` and a `namespace` that refuse underscore-prefixed names; the
messages and special tokens are first rebuilt from plain JSON types (`_plain_template_data`). Importing any of
that imports transformers (about a second), so this module builds the same environment from jinja2 alone, for
the native GGUF path's start-up; tests/specdec_cli/target_model/test_native_tokenizer.py renders templates both ways
and compares.

`render_template(tokenizer, messages)` renders piece by piece: a template that renders more than
MAX_TEMPLATE_OUTPUT characters is stopped there, and one that fails (a syntax error, a sandbox refusal, its own
raise_exception) is a SpecdecError carrying the template's own message.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Iterator, Optional, no_type_check

from ..errors import SpecdecError

MAX_TEMPLATE_OUTPUT = 1 << 20  # characters a chat template may render for one prompt (a real one renders kilobytes)


def render_template(tokenizer: Any, messages: list[dict], tools: Optional[list[dict]] = None) -> str:
    """The tokenizer's chat template rendered with the generation prompt and `tools` (see the module docstring)."""
    try:
        template = compile_template(tokenizer.get_chat_template())
        settings = plain_data({**tokenizer.special_tokens_map})
        pieces = template.generate(messages=plain_data(messages), tools=plain_data(tools), documents=None,
                                   add_generation_prompt=True, **settings)
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


def plain_data(value: Any) -> Any:
    """What a template may see of `value`: plain JSON types rebuilt (scalar subclasses stripped to their base
    type, mappings, lists, tuples, dataclasses and pydantic models walked), anything else an inert "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):  # numpy scalars (numpy itself is not imported here)
        return plain_data(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


@functools.lru_cache
@no_type_check
def compile_template(chat_template: str) -> Any:
    """The template compiled in transformers' sandboxed environment (see the module docstring); cached."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class AssistantTracker(jinja2.ext.Extension):
        """The `{% generation %}` block: rendered as its body (transformers tracks its span for masks)."""

        tags = {"generation"}

        def __init__(self, environment: ImmutableSandboxedEnvironment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._tracking = ContextVar("assistant_tracker", default=None)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context: Any, caller: Any) -> str:
            rendered = caller()
            tracking = self._tracking.get()
            if tracking is not None:
                blocks, indices = tracking
                start = len("".join(blocks))
                indices.append((start, start + len(rendered)))
            return rendered

        @contextmanager
        def activate_tracker(self, blocks: list, indices: list) -> Iterator[None]:
            if self._tracking.get() is not None:
                raise ValueError("AssistantTracker should not be reused before closed")
            token = self._tracking.set((blocks, indices))
            try:
                yield
            finally:
                self._tracking.reset(token)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        """`dict(...)` and `dict.fromkeys(...)`, and nothing else of the type."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore-prefixed attributes."""

        def __init__(*args: Any, **kwargs: Any):
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute.")

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment.from_string(chat_template)
