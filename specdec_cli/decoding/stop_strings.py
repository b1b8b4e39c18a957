"""Stop strings: where the first one begins in an answer's text, found without decoding the whole answer at every
step. The engine (engine.py) cuts the answer there; this file only finds it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

STOP_MARGIN = 16  # characters of earlier text decoded beyond the longest stop string (split characters, spaces)


def find_stop(tokenizer: Any, before: list[int], committed: list[int],
              stops: Sequence[str]) -> tuple[int, Optional[int]]:
    """Where the first stop string begins in the decoded output, and how many committed tokens reach it.

    A step decodes only a tail window: the committed tokens after enough of the earlier ones to hold any stop
    string that began before them (and a margin for characters split across tokens). Only when a stop string
    shows there is the whole output decoded, once, to place it exactly."""
    if not _stop_in_tail(tokenizer, before, committed, stops):
        return len(committed), None
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    text = decode(before + committed)
    hits = [text.find(stop) for stop in stops if stop and stop in text]
    if not hits:
        return len(committed), None
    cut = min(hits)
    for keep in range(len(committed) + 1):  # the shortest prefix whose text reaches past the stop's start
        if len(decode(before + committed[:keep])) > cut:
            return keep, cut
    return len(committed), cut

def _stop_in_tail(tokenizer: Any, before: list[int], committed: list[int], stops: Sequence[str]) -> bool:
    """Whether a stop string shows in the text of the committed tokens after a tail of the earlier ones that
    decodes to at least the longest stop string plus STOP_MARGIN characters (or all of them)."""
    wanted = max(len(stop) for stop in stops) + STOP_MARGIN
    count = min(len(before), wanted)  # tokens of the tail; most decode to a character or more
    while count < len(before) and len(tokenizer.decode(before[-count:], skip_special_tokens=True)) < wanted:
        count = min(len(before), 2 * count)
    tail = before[len(before) - count :]
    text = tokenizer.decode(tail + committed, skip_special_tokens=True)
    return any(stop and stop in text for stop in stops)
