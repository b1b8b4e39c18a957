"""llama.cpp's own endpoints, as far as tools that measure llama-server use them: `POST /completion` (a prompt as
text or token ids, `n_predict`, sampling, `cache_prompt`, `return_tokens`; whole or streamed as llama-server
streams it: pieces of `content`, the last with `stop: true` and the rest), `POST /infill` (code
completion in editors, llama.vim's and llama.vscode's: `input_prefix`, `input_suffix`, `input_extra`, `prompt`, with
`/completion`'s fields, `n_indent` and `t_max_predict_ms`), `GET /props`, and `POST /tokenize` (`content`,
`add_special`, `with_pieces`) and `POST /detokenize` (`tokens`) shaped as llama-server's.

With them `specdec bench --reference http://HOST:PORT` measures a running `specdec serve` the way it measures a
running llama-server (bench/llama_server.py): the same token ids in, the answer's token ids and llama.cpp's
`timings` out. `cache_prompt: false` computes the prompt whole (the request takes nothing from the prompt cache
and leaves nothing in it; what it holds stays for the others). This file
reads and shapes bodies; the worker generates (worker.py), the routes are app.py's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from .. import __version__
from ..texts.fim import FimParts, check_extra
from .api_errors import ApiError
from .requests import CompletionRequest, text_request
from .responses import Outcome, timings
from .shaping_fields import DRY_FIELDS, LLAMA_LAST_N
from .unhonoured import refuse_unhonoured

STOP_TYPES = {"eos": "eos", "length": "limit", "stop": "word"}  # the engine's finish -> llama.cpp's stop_type


def completion_request(body: dict, max_tokens_limit: Optional[int]) -> CompletionRequest:
    """A /completion body as the OpenAI text completion it amounts to (llama.cpp's fields it does not carry out,
    `mirostat`, `typical_p`, ..., refused by name first)."""
    refuse_unhonoured(body)
    n_predict = body.get("n_predict")
    if n_predict is not None and (not isinstance(n_predict, int) or isinstance(n_predict, bool)):
        raise ApiError(400, "'n_predict' must be an integer", param="n_predict")
    if n_predict is not None and (n_predict < -1 or (max_tokens_limit is not None and n_predict > max_tokens_limit)):
        upper = f" up to {max_tokens_limit} (this model's context)" if max_tokens_limit else ""
        raise ApiError(400, f"'n_predict' must be -1 or 0 (the server's --max-new-tokens), or a count{upper}; got "
                       f"{n_predict}", param="n_predict")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    cache_prompt = body.get("cache_prompt", True)
    if not isinstance(cache_prompt, bool):
        raise ApiError(400, "'cache_prompt' must be a boolean", param="cache_prompt")
    openai_body = {key: body[key] for key in ("prompt", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                              "logit_bias", "json_schema", "grammar", "ignore_eos", "stream",
                                              "presence_penalty", "frequency_penalty", "repeat_penalty",
                                              *DRY_FIELDS)
                   if key in body}
    # llama.cpp's penalties count a window of the prompt and the answer: its default when left out
    openai_body["repeat_last_n"] = LLAMA_LAST_N if body.get("repeat_last_n") is None else body["repeat_last_n"]
    if "speculative.n_max" in body:  # llama-server's flat name
        openai_body["speculative"] = {**(body.get("speculative") or {}), "n_max": body["speculative.n_max"]}
    elif "speculative" in body:
        openai_body["speculative"] = body["speculative"]
    limits = {}
    for name, field in (("n_indent", "n_indent"), ("t_max_predict_ms", "time_limit_ms")):
        value = body.get(name, 0)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ApiError(400, f"'{name}' must be an integer >= 0", param=name)
        limits[field] = value
    if stream and limits.get("n_indent"):
        raise ApiError(400, "'n_indent' cuts an answer once it is whole here: ask it with 'stream': false",
                       param="n_indent")
    n_probs = body.get("n_probs")
    if n_probs is not None and (not isinstance(n_probs, int) or isinstance(n_probs, bool) or not 0 <= n_probs <= 20):
        raise ApiError(400, "'n_probs' must be an integer in 0..20", param="n_probs")
    if n_probs:  # llama.cpp: the chosen token's probability and n_probs alternatives
        openai_body["logprobs"] = n_probs
    if n_predict is not None and n_predict > 0:  # -1 (llama.cpp: until the context ends): the server's default
        openai_body["max_tokens"] = n_predict
    request = text_request(openai_body, max_tokens_limit)
    return CompletionRequest(**{**request.__dict__, "cache_prompt": cache_prompt, **limits})


def infill_request(body: dict, max_tokens_limit: Optional[int]) -> CompletionRequest:
    """An /infill body: the text before and after the gap (`input_prefix`, `input_suffix`, both required, either may
    be empty), other files (`input_extra`), what was typed at the gap (`prompt`), and /completion's fields."""
    for name in ("input_prefix", "input_suffix"):
        if not isinstance(body.get(name), str):
            raise ApiError(400, f"'{name}' is required: a string (it may be empty)", param=name)
    typed = body.get("prompt", "")
    if not isinstance(typed, str):
        raise ApiError(400, "'prompt' must be a string (the text typed at the gap)", param="prompt")
    chunks = body.get("input_extra") or []
    try:
        extra = check_extra(chunks if isinstance(chunks, list) else [None])
    except ValueError as error:
        raise ApiError(400, f"'input_extra' must be an array of {{\"filename\", \"text\"}}: {error}",
                       param="input_extra") from None
    # /completion's fields, read as for a prompt (the prompt itself is the FIM prompt, made from the parts)
    request = completion_request({**body, "prompt": "-"}, max_tokens_limit)
    parts = FimParts(prefix=body["input_prefix"], suffix=body["input_suffix"], middle=typed, extra=extra)
    return replace(request, prompt=body["input_prefix"] + typed, fim=parts)


