"""Request bodies read and checked: `/v1/chat/completions` and `/v1/completions` into one `CompletionRequest`.

Every fault is an `ApiError` 400 naming the parameter (wrong type, out of range, missing), found before the
request waits in the queue. A parameter left out takes the server's own setting (`--max-new-tokens`,
`--temperature`, ... of `specdec serve`): greedy unless the server was started otherwise. `model` may name
anything: the one loaded model answers. A field that would change the answer and is not carried out (penalties,
`logit_bias`, tools on text completions, ...) is refused by name (unhonoured.py); fields that change nothing here
(`user`, `logprobs: false`, `n` = 1, ...) are accepted and unknown fields ignored, as llama-server does. Chat
requests' tools are read by tools.py. This file reads bodies only; what they turn into is the worker's
(worker.py).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from typing import Any, Literal, Optional, Union

from ..decoding.dry import DryPenalty
from ..decoding.generation_config import GenerationConfig
from ..decoding.grammar import GrammarSpec
from ..errors import SpecdecError
from ..texts.fim import FimParts
from ..texts.tool_calls import ToolFormat
from .api_errors import ApiError
from .body_fields import integer, is_int, number
from .shaping_fields import PENALTY_FIELDS, shaping
from .tools import ToolUse, assistant_calls, tool_use
from .unhonoured import refuse_unhonoured

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_DRAFT = 64  # the longest draft a request may ask for (speculative.n_max)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit (decoding/logprobs.py)
TOOL_FIELDS = ("tools", "tool_choice")  # honoured on chat completions (server/tools.py), refused elsewhere
ROLES = ("system", "developer", "user", "assistant", "tool")
LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # the escape of a UTF-16 surrogate: paired, or a fault


@dataclass(frozen=True)
class CompletionRequest:
    """One request, checked: a chat (messages) or a text completion (a prompt), and how to generate."""

    kind: Literal["chat", "text"]
    model: str
    messages: tuple[dict, ...] = ()  # chat: {"role", "content"} with text content (and "tool_calls", "tool_call_id")
    prompt: Union[str, tuple[int, ...]] = ""  # text: a string or token ids
    max_tokens: Optional[int] = None  # None: the server's --max-new-tokens
    temperature: Optional[float] = None  # None: the server's setting (greedy by default)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with `usage`
    cache_prompt: bool = True  # reuse the prompt cache (llama.cpp's /completion may say false: computed whole)
    draft_max: Optional[int] = None  # `speculative.n_max`: this request's longest draft (0: plain decoding)
    drafter: Optional[str] = None  # `speculative.drafter`: "none" or the server's own drafter
    logprobs: Optional[int] = None  # alternatives per token with each token's log probability (None: none asked)
    grammar: Optional[GrammarSpec] = None  # response_format's JSON (schema), or llama.cpp's json_schema / grammar
    tools: Optional[ToolUse] = None  # chat: the functions offered (server/tools.py)
    trace: bool = False  # `speculative.trace`: a stream carries each step's drafts (`speculation`: the chat page's)
    min_tokens: int = 0  # vLLM's: no end-of-text token before the answer has this many tokens
    ignore_eos: bool = False  # llama-server's and vLLM's: no end-of-text token at all (the answer runs to max_tokens)
    fim: Optional[FimParts] = None  # text: fill in the middle (`suffix`; llama-server's /infill), the prompt its prefix
    n_indent: int = 0  # llama-server's: a later line indented less than this ends the answer
    time_limit_ms: int = 0  # llama-server's `t_max_predict_ms`: past it, the answer ends at its next line (0: none)
    logit_bias: tuple[tuple[int, float], ...] = ()  # ((token id, bias), ...) added to the logits of every choice
    presence_penalty: Optional[float] = None  # OpenAI's, -2..2 (None: off)
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None  # vLLM's repetition_penalty or llama-server's repeat_penalty (> 0)
    penalty_last_n: Optional[int] = None  # llama-server's repeat_last_n (None: OpenAI's and vLLM's counting)
    dry: Optional[DryPenalty] = None  # llama-server's DRY (`dry_multiplier`, ...; None: off)

    def check_drafter(self, served: str) -> None:
        """`speculative.drafter` names what this server can draft with: its own drafter, or none (400 otherwise)."""
        if self.drafter is not None and self.drafter not in ("none", served):
            raise ApiError(400, f"'speculative.drafter': this server drafts with {served}; a request may choose it "
                           f"or none, got {self.drafter!r}", param="speculative.drafter")

    def check_vocabulary(self, vocab: int) -> None:
        """`logit_bias` names tokens of the served model's vocabulary (400 otherwise)."""
        if any(token >= vocab for token, _ in self.logit_bias):
            raise ApiError(400, f"'logit_bias' names token ids outside this model's vocabulary (< {vocab})",
                           param="logit_bias")

    def generation(self, base: GenerationConfig, tool_format: Optional[ToolFormat] = None,
                   fim_ends: tuple[int, ...] = ()) -> GenerationConfig:
        """The server's generation settings with what this request sets; checked (400 on a bad combination).
        `tool_format`: how the served model calls tools, for a request that makes a call compulsory; `fim_ends`:
        what ends a middle beside the model's EOS, for a fill-in-the-middle request."""
        changes: dict[str, Any] = {"stop": self.stop}
        if self.fim is not None:
            changes["eos_token_ids"] = tuple(dict.fromkeys((*base.eos_token_ids, *fim_ends)))
        calls = self.tools.grammar(tool_format) if self.tools is not None and tool_format is not None else None
        if calls is not None:
            if self.grammar is not None:
                raise ApiError(400, "'tool_choice' makes the answer a tool call: it cannot also follow "
                               "'response_format' or a grammar", param="tool_choice")
            changes["grammar"] = calls
        for name in ("temperature", "top_p", "top_k", "min_p", "seed", *PENALTY_FIELDS, "penalty_last_n"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
        if self.max_tokens is not None:
            changes["max_new_tokens"] = self.max_tokens
        if self.logprobs is not None:
            changes["logprobs"] = self.logprobs
        if self.logit_bias:
            changes["logit_bias"] = self.logit_bias
        if self.dry is not None:
            changes["dry"] = self.dry
        if self.grammar is not None:
            changes["grammar"] = self.grammar
        if self.draft_max is not None or self.drafter == "none":
            changes["draft_max"] = 0 if self.drafter == "none" else self.draft_max
        if self.ignore_eos or self.min_tokens:  # (ignore_eos: the end-of-text token barred for the whole answer)
            changes["min_new_tokens"] = changes.get("max_new_tokens", base.max_new_tokens) if self.ignore_eos \
                else self.min_tokens
        config = replace(base, **changes)
        try:
            config.check()
        except SpecdecError as error:
            param = {"max_new_tokens": "max_tokens", "draft_max": None,
                     "min_new_tokens": "ignore_eos" if self.ignore_eos else "min_tokens"}.get(error.setting or "",
                                                                                           error.setting)
            raise ApiError(400, error.naming(param) if param else str(error), param=param) from None
        return config


def read_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error.msg} at line {error.lineno} column "
                       f"{error.colno}") from None
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply") from None
    except ValueError:  # an integer past Python's digit limit for int()
        raise ApiError(400, f"the request body holds an integer of more than {sys.get_int_max_str_digits()} "
                       "digits") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {json_type(body)}")
    if LONE_SURROGATE.search(raw) and _has_lone_surrogate(body):  # (a pair, "\ud83d\ude00", is one character)
        raise ApiError(400, "the request body holds half of a UTF-16 surrogate pair (\\ud800-\\udfff alone): "
                       "not text")
    return body


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in the parsed body holds a surrogate that JSON's escapes left unpaired."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(key) or _has_lone_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def json_type(value: Any) -> str:
    """A value's JSON type name, as a client wrote it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    names: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def chat_request(body: dict, max_tokens_limit: Optional[int]) -> CompletionRequest:
    """A /v1/chat/completions body, checked."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of messages", param="messages")
    checked = tuple(_message(message, index) for index, message in enumerate(messages))
    if checked[-1]["role"] == "assistant":
        raise ApiError(400, "the last message must not be the assistant's (this server does not continue an "
                       "assistant message)", param="messages")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise ApiError(400, "'logprobs' must be a boolean", param="logprobs")
    top = integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be in 0..{MAX_TOP_LOGPROBS}", param="top_logprobs")
    if top and not logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    tools = tool_use(body)
    common = _common(body, max_tokens_limit, honoured=(*TOOL_FIELDS, "repetition_penalty"))
    return CompletionRequest("chat", messages=checked, **common, logprobs=(top or 0) if logprobs else None,
                             tools=tools)


