"""The one thread that generates: requests are answered in arrival order from a bounded queue (jobs.py), one at a
time, or `--parallel N` together (slots.py: their steps in one forward, each answer what it would be alone).

The worker sends a job `started` (the prompt fits: headers may go out), text pieces, then `done` with the outcome, or
`error` with an `ApiError`, or `cancelled`. A client that disconnects sets the flag, and the engine's next step
event stops the generation (within one step); a job withdrawn while it waits leaves the queue at once, so only
clients still waiting hold places. A server that stops ends the running answer at its next step and every
waiting one with a 503 error (for a stream, its last event), never silently.

`Worker.submit` refuses a job when the queue is full (429 with Retry-After: the recent mean time per answer times
the answers ahead). A failure inside generation is logged with its traceback and answered 500 in one line; the
worker goes on with the next job. The session's prompt cache makes a request that extends the previous context
compute only its new tokens; while no request waits, the worker computes into it what a chat's next turn will
begin with (the template's close of the answer and opening of a user turn: `compute_ahead`). The answer memory
(where on) learns every answer, and the drafter is rebuilt from it when a new conversation starts, so `sam`
drafts from what the server answered before.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
from typing import Any, Optional, Sequence, Union

from ..errors import SpecdecError
from ..heap import settle_heap
from ..texts.fim import FimTokens, fim_end_ids, fim_prompt, find_fim_tokens
from ..texts.prompt_ids import format_prompt, with_system
from ..texts.tool_calls import ToolFormat, template_inputs, tool_format
from .answering import Answering
from .api_errors import ApiError, one_line
from .jobs import STOPPING, Cancelled, Job, WaitingJobs, stopping_error
from .metrics import ServerMetrics
from .requests import CompletionRequest

log = logging.getLogger("specdec.server")
RECENT = 16  # answers whose durations estimate Retry-After


class Worker:
    """Serves jobs from a queue of at most `queue_size` waiting, on one thread, with one chat session."""

    def __init__(self, session: Any, queue_size: int, parallel: int = 1):
        self.session = session
        self.jobs = WaitingJobs(queue_size)
        self.queue_size = queue_size
        self.parallel = parallel  # requests answered together (slots.py where more than one)
        self.running: list[Job] = []  # the jobs being answered
        self.served = 0
        self.durations: collections.deque = collections.deque(maxlen=RECENT)
        self.context = session.engine.context  # prompt and answer together (the engine's limit: one place)
        self.longest_token: Optional[int] = None  # characters of the vocabulary's longest entry (read when needed)
        self._tool_format: Union[ToolFormat, SpecdecError, None] = None  # read from the template when first needed
        self.last_prompt = 0  # tokens of the previous request's prompt (a shorter common prefix: new conversation)
        self.fresh: Optional[Any] = None  # a drafter built from the memory since, waiting for a new conversation
        self.building: Optional[threading.Thread] = None
        self.ahead: list[tuple[list[dict], int]] = []  # conversations answered since the server was idle, and
        # their last prompts' lengths (`compute_ahead`)
        self._stopping = threading.Event()
        self.metrics = ServerMetrics(self.health)  # GET /metrics
        self.thread = threading.Thread(target=self._run, name="specdec-generate", daemon=True)

    # -- the queue -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()
        threading.Thread(target=self._prepare_grammars, name="specdec-grammar", daemon=True).start()

    def _prepare_grammars(self) -> None:
        """The grammar engine's view of the tokenizer, built while no request waits for it (about a second); then
        what it and the server's start left alive is set apart from later cycle collections (heap.py: its 50,000
        objects would otherwise be walked in each, ~20 ms inside a request)."""
        try:
            from ..decoding.grammar import prepare

            prepare(self.session.tokenizer, self.session.info.eos_token_ids)
        except Exception:  # a grammar request will say why, in one line
            log.debug("preparing the grammar engine failed", exc_info=True)
        settle_heap()

    def stop(self) -> None:
        """Stop after the current step (`stop_soon`) and wait for the thread to end."""
        self.stop_soon()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def stop_soon(self) -> None:
        """Take no more jobs; the running one stops at its next step, the waiting ones are answered 503 now."""
        self._stopping.set()
        for job in list(self.running):
            job.cancel()
        for job in self.jobs.close():  # also wakes the thread if it waits for a job
            job.cancel()
            job.send("error", stopping_error("the request was not started"))

    def withdraw(self, job: Job) -> None:
        """The job's client went away: cancel it, and free its place if it still waits."""
        job.cancel()
        self.jobs.drop_cancelled()

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it (429) when the queue is full."""
        if self._stopping.is_set():
            raise ApiError(503, STOPPING, code="server_shutdown")
        if not self.jobs.put(job):
            wait = self.retry_after()
            raise ApiError(429, f"the server is busy: {self.queue_size} requests are waiting already; retry in "
                           f"{wait} s", code="queue_full", headers={"Retry-After": str(wait)})

    def retry_after(self) -> int:
        mean = sum(self.durations) / len(self.durations) if self.durations else 1.0
        return max(1, min(3600, math.ceil(mean * (len(self.jobs) + 1))))

    def health(self) -> dict:
        return {"busy": bool(self.running), "queued": len(self.jobs), "queue_size": self.queue_size,
                "served": self.served, "slots": self.parallel, "slots_busy": len(self.running)}

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _run(self) -> None:
        if self.parallel > 1:
            from .slots import Slots

            slots = Slots(self)  # (its prompt cache, one context a slot, is the one warmed)
            self._warm_up()
            slots.run()
            return
        self._warm_up()
        while not self._stopping.is_set():
            self.compute_ahead()
            job = self.jobs.get()
            if job is None:
                break
            self.running = [job]
            started = time.perf_counter()
            try:
                self._serve(job)
            finally:
                self.running = []
                self.ended(started)

    def _longest_token(self) -> int:
        """Characters of the vocabulary's longest entry (read once: tens of ms for a large vocabulary)."""
        if self.longest_token is None:
            self.longest_token = max((len(entry) for entry in self.session.tokenizer.get_vocab()), default=1)
        return self.longest_token

    def _warm_up(self) -> None:
        """Before the first request: the system message and a user turn's opening computed into the prompt cache
        (ChatSession.warm_up), the vocabulary's longest entry read (a request's length check): a request arriving
        meanwhile waits for them, tens of ms. A failure costs nothing but the warm-up."""
        try:
            self._longest_token()
            self.session.warm_up()
        except SpecdecError:  # a template that cannot write a first turn: nothing was computed
            log.debug("warming up failed", exc_info=True)
        except Exception:
            log.debug("warming up failed", exc_info=True)
            self.session.prompt_cache.clear()

    def ended(self, started: float) -> None:
        """A job was answered (or failed): counted, its duration kept for Retry-After."""
        self.durations.append(time.perf_counter() - started)
        self.served += 1

    # -- one job -------------------------------------------------------------------------------------------------

    def _serve(self, job: Job) -> None:
        session, request = self.session, job.request
        try:
            prompt_ids = self.prompt_for(request)
            self._refresh_drafter(prompt_ids)
            job.send("started")
            answering = Answering(job, session, len(prompt_ids), self.offered_format(request))

            def on_event(event: Any) -> bool:
                if job.cancelled.is_set():
                    raise Cancelled()
                return answering.on_event(event)

            generation = session.generate(prompt_ids, job.config, on_event, remember=False,
                                          cached=request.cache_prompt)
            self.last_prompt = len(prompt_ids)
            outcome = answering.finish(generation, session.drafter_name)
            self.metrics.record(outcome.finish_reason, len(prompt_ids) - generation.cached_tokens,
                                generation.cached_tokens, generation)
            answering.done(outcome)  # the client has its answer; then it is remembered, for the drafts to come
            self.remember(generation.tokens, prompt_ids)
            self.answered(request, outcome)
        except Cancelled:
            self.cancelled(job)
        except Exception as error:
            self.fail(job, error)

    def cancelled(self, job: Job) -> None:
        """A job stopped before its end: its client went away, or the server is stopping."""
        self.metrics.failed("cancelled")
        if self._stopping.is_set():
            log.info("the server is stopping: the answer being generated was cut")
            job.send("error", stopping_error("the answer was cut before its end"))
        else:
            log.info("a client went away: its generation stopped")
            job.send("cancelled")

    def fail(self, job: Job, error: Exception) -> None:
        """A job that failed: a refusal (4xx) in one line, or a bug or a failing model logged in full and answered
        500 in one line."""
        if isinstance(error, ApiError):
            self.metrics.failed("refused")
            job.send("error", error)
        elif isinstance(error, SpecdecError):
            self.metrics.failed("refused")
            job.send("error", ApiError(400, str(error), param=error.setting))
        else:
            self.metrics.failed("error")
            log.error("generation failed", exc_info=error)
            job.send("error", ApiError(500, f"generation failed: {one_line(error)}", code="generation_failed"))

    def offered_format(self, request: CompletionRequest) -> Optional[ToolFormat]:
        """The tool format where the request offers tools (its answer is read for calls), else None."""
        return self.tool_format() if request.tools is not None and request.tools.offered else None

    def tool_format(self) -> ToolFormat:
        """How the served model calls tools (from its chat template), or a 400 naming `tools` where specdec reads
        no format of it."""
        if self._tool_format is None:
            try:
                template = None if self.session.raw else getattr(self.session.tokenizer, "chat_template", None)
                self._tool_format = tool_format(template)
            except SpecdecError as error:
                self._tool_format = error
        if isinstance(self._tool_format, SpecdecError):
            raise ApiError(400, f"'tools': {self._tool_format}", param="tools")
        return self._tool_format

    def prompt_for(self, request: CompletionRequest) -> list[int]:
        """The request's prompt as token ids, checked against the context (a 400 before anything is sent)."""
        prompt_ids = self._prompt_ids(request)
        self._check_context(prompt_ids, request)
        return prompt_ids

    def _prompt_ids(self, request: CompletionRequest) -> list[int]:
        session = self.session
        self._check_characters(request)
        if request.kind == "chat":
            messages = with_system(list(request.messages), session.system)
            tools = None
            if request.tools is not None or any("tool_calls" in m or m["role"] == "tool" for m in messages):
                offered = request.tools is not None and request.tools.offered
                messages, tools = template_inputs(self.tool_format(), messages,
                                                  request.tools.tools if request.tools else (), offered)
            return format_prompt(session.tokenizer, messages, session.raw, tools=tools)
        if request.fim is not None:
            return self._fim_prompt(request)
        if isinstance(request.prompt, tuple):
            vocab = session.info.vocab_size
            if any(token >= vocab for token in request.prompt):
                raise ApiError(400, f"'prompt' holds token ids outside this model's vocabulary (< {vocab})",
                               param="prompt")
            return list(request.prompt)
        return list(session.tokenizer(request.prompt)["input_ids"])

    @functools.cached_property
    def fim(self) -> Optional[FimTokens]:
        """The served model's fill-in-the-middle tokens (found once), or None."""
        return find_fim_tokens(self.session.tokenizer)

    def fim_ends(self) -> tuple[int, ...]:
        """What ends a middle beside the model's EOS (its FIM padding and file tokens, its end of text)."""
        return () if self.fim is None else fim_end_ids(self.session.tokenizer, self.fim)

    def _fim_prompt(self, request: CompletionRequest) -> list[int]:
        """A fill-in-the-middle prompt (`suffix`, /infill): the extra context trimmed to what the context leaves."""
        assert request.fim is not None
        if self.fim is None:
            raise ApiError(400, "this model has no fill-in-the-middle tokens: 'suffix' and /infill need a model "
                           "trained for it (Qwen2.5-Coder, StarCoder2, CodeLlama, ...)", param="suffix")
        answer = request.max_tokens or self.session.generation.max_new_tokens
        most = None if self.context is None else max(0, self.context - answer - 1)
        return fim_prompt(self.session.tokenizer, self.fim, request.fim, most)

    def _check_characters(self, request: CompletionRequest) -> None:
        """Refuse a text too long for the context before tokenizing it (megabytes of text take seconds of the only
        worker): no token spans more characters than the vocabulary's longest entry, so this many characters are
        at least this many tokens."""
        if self.context is None or isinstance(request.prompt, tuple):
            return
        longest = self._longest_token()
        fim = request.fim
        characters = len(request.prompt) + (len(fim.suffix) if fim else 0) + \
            sum(len(message["content"]) for message in request.messages) + \
            sum(len(call["function"]["arguments"]) for message in request.messages
                for call in message.get("tool_calls", ()))
        fewest = characters // max(1, longest)
        if fewest >= self.context:
            raise ApiError(400, f"the prompt has {characters} characters, at least {fewest} tokens, but this model "
                           f"reads at most {self.context} (prompt and answer together): shorten it",
                           param=_prompt_param(request), code="context_length_exceeded")

    def _check_context(self, prompt_ids: list[int], request: CompletionRequest) -> None:
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param=_prompt_param(request))
        if self.context is not None and len(prompt_ids) >= self.context:
            raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens, but this model reads at most "
                           f"{self.context} (prompt and answer together): shorten it", param=_prompt_param(request),
                           code="context_length_exceeded")

    def remember(self, tokens: list[int], prompt_ids: Sequence[int]) -> None:
        """An answer sent: kept in the answer memory (where on), and a drafter rebuilt from the memory in the
        background for the answers to come (`fresh`: the next new conversation's, or the next slot's)."""
        self.session.remember(tokens, prompt_ids)
        if self.session.memory is not None:
            self._build_drafter()

    def answered(self, request: CompletionRequest, outcome: Any) -> None:
        """An answer sent: where its client may resend the conversation with a next user turn (a chat answered
        without tools, its prompt cached), that turn's opening is computed ahead once the server is idle."""
        if request.kind != "chat" or not request.cache_prompt or request.tools is not None or outcome.tool_calls or \
                any(message["role"] == "tool" or "tool_calls" in message for message in request.messages):
            return
        conversation = [*request.messages, {"role": "assistant", "content": outcome.text}]
        self.ahead = [*self.ahead, (conversation, outcome.prompt_tokens)][-self.parallel:]  # (the prompt cache
        # holds as many contexts)

    def compute_ahead(self) -> None:
        """While no request waits: the next turns' openings of the conversations answered since, computed into
        the prompt cache (ChatSession.compute_ahead: the entries their next prompts would compute; a few ms each,
        so a request arriving meanwhile waits that long at most). A failure costs the prompt cache, not the
        server (a cache computed halfway is not kept)."""
        while self.ahead and not len(self.jobs):
            conversation, prompt_tokens = self.ahead[-1]
            try:
                self.session.compute_ahead(conversation, prompt_tokens)
            except SpecdecError:  # a template that cannot write the next turn: nothing was computed
                log.debug("computing a next turn's opening ahead failed", exc_info=True)
            except Exception:
                log.debug("computing a next turn's opening ahead failed", exc_info=True)
                self.session.prompt_cache.clear()
            self.ahead.pop()  # (only now: an empty list says nothing is being computed)

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


def _prompt_param(request: CompletionRequest) -> str:
    return "messages" if request.kind == "chat" else "prompt"
