"""The JSON of responses: a whole completion, a stream's chunks, `usage` and the speculative `timings`.

Shapes are OpenAI's (`chat.completion`, `chat.completion.chunk`, `text_completion`); `usage` adds
`prompt_tokens_details.cached_tokens` (prompt tokens taken from the prompt cache, not computed), and `timings`
beside it reports what llama-server users read there (prompt and predicted tokens, milliseconds, per second,
`cache_n`, `draft_n`, `draft_n_accepted`) and specdec's own figures (the drafter, steps, tokens per step, the steps
each draft source drafted). Log probabilities, where asked, in each API's shape: chat's `logprobs.content`, the
text completions' `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`. Builders only: nothing here generates or
sends.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # the engine's -> OpenAI's


@dataclass(frozen=True)
class Outcome:
    """What one request's generation came to, as responses report it."""

    text: str
    finish_reason: str  # OpenAI's: stop, length or tool_calls
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stats: Any  # decoding.stats.GenerationStats
    drafter: str
    finish: str = "length"  # the engine's: eos, stop or length
    tokens: tuple[int, ...] = ()  # the answer's token ids
    n_max: Optional[int] = None  # the longest draft it was verified with (0: plain decoding)
    logprobs: Optional[tuple[Any, ...]] = None  # logprob_stream.LogprobEntry per reported token, where asked
    tool_calls: tuple[Any, ...] = ()  # texts.tool_calls.ToolCall: the calls the answer made (text is the content)


class Ids:
    """One response's id, creation time and object names."""

    def __init__(self, kind: str, model: str):
        self.kind = kind  # "chat" or "text"
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model

    def head(self, chunk: bool = False) -> dict:
        name = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": name, "created": self.created, "model": self.model}


def usage(outcome: Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}


def timings(outcome: Outcome) -> dict:
    """llama-server's per-response timings, and the speculative figures of this answer."""
    stats = outcome.stats
    computed = outcome.prompt_tokens - outcome.cached_tokens
    prompt_ms = stats.ttft_seconds * 1000.0
    predicted_ms = max(stats.wall_seconds - stats.ttft_seconds, 0.0) * 1000.0
    predicted = outcome.completion_tokens
    return {
        "prompt_n": computed, "cache_n": outcome.cached_tokens, "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / computed, 3) if computed else 0.0,
        "prompt_per_second": round(computed / (prompt_ms / 1000.0), 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted, "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted, 3) if predicted else 0.0,
        "predicted_per_second": round(predicted / (predicted_ms / 1000.0), 3) if predicted_ms > 0 else 0.0,
        "drafter": outcome.drafter, "n_max": outcome.n_max, "steps": stats.steps, "draft_n": stats.drafted_tokens,
        "draft_n_accepted": stats.accepted_tokens, "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_step": round(stats.mean_accepted_tokens, 4), "draft_sources": dict(stats.sources),
    }


def logprobs_body(kind: str, entries: Optional[Sequence[Any]], text_offset: int = 0) -> Optional[dict]:
    """Log probabilities of `entries` (LogprobEntry) as chat (`content`) or text completions (legacy lists, offsets
    counted from `text_offset`) report them; None where none were asked."""
    if entries is None:
        return None
    if kind == "chat":
        return {"content": [{"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.text.encode()),
                             "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode())}
                                              for _, text, value in entry.top]} for entry in entries]}
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += entry.shown
    return {"tokens": [entry.text for entry in entries], "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [{text: value for _, text, value in entry.top} for entry in entries],
            "text_offset": offsets}


def completion(ids: Ids, outcome: Outcome) -> dict:
    """A whole (not streamed) response."""
    logprobs = logprobs_body(ids.kind, outcome.logprobs)
    if ids.kind == "chat":
        message: dict = {"role": "assistant", "content": outcome.text}
        if outcome.tool_calls:
            message = {"role": "assistant", "content": outcome.text or None,
                       "tool_calls": [call.openai() for call in outcome.tool_calls]}
        choice: dict = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": outcome.finish_reason}
    else:
        choice = {"index": 0, "text": outcome.text, "logprobs": logprobs, "finish_reason": outcome.finish_reason}
    return {**ids.head(), "choices": [choice], "usage": usage(outcome), "timings": timings(outcome)}


def chunk(ids: Ids, text: Optional[str] = None, finish_reason: Optional[str] = None, first: bool = False,
          logprobs: Optional[dict] = None) -> dict:
    """One streamed piece: text (the first chat chunk also names the role) with its tokens' log probabilities
    where asked (logprobs_body), or the end with its finish reason."""
    if ids.kind == "chat":
        delta: dict = {"role": "assistant", "content": text or ""} if first else \
            ({"content": text} if text is not None else {})
        choice: dict = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    return {**ids.head(chunk=True), "choices": [choice]}


def calls_chunk(ids: Ids, calls: Sequence[Any], first_index: int) -> dict:
    """Streamed tool calls (texts.tool_calls.ToolCall), each whole, numbered from `first_index`."""
    delta = {"tool_calls": [call.openai(first_index + offset) for offset, call in enumerate(calls)]}
    return {**ids.head(chunk=True), "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                 "finish_reason": None}]}


def usage_chunk(ids: Ids, outcome: Outcome, include_usage: bool) -> dict:
    """The stream's last chunk: no choices, `usage` (asked with stream_options.include_usage) and `timings`."""
    body: dict = {**ids.head(chunk=True), "choices": [], "timings": timings(outcome)}
    if include_usage:
        body["usage"] = usage(outcome)
    return body
