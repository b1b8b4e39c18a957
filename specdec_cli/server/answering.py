"""One request's answer on its way out: the engine's step events turned into the messages its handler sends (text
pieces, tool calls, each step's drafts where the page asks), and the generation's end into the `done` outcome.

The same for a request answered alone (worker.py) and for one of several answered together (slots.py): what a
client receives never depends on what else the server was doing. Nothing here generates; the job's `send` hands
messages to the request's event loop.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..texts.fim import cut_at_indent
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
        self.first_token_at: Optional[float] = None  # (llama-server's `t_max_predict_ms` counts from it)
        self.judged = 0  # `n_indent`: the answer's lines before this line end passed

    def on_event(self, event: Any) -> bool:
        """One step event: what of it the client may see now. True ends the answer here: a later line indented less
        than `n_indent`, or `t_max_predict_ms` passed once the answer has a line end (llama-server's limits)."""
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
        return self._limited()

    def _limited(self) -> bool:
        request, content = self.job.request, self.stream.content
        if request.n_indent:
            if cut_at_indent(content[self.judged:], request.n_indent) is not None:
                return True
            self.judged = max(self.judged, content.rfind("\n"))  # (the last line may be judged again)
        if request.time_limit_ms:
            now = time.perf_counter()
            if self.first_token_at is None:
                self.first_token_at = now
            elif (now - self.first_token_at) * 1000 > request.time_limit_ms and "\n" in content:
                return True
        return False

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
        ended = generation.finish_reason  # the engine's reason; a cut below is a limit's ("length")
        content, tokens = stream.content, list(generation.tokens)
        cut = cut_at_indent(content, job.request.n_indent)
        if cut is not None:  # (llama-server keeps the short line's indentation, not its text)
            content, ended = content[:cut], "length"
            tokens = tokens[: self._tokens_for(tokens, cut)]  # (a step may have committed past the cut)
        finish = "tool_calls" if stream.calls else FINISH_REASONS[ended]
        outcome = Outcome(content, finish, self.prompt_tokens, generation.cached_tokens,
                          len(tokens), generation.stats, "none" if job.config.budget == 0 else drafter,
                          ended, tuple(tokens), job.config.budget,
                          tuple(self.scored.released[: len(tokens)]) if job.config.logprobs is not None else None,
                          tuple(stream.calls))
        return outcome

    def _tokens_for(self, tokens: list[int], characters: int) -> int:
        """The fewest of the answer's tokens whose text holds its first `characters` characters: what an answer cut
        there reports, whatever a drafted step committed past the cut."""
        low, high = 0, len(tokens)
        while low < high:
            middle = (low + high) // 2
            if len(self.session.tokenizer.decode(tokens[:middle], skip_special_tokens=True)) >= characters:
                high = middle
            else:
                low = middle + 1
        return low

    def done(self, outcome: Outcome) -> None:
        self.job.send("done", outcome)