def text_request(body: dict, max_tokens_limit: Optional[int]) -> CompletionRequest:
    """A /v1/completions body, checked: `prompt` is a string, an array of one string, or an array of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt given as a batch of one
    if isinstance(prompt, list) and prompt and all(is_int(token) and token >= 0 for token in prompt):
        text: Union[str, tuple[int, ...]] = tuple(int(token) for token in prompt)
    elif isinstance(prompt, str) and prompt:
        text = prompt
    else:
        raise ApiError(400, "'prompt' must be a non-empty string or array of token ids (one prompt per request)",
                       param="prompt")
    logprobs = integer(body, "logprobs")  # the legacy API's: alternatives per token (0 = the chosen ones only)
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'logprobs' must be in 0..{MAX_TOP_LOGPROBS}", param="logprobs")
    suffix = body.get("suffix")
    fim = None
    if suffix is not None and suffix != "":  # fill in the middle: the prompt before the gap, the suffix after it
        if not isinstance(suffix, str) or not isinstance(text, str):
            raise ApiError(400, "'suffix' must be a string, after a 'prompt' given as text", param="suffix")
        fim = FimParts(prefix=text, suffix=suffix)
    common = _common(body, max_tokens_limit, honoured=("suffix", "repetition_penalty"))
    return CompletionRequest("text", prompt=text, **common, logprobs=logprobs, fim=fim)


def _message(message: Any, index: int) -> dict:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{param} must be an object with 'role' and 'content'", param=param)
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(400, f"{param}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{param}.role")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{param}.content: only text parts ({{'type': 'text', 'text': ...}}) are "
                               "supported", param=f"{param}.content")
            parts.append(part["text"])
        content = "".join(parts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise ApiError(400, f"{param}.content must be a string or an array of text parts", param=f"{param}.content")
    checked: dict = {"role": "system" if role == "developer" else role, "content": content}
    if role == "assistant" and message.get("tool_calls"):
        checked["tool_calls"] = assistant_calls(message, param)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise ApiError(400, f"{param}.tool_call_id must be a string", param=f"{param}.tool_call_id")
        checked["tool_call_id"] = call_id or ""
    return checked


def _common(body: dict, max_tokens_limit: Optional[int], honoured: tuple[str, ...] = ()) -> dict:
    """The fields both endpoints share, checked (`honoured`: fields of the refusal table this endpoint carries out)."""
    refuse_unhonoured(body, honoured)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    n = body.get("n", 1)
    if n is not None and (not is_int(n) or n != 1):
        raise ApiError(400, "'n' must be 1: this server answers one choice per request", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is not None:
        if not is_int(max_tokens):
            raise ApiError(400, f"'{param}' must be an integer", param=param)
        upper = f" and <= {max_tokens_limit} (this model's context)" if max_tokens_limit else ""
        if max_tokens < 1 or (max_tokens_limit is not None and max_tokens > max_tokens_limit):
            raise ApiError(400, f"'{param}' must be >= 1{upper}, got {max_tokens}", param=param)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    include_usage = (options or {}).get("include_usage", False)
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError(400, "'stream_options.include_usage' must be a boolean", param="stream_options.include_usage")
    draft_max, drafter, trace = _speculative(body.get("speculative"))
    ignore_eos = body.get("ignore_eos", False)
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise ApiError(400, "'ignore_eos' must be a boolean", param="ignore_eos")
    min_tokens = integer(body, "min_tokens") or 0
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        raise ApiError(400, f"'min_tokens' must be >= 0 and at most '{param}', got {min_tokens}", param="min_tokens")
    return {"model": model, "grammar": _grammar(body), "max_tokens": max_tokens, "trace": trace,
            "ignore_eos": bool(ignore_eos), "min_tokens": min_tokens,
            "temperature": number(body, "temperature"), "draft_max": draft_max, "drafter": drafter,
            "top_p": number(body, "top_p"), "top_k": integer(body, "top_k"), "min_p": number(body, "min_p"),
            "seed": integer(body, "seed"), **shaping(body),
            "stop": _stop(body.get("stop")), "stream": bool(stream), "include_usage": bool(include_usage)}


def _grammar(body: dict) -> Optional[GrammarSpec]:
    """What the answer must keep: OpenAI's `response_format` (`json_object`: any JSON object; `json_schema`: its
    `json_schema.schema`), or llama-server's `json_schema` (a schema) or `grammar` (GBNF); checked now (400)."""
    chosen: list[tuple[str, GrammarSpec]] = []
    response_format = body.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_object":
            chosen.append(("response_format", GrammarSpec.json_schema({"type": "object"})))
        elif kind == "json_schema":
            inner = response_format.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, dict) else None
            if not isinstance(schema, dict):
                raise ApiError(400, "'response_format.json_schema.schema' must be a JSON schema (an object)",
                               param="response_format")
            chosen.append(("response_format", GrammarSpec.json_schema(schema)))
        elif kind != "text":
            raise ApiError(400, "'response_format.type' must be text, json_object or json_schema",
                           param="response_format")
    if body.get("json_schema") is not None:
        if not isinstance(body["json_schema"], dict):
            raise ApiError(400, "'json_schema' must be a JSON schema (an object)", param="json_schema")
        chosen.append(("json_schema", GrammarSpec.json_schema(body["json_schema"])))
    if body.get("grammar"):
        if not isinstance(body["grammar"], str):
            raise ApiError(400, "'grammar' must be a GBNF grammar (a string)", param="grammar")
        chosen.append(("grammar", GrammarSpec("gbnf", body["grammar"])))
    if len(chosen) > 1:
        raise ApiError(400, f"give one of {', '.join(name for name, _ in chosen)}", param=chosen[1][0])
    if not chosen:
        return None
    name, spec = chosen[0]
    try:
        spec.compiled()
    except SpecdecError as error:
        raise ApiError(400, f"'{name}': {error}", param=name) from None
    return spec


