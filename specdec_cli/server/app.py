"""The HTTP routes (starlette): OpenAI's chat and text completions and Responses API (responses_api.py), the model
list, health, and llama.cpp's own `/completion`, `/infill`, `/props`, `/tokenize` and `/detokenize` (llama_api.py);
`/metrics` (Prometheus' format, metrics.py); the chat page at `/` (page.py); the key; the body limit; CORS for the
origins `--cors-origins` names (starlette's middleware answers browsers' preflight requests, without a key).

`build_app(worker, settings, model_name)` makes the ASGI app. Every error is OpenAI's JSON body (api_errors.py): a
404/405 of the router too. A request is read (at most `max_body_bytes`, else 413), checked (requests.py), queued
(worker.py: 429 when the queue is full), then answered whole or streamed as server-sent events (`data: {chunk}`
lines, `data: [DONE]` at the end). From the moment its body is read, a task watches the connection: a client that
goes away cancels its job, waiting or generating. `/health` and the page's files need no key (as llama-server's);
the rest do when the server has one (the page asks for it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any, AsyncIterator, Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import page
from .api_errors import ApiError, error_body, one_line
from .jobs import Job
from .llama_api import (
    completion_body,
    completion_request,
    detokenize_body,
    infill_request,
    props_body,
    stream_last,
    stream_piece,
    tokenize_body,
)
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .requests import chat_request, read_json, text_request
from .responses import Ids, calls_chunk, chunk, completion, logprobs_body, timings, usage
from .responses_api import ResponseIds, responses_request
from .settings import ServerSettings
from .worker import Worker


def build_app(worker: Worker, settings: ServerSettings, model_name: str) -> Starlette:
    created = int(time.time())
    base = worker.session.generation

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name, **worker.health()})

    async def models(request: Request) -> Response:
        _authorize(request, settings.listen.api_key)
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "specdec"}]})

    async def chat(request: Request) -> Response:
        return await _complete(request, chat_request)

    async def text(request: Request) -> Response:
        return await _complete(request, text_request)

    async def llama_completion(request: Request) -> Response:
        return await _complete(request, completion_request, api="llama")

    async def responses(request: Request) -> Response:
        return await _complete(request, responses_request, api="responses")

    async def infill(request: Request) -> Response:
        return await _complete(request, infill_request, api="llama")

    async def props(request: Request) -> Response:
        _authorize(request, settings.listen.api_key)
        return JSONResponse(props_body(worker.session, model_name, worker.context, worker.parallel))

    async def metrics(request: Request) -> Response:
        _authorize(request, settings.listen.api_key)
        return Response(worker.metrics.render(), media_type=METRICS_TYPE)

    async def tokenize(request: Request) -> Response:
        _authorize(request, settings.listen.api_key)
        body = read_json(await _read_body(request, settings.max_body_bytes, settings.timeout))
        return JSONResponse(tokenize_body(body, worker.session.tokenizer))

    async def detokenize(request: Request) -> Response:
        _authorize(request, settings.listen.api_key)
        body = read_json(await _read_body(request, settings.max_body_bytes, settings.timeout))
        return JSONResponse(detokenize_body(body, worker.session.tokenizer))

    async def _complete(request: Request, parse: Callable[[dict, Optional[int]], Any], api: str = "openai"
                        ) -> Response:
        """One completion request, answered in `api`'s shape: "openai" (chat or text completions), "llama"
        (/completion, /infill) or "responses" (/v1/responses)."""
        _authorize(request, settings.listen.api_key)
        body = read_json(await _read_body(request, settings.max_body_bytes, settings.timeout))
        checked = parse(body, worker.context)
        rids = ResponseIds(checked.model or model_name, body) if api == "responses" else None
        checked.check_drafter(worker.session.drafter_name)
        checked.check_vocabulary(worker.session.info.vocab_size)
        tool_format = worker.tool_format() if checked.tools is not None else None
        fim_ends = worker.fim_ends() if checked.fim is not None else ()
        job = Job(checked, checked.generation(base, tool_format, fim_ends), asyncio.get_running_loop())
        worker.submit(job)
        watcher: Optional[asyncio.Task] = asyncio.create_task(_watch_disconnect(request, job, worker))
        try:
            kind, value = await job.messages.get()  # started, or an error found before generating
            if kind == "error":
                raise value
            if kind != "started":
                return Response(status_code=499)  # the client is gone: nobody reads this
            ids = Ids(checked.kind, checked.model or model_name)
            if checked.stream and watcher is not None:
                if api == "llama":
                    stream = _llama_events(job, model_name, watcher, checked.logprobs is not None)
                elif rids is not None:
                    stream = _response_events(job, rids, watcher)
                else:
                    stream = _events(job, ids, checked.include_usage, watcher, checked.logprobs is not None)
                watcher = None  # the stream ends it
                return StreamingResponse(stream, media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            while True:
                kind, value = await job.messages.get()
                if kind == "done":
                    return JSONResponse(completion_body(value, model_name) if api == "llama" else
                                        rids.response(value) if rids is not None else completion(ids, value))
                if kind == "error":
                    raise value
                if kind == "cancelled":
                    return Response(status_code=499)
        finally:
            if watcher is not None:
                watcher.cancel()

    routes = [Route("/", page.index, methods=["GET"]), Route("/page/{name}", page.asset, methods=["GET"]),
              Route("/health", health, methods=["GET"]), Route("/v1/health", health, methods=["GET"]),
              Route("/completion", llama_completion, methods=["POST"]), Route("/infill", infill, methods=["POST"]),
              Route("/props", props, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
              Route("/metrics", metrics, methods=["GET"])]
    for prefix in ("/v1", ""):  # llama-server answers both
        routes += [Route(f"{prefix}/models", models, methods=["GET"]),
                   Route(f"{prefix}/chat/completions", chat, methods=["POST"]),
                   Route(f"{prefix}/completions", text, methods=["POST"]),
                   Route(f"{prefix}/responses", responses, methods=["POST"])]
    handlers = {ApiError: _api_error, ClientGone: _client_gone, HTTPException: _http_error,
                Exception: _internal_error}
    middleware = []
    if settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"], max_age=600))
    return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)


async def _events(job: Job, ids: Ids, include_usage: bool, watcher: asyncio.Task,
                  with_logprobs: bool) -> AsyncIterator[str]:
    """The stream: a first chunk naming the role, text pieces (with their tokens' log probabilities where asked)
    and tool calls (each whole as it completes), the finish, usage (when asked), [DONE]."""
    shown = 0  # characters streamed so far: the text completions' text_offset
    calls = 0  # tool calls streamed so far
    try:
        yield _event(chunk(ids, "", first=True) if ids.kind == "chat" else chunk(ids, ""))
        while True:
            kind, value = await job.messages.get()
            if kind == "text":
                text, entries = value
                logprobs = logprobs_body(ids.kind, entries, shown) if with_logprobs else None
                yield _event(chunk(ids, text, logprobs=logprobs))
                shown += len(text)
            elif kind == "calls":
                yield _event(calls_chunk(ids, value, calls))
                calls += len(value)
            elif kind == "step":  # speculative.trace: the step's drafts, beside an empty delta
                yield _event({**chunk(ids), "speculation": value})
            elif kind == "done":
                last = chunk(ids, finish_reason=value.finish_reason)
                last["timings"] = timings(value)
                yield _event(last)
                if include_usage:
                    yield _event({**ids.head(chunk=True), "choices": [], "usage": usage(value),
                                  "timings": timings(value)})
                yield "data: [DONE]\n\n"
                return
            elif kind == "error":  # after the headers went out: the error as the stream's last event
                yield _event(value.body())
                return
            else:  # cancelled
                return
    finally:
        job.cancel()  # whatever ended the stream (the client gone, the server stopping), the job ends too
        watcher.cancel()


async def _llama_events(job: Job, model_name: str, watcher: asyncio.Task, with_probabilities: bool
                        ) -> AsyncIterator[str]:
    """llama-server's stream of /completion and /infill: `content` pieces (with their tokens' probabilities where
    n_probs asks), then the whole answer's fields with `stop: true`; no [DONE]."""
    try:
        while True:
            kind, value = await job.messages.get()
            if kind == "text":
                text, entries = value
                yield _event(stream_piece(text, entries if with_probabilities else None))
            elif kind == "done":
                yield _event(stream_last(value, model_name))
                return
            elif kind == "error":
                yield _event(value.body())
                return
            elif kind == "cancelled":
                return
    finally:
        job.cancel()
        watcher.cancel()


