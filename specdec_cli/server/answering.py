"""One request's answer on its way out: the engine's step events turned into the messages its handler sends (text
pieces, tool calls, each step's drafts where the page asks), and the generation's end into the `done` outcome.

The same for a request answered alone (worker.py) and for one of several answered together (slots.py): what a
client receives never depends on what else the server was doing. Nothing here generates; the job's `send` hands
messages to the request's event loop.
"""

from __future__ import annotations

from typing import Any, Optional

from ..texts.tool_calls import ToolCallReader, ToolFormat
from .answer_stream import AnswerStream
from .logprob_stream import LogprobStream
from .responses import FINISH_REASONS, Outcome
from .step_trace import StepTrace


class Answering:
    def __init__(self, job: Any, session: Any, prompt_tokens: int, tool_format: Optional[ToolFormat]):
        request = job.request
        self.job, self.session, self.prompt_tokens = job, session, prompt_tokens
        # `tool_format`: where the request offers tools (worker.offered_format), its answer is read for calls
        reader = None if tool_format is None else ToolCallReader(tool_format, request.tools.names)
        self.stream = AnswerStream(session.tokenizer, job.config.stop, reader)
        self.scored = LogprobStream(session.tokenizer)  # (empty unless the request asks for log probabilities)
        self.trace = StepTrace(session.tokenizer) if request.trace and request.stream else None

    def on_event(self, event: Any) -> None:
        """One step event: what of it the client may see now."""
        job = self.job
        if self.trace is not None:
            job.send("step", self.trace.add(event))
        if event.logprobs:
            self.scored.add(event.logprobs)
        piece, calls = self.stream.add(event.committed)
        if piece:
            job.send("text", (piece, self.scored.release(len(self.stream.content))))
        if calls:
            job.send("calls", calls)

    def finish(self, generation: Any, drafter: str) -> Outcome:
        """The generation ended: the rest of the answer sent; the outcome `done` will carry (the caller records it
        in the metrics first, so that a client that has its answer finds it counted, then sends `done`)."""
        job, stream = self.job, self.stream
        text = self.session.decode(generation)
        rest, calls = stream.finish(text)
        last = self.scored.finish(len(text))
        if rest or last:
            job.send("text", (rest, last))
        if calls:
            job.send("calls", calls)
        finish = "tool_calls" if stream.calls else FINISH_REASONS[generation.finish_reason]
        outcome = Outcome(stream.content, finish, self.prompt_tokens, generation.cached_tokens,
                          len(generation.tokens), generation.stats, "none" if job.config.budget == 0 else drafter,
                          generation.finish_reason, tuple(generation.tokens), job.config.budget,
                          tuple(self.scored.released) if job.config.logprobs is not None else None,
                          tuple(stream.calls))
        return outcome

    def done(self, outcome: Outcome) -> None:
        self.job.send("done", outcome)