def completion_body(outcome: Outcome, model_name: str) -> dict:
    """llama.cpp's /completion answer: the text, the token ids, why it stopped, the timings."""
    return {"content": outcome.text, "tokens": list(outcome.tokens), "stop": True, "model": model_name,
            "stop_type": STOP_TYPES[outcome.finish], "tokens_predicted": outcome.completion_tokens,
            "tokens_evaluated": outcome.prompt_tokens, "tokens_cached": outcome.cached_tokens,
            "timings": timings(outcome), **_probabilities(outcome),
            "generation_settings": {"speculative.types": "none" if outcome.drafter == "none" else
                                    f"specdec:{outcome.drafter}"}}


def _probabilities(outcome: Outcome) -> dict:
    return {} if outcome.logprobs is None else probabilities(outcome.logprobs)


def probabilities(entries: Any) -> dict:
    """llama-server's `completion_probabilities` (asked with n_probs): per token, its id, text, log probability
    and bytes, and its alternatives'."""
    return {"completion_probabilities": [
        {"id": entry.token, "token": entry.text, "logprob": entry.logprob, "bytes": list(entry.text.encode()),
         "top_logprobs": [{"id": token, "token": text, "logprob": value, "bytes": list(text.encode())}
                          for token, text, value in entry.top]} for entry in entries]}


def stream_piece(text: str, entries: Any = None) -> dict:
    """A streamed /completion or /infill piece, as llama-server streams them (`stop` false until the last)."""
    return {"content": text, "stop": False, **(probabilities(entries) if entries is not None else {})}


def stream_last(outcome: Outcome, model_name: str) -> dict:
    """The stream's last event: the whole answer's fields but its text, which the pieces carried."""
    last = {**completion_body(outcome, model_name), "content": ""}
    if "completion_probabilities" in last:
        last["completion_probabilities"] = []
    return last


def props_body(session: Any, model_name: str, context: Optional[int], slots: int) -> dict:
    """/props: the model, the build, the requests answered together (`--parallel`), the default settings."""
    generation = session.generation
    return {"model_path": model_name, "build_info": f"specdec {__version__}", "total_slots": slots,
            "default_generation_settings": {"n_ctx": context, "params": {
                "temperature": generation.temperature, "top_k": generation.top_k, "top_p": generation.top_p,
                "min_p": generation.min_p,
                "n_predict": generation.max_new_tokens,
                "speculative.types": "none" if session.drafter_name == "none" else f"specdec:{session.drafter_name}"}}}


def tokenize_body(body: dict, tokenizer: Any) -> dict:
    """/tokenize: {"tokens": [ids]}, or with `with_pieces` [{"id", "piece"}]; special tokens (BOS) only with
    `add_special`, as llama-server."""
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "'content' must be a string", param="content")
    flags = {}
    for name in ("add_special", "with_pieces"):
        flags[name] = body.get(name, False)
        if not isinstance(flags[name], bool):
            raise ApiError(400, f"'{name}' must be a boolean", param=name)
    ids = [int(token) for token in tokenizer.encode(content, add_special_tokens=flags["add_special"])]
    if not flags["with_pieces"]:
        return {"tokens": ids}
    return {"tokens": [{"id": token, "piece": tokenizer.decode([token])} for token in ids]}


def detokenize_body(body: dict, tokenizer: Any) -> dict:
    """/detokenize: {"content": text} of `tokens` (ids of this vocabulary)."""
    tokens = body.get("tokens")
    vocab = len(tokenizer)
    if not isinstance(tokens, list) or not all(isinstance(token, int) and not isinstance(token, bool) and
                                               0 <= token < vocab for token in tokens):
        raise ApiError(400, f"'tokens' must be an array of token ids (0..{vocab - 1})", param="tokens")
    return {"content": tokenizer.decode(tokens)}