async def _response_events(job: Job, rids: ResponseIds, watcher: asyncio.Task) -> AsyncIterator[str]:
    """The Responses API's stream: typed events, each numbered, the text as `response.output_text.delta`s."""
    number = 0

    def numbered(event: dict) -> str:
        nonlocal number
        number += 1
        return f"event: {event['type']}\n" + _event({**event, "sequence_number": number - 1})

    try:
        for event in rids.opening():
            yield numbered(event)
        kind, value = await job.messages.get()
        while kind not in ("done", "error", "cancelled"):  # (a trace's steps are not this API's)
            if kind == "text":
                yield numbered(rids.delta(value[0]))
            kind, value = await job.messages.get()
        if kind == "done":
            for event in rids.closing(value):
                yield numbered(event)
        elif kind == "error":
            yield numbered({**value.body()["error"], "type": "error"})
    finally:  # (whatever ended the stream, the job ends too)
        job.cancel()
        watcher.cancel()


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _watch_disconnect(request: Request, job: Job, worker: Worker) -> None:
    """Withdraw the job when the client disconnects (the body is read, so only a disconnect can arrive)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            worker.withdraw(job)
            return


class ClientGone(Exception):
    """The client went away before its request was read: nobody to answer, nothing to log."""


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, at most `limit` bytes (413) and within `timeout` seconds of the headers (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {int(declared)} bytes; this server takes at most {limit}")
    parts, size = [], 0

    async def read() -> None:
        nonlocal size
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes, the most this server takes")
            parts.append(part)

    try:
        await asyncio.wait_for(read(), timeout)
    except ClientDisconnect:
        raise ClientGone() from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (--timeout)",
                       code="request_timeout") from None
    return b"".join(parts)


def _authorize(request: Request, api_key: Optional[str]) -> None:
    if not api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError(401, "invalid or missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _client_gone(request: Request, error: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it


async def _internal_error(request: Request, error: Exception) -> Response:
    """A bug outside generation: OpenAI's 500 body in one line (starlette logs the traceback after it)."""
    return JSONResponse(error_body(500, f"internal error: {one_line(error)}"), status_code=500)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    return JSONResponse(error_body(error.status_code, message.get(error.status_code, str(error.detail))),
                        status_code=error.status_code, headers=getattr(error, "headers", None))