def _speculative(value: Any) -> tuple[Optional[int], Optional[str], bool]:
    """`speculative: {"n_max": N, "drafter": NAME, "trace": BOOL}` (each optional): this request's longest draft
    (0 = plain decoding) and drafter, and whether its stream shows each step's drafts. The answer is the same
    either way (greedy verification is exact); only its speed is."""
    if value is None:
        return None, None, False
    if not isinstance(value, dict) or set(value) - {"n_max", "drafter", "trace"}:
        raise ApiError(400, "'speculative' must be an object with 'n_max', 'drafter' and/or 'trace'",
                       param="speculative")
    trace = value.get("trace", False)
    if not isinstance(trace, bool):
        raise ApiError(400, "'speculative.trace' must be a boolean", param="speculative.trace")
    n_max, drafter = value.get("n_max"), value.get("drafter")
    if n_max is not None and (not is_int(n_max) or not 0 <= n_max <= MAX_DRAFT):
        raise ApiError(400, f"'speculative.n_max' must be an integer in 0..{MAX_DRAFT} (0: no drafting)",
                       param="speculative.n_max")
    if drafter is not None and not isinstance(drafter, str):
        raise ApiError(400, "'speculative.drafter' must be a string", param="speculative.drafter")
    return n_max, drafter.strip().lower() if drafter is not None else None, trace


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(one, str) for one in stops):
        raise ApiError(400, "'stop' must be a string or an array of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' holds at most {MAX_STOP_STRINGS} strings, got {len(stops)}", param="stop")
    if any(not one for one in stops):
        raise ApiError(400, "'stop' strings must not be empty", param="stop")
    return tuple(stops)
