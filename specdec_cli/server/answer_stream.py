"""What a request is sent of its answer as it grows: the text (stop strings cut, text_stream.py), and where the
request offers tools, the content before the model's tool calls and each call as it completes
(texts/tool_calls.py). The pieces sent, joined, are the whole response's content, and the calls its tool_calls:
a whole response is this stream run to its end.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..texts.text_stream import TextStream
from ..texts.tool_calls import ToolCall, ToolCallReader


class AnswerStream:
    def __init__(self, tokenizer: Any, stop: Sequence[str], reader: Optional[ToolCallReader] = None):
        self.text = TextStream(tokenizer, stop)
        self.reader = reader
        self.content = ""  # the content sent so far

    @property
    def calls(self) -> list[ToolCall]:
        return self.reader.calls if self.reader is not None else []

    def add(self, tokens: Sequence[int]) -> tuple[str, list[ToolCall]]:
        """Newly committed tokens: the content and the calls that may be sent now."""
        return self._shown(self.text.add(tokens), final=False)

    def finish(self, final_text: str) -> tuple[str, list[ToolCall]]:
        """The answer's whole text (the session's decoding): what is left to send."""
        return self._shown(self.text.finish(final_text), final=True)

    def _shown(self, piece: str, final: bool) -> tuple[str, list[ToolCall]]:
        if self.reader is None:
            self.content += piece
            return piece, []
        calls = self.reader.add(piece)
        if final:
            calls += self.reader.finish()
        content = self.reader.content(final)
        if len(content) <= len(self.content) or not content.startswith(self.content):
            return "", calls
        new, self.content = content[len(self.content):], content
        return new, calls
