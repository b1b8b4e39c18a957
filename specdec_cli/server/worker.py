"""The one thread that generates: requests are answered one at a time, in arrival order, from a bounded queue.

`Job` is one request on its way: the checked request and its generation settings, where its messages go (an
asyncio queue of the event loop that serves the request, fed from the worker thread), and its cancel flag. The
worker sends a job `started` (the prompt fits: headers may go out), text pieces, then `done` with the outcome, or
`error` with an `ApiError`, or `cancelled`. A client that disconnects sets the flag, and the engine's next step
event stops the generation (within one step); a job cancelled while it waits is skipped.

`Worker.submit` refuses a job when the queue is full (429 with Retry-After: the recent mean time per answer times
the answers ahead). A failure inside generation is logged with its traceback and answered 500 in one line; the
worker goes on with the next job. The session's prompt cache makes a request that extends the previous context
compute only its new tokens; the answer memory (where on) learns every answer, and the drafter is rebuilt from it
when a new conversation starts, so `sam` drafts from what the server answered before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..decoding.engine import context_limit
from ..decoding.generation_config import GenerationConfig
from ..errors import SpecdecError
from ..texts.prompt_ids import format_prompt
from .api_errors import ApiError, one_line
from .requests import CompletionRequest
from .responses import FINISH_REASONS, Outcome
from .text_stream import TextStream

log = logging.getLogger("specdec.server")
RECENT = 16  # answers whose durations estimate Retry-After


class Cancelled(Exception):
    """The client went away: the generation stops at the next step."""


@dataclass
class Job:
    request: CompletionRequest
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, kind: str, value: Any = None) -> None:
        """Hand a message to the request's event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is stopping
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


class Worker:
    """Serves jobs from a queue of at most `queue_size` waiting, on one thread, with one chat session."""

    def __init__(self, session: Any, queue_size: int):
        self.session = session
        self.jobs: queue.Queue = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self.current: Optional[Job] = None
        self.served = 0
        self.durations: collections.deque = collections.deque(maxlen=RECENT)
        self.context = context_limit(session.model.config)
        self.last_prompt = 0  # tokens of the previous request's prompt (a shorter common prefix: new conversation)
        self.fresh: Optional[Any] = None  # a drafter built from the memory since, waiting for a new conversation
        self.building: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specdec-generate", daemon=True)

    # -- the queue -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop after the current step (`stop_soon`) and wait for the thread to end."""
        self.stop_soon()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def stop_soon(self) -> None:
        """Take no more jobs; the running one stops at its next step, the waiting ones are cancelled now."""
        self._stopping.set()
        current = self.current
        if current is not None:
            current.cancel()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.send("cancelled")
        try:
            self.jobs.put_nowait(None)  # wakes the thread if it waits for a job
        except queue.Full:
            pass

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it (429) when the queue is full."""
        if self._stopping.is_set():
            raise ApiError(503, "the server is stopping")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            wait = self.retry_after()
            raise ApiError(429, f"the server is busy: {self.queue_size} requests are waiting already; retry in "
                           f"{wait} s", code="queue_full", headers={"Retry-After": str(wait)}) from None

    def retry_after(self) -> int:
        mean = sum(self.durations) / len(self.durations) if self.durations else 1.0
        return max(1, min(3600, math.ceil(mean * (self.jobs.qsize() + 1))))

    def health(self) -> dict:
        return {"busy": self.current is not None, "queued": self.jobs.qsize(), "queue_size": self.queue_size,
                "served": self.served}

    def _run(self) -> None:
        while not self._stopping.is_set():
            job = self.jobs.get()
            if job is None:
                break
            if job.cancelled.is_set():
                job.send("cancelled")
                continue
            self.current = job
            started = time.perf_counter()
            try:
                self._serve(job)
            finally:
                self.current = None
                self.durations.append(time.perf_counter() - started)
                self.served += 1

    # -- one job -------------------------------------------------------------------------------------------------

    def _serve(self, job: Job) -> None:
        session, request = self.session, job.request
        try:
            prompt_ids = self._prompt_ids(request)
            self._check_context(prompt_ids)
            self._refresh_drafter(prompt_ids)
            if not request.cache_prompt:
                session.prompt_cache.clear()
            job.send("started")
            stream = TextStream(session.tokenizer, job.config.stop)

            def on_event(event: Any) -> None:
                if job.cancelled.is_set():
                    raise Cancelled()
                piece = stream.add(event.committed)
                if piece:
                    job.send("text", piece)

            generation = session.generate(prompt_ids, job.config, on_event)
            self.last_prompt = len(prompt_ids)
            if session.memory is not None:
                self._build_drafter()
            text = session.decode(generation)
            rest = stream.finish(text)
            if rest:
                job.send("text", rest)
            job.send("done", Outcome(text, FINISH_REASONS[generation.finish_reason], len(prompt_ids),
                                     generation.cached_tokens, len(generation.tokens), generation.stats,
                                     session.drafter_name, generation.finish_reason, tuple(generation.tokens)))
        except Cancelled:
            log.info("a client went away: its generation stopped")
            job.send("cancelled")
        except ApiError as error:
            job.send("error", error)
        except SpecdecError as error:
            job.send("error", ApiError(400, str(error), param=error.setting))
        except Exception as error:  # a bug or a failing model: logged in full, answered in one line
            log.exception("generation failed")
            job.send("error", ApiError(500, f"generation failed: {one_line(error)}", code="generation_failed"))

    def _prompt_ids(self, request: CompletionRequest) -> list[int]:
        session = self.session
        if request.kind == "chat":
            messages = list(request.messages)
            if session.system and not any(message["role"] == "system" for message in messages):
                messages.insert(0, {"role": "system", "content": session.system})
            return format_prompt(session.tokenizer, messages, session.raw)
        if isinstance(request.prompt, tuple):
            vocab = session.info.vocab_size
            if any(token >= vocab for token in request.prompt):
                raise ApiError(400, f"'prompt' holds token ids outside this model's vocabulary (< {vocab})",
                               param="prompt")
            return list(request.prompt)
        return list(session.tokenizer(request.prompt)["input_ids"])

    def _check_context(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if self.context is not None and len(prompt_ids) >= self.context:
            raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens, but this model reads at most "
                           f"{self.context} (prompt and answer together): shorten it", param="messages",
                           code="context_length_exceeded")

    def _build_drafter(self) -> None:
        """Build a drafter from the memory as it is now, in the background (one build at a time)."""
        if self.building is not None and self.building.is_alive():
            return
        session = self.session

        def build() -> None:
            try:
                self.fresh = session.make_drafter()
            except Exception:  # the memory is a help, never a failure: the drafter in use stays
                log.exception("rebuilding the drafter from the answer memory failed")

        self.building = threading.Thread(target=build, name="specdec-drafter", daemon=True)
        self.building.start()

    def _refresh_drafter(self, prompt_ids: list[int]) -> None:
        """A new conversation (the prompt does not extend the previous one): the drafter built from the memory
        since, if one is ready, takes over."""
        fresh = self.fresh
        if fresh is not None and self.session.prompt_cache.common_prefix(prompt_ids) < self.last_prompt:
            self.session.drafter, self.fresh = fresh, None
