"""The `sam` drafter (SAM-Decoding): continue the longest suffix match in the conversation or an index.

Two suffix automata are matched against the committed text: a dynamic one over this conversation (prompt
and generated tokens, extended as tokens are committed) and, optionally, a static one loaded from an
index file. For every committed token the match states advance first and the dynamic automaton is
extended second (extending first would make the text match itself, with nothing after it to draft).

Drafting (docs/methods.md, section 2): with match lengths `l_dynamic` and `l_static`, the static automaton
drafts only if `l_static - l_bias > l_dynamic` (ties go to the dynamic one); the automata draft only when
`max(l_dynamic, l_static - l_bias) >= l_threshold` (default 1: any match).

With an auxiliary drafter (`sam+aded`, `--aux recycle`, ...), which sees every event too, both draft every
step and their drafts become one tree (merge.py): each node ranked by the acceptance its source earned at its
depth (the automata's by match length too), so a long match leads, and where the match is short and the
target rarely follows it, the auxiliary's guesses come first; an auxiliary whose drafting costs time (a head) is
asked only while what it alone adds pays for that time (merge.py: measured as it runs). The tree
carries those estimates (`Draft.confidence`), and the planner keeps the prefix that pays. (Before 0.5.0 the
auxiliary drafted only where the automata had no match: docs/measurements.md, "sam's threshold, auxiliary and
memory bias".) The draft is the continuation of the match's earliest occurrence, stopped before an EOS and at the end
of the text, never padded, and `min(budget, draft_max, 1 + floor(ALPHA * match_len))` tokens long; no
match (or nothing after it), no draft.

With an answer memory (memory.py: every answer `specdec chat` committed for this target), the remembered
answers join the index in the static automaton, after its text; a static draft whose earliest occurrence lies
among them is reported as source "sam-memory".

A prefill whose prompt extends the text seen so far (a multi-turn chat re-sending the conversation) feeds
only the new tokens; any other prompt starts a new conversation. This module does not build or save
indexes (sam/, corpus.py) and never calls the engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from ..decoding.draft import NOTHING, Draft, Drafter, StepEvent
from ..errors import SpecdecError
from ..texts.memory import Memory
from .merge import DraftMerger
from .spec import DrafterOptions, DrafterSpec, draft_length
from .target import TargetInfo
from .token_ids import check_token_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..sam.automaton import DynamicAutomaton, StaticAutomaton

ALPHA = 4  # draft length grows by this many tokens per matched token (the paper's adaptive length)
# l_bias: the static match must beat the dynamic one by more than this (the paper's: 5); l_threshold: below this
# match length the auxiliary takes over (the paper's is 5; docs/measurements.md). Defaults: DrafterOptions'.
FREQUENT = False  # static drafts follow the most frequent continuation (docs/measurements.md)
SOURCE_DYNAMIC = "sam-dynamic"
SOURCE_STATIC = "sam-static"
SOURCE_MEMORY = "sam-memory"  # a static draft whose earliest occurrence lies in the answer memory


class SamDrafter:
    name = "sam"

    def __init__(
        self,
        static: Optional[StaticAutomaton] = None,
        *,
        separators: Iterable[int] = (),
        draft_max: Optional[int] = None,
        l_bias: int = DrafterOptions.l_bias,
        l_threshold: int = DrafterOptions.l_threshold,
        alpha: float = ALPHA,
        aux: Optional[Drafter] = None,
        memory_from: Optional[int] = None,
        frequent: bool = FREQUENT,
        vocab_size: int = 0,
    ) -> None:
        if draft_max is not None and draft_max < 1:
            raise SpecdecError(f"draft_max must be at least 1, got {draft_max}", setting="draft_max")
        self.static = static
        self.separators = frozenset(int(token) for token in separators)
        self.draft_max = draft_max  # None: as long as the engine's budget allows
        self.l_bias = l_bias
        self.l_threshold = l_threshold
        self.alpha = alpha
        self.aux = aux
        self.memory_from = memory_from  # static text positions from here on are remembered answers
        self.frequent = frequent  # static drafts: the continuation most occurrences take, not the earliest's
        self.vocab_size = vocab_size  # ids at or above it are refused (0: not known; negative ones always are)
        self.needs = NOTHING if aux is None else aux.needs  # the automata read tokens only; the auxiliary may not
        # what the automata's and the auxiliary's drafts earned, and whether the auxiliary pays for its time
        self.merger = DraftMerger()
        self._restart()

    def reset(self) -> None:
        """Forget the conversation, the auxiliary's too (the static index stays)."""
        self._restart()
        if self.aux is not None:
            self.aux.reset()

    def _restart(self) -> None:
        """Start the dynamic automaton over (its text diverged from the context, or a new conversation)."""
        from ..sam.automaton import ROOT, DynamicAutomaton

        self.dynamic = DynamicAutomaton(self.separators)
        self.dynamic_state, self.dynamic_len = ROOT, 0
        self.static_state, self.static_len = ROOT, 0

    # ------------------------------------------------------------------------------ following the text

    def _feed(self, tokens: Iterable[int]) -> None:
        tokens = [int(token) for token in tokens]
        check_token_ids(tokens, self.vocab_size)  # before any state changes
        dynamic, static = self.dynamic, self.static
        for token in tokens:
            token = int(token)
            self.dynamic_state, self.dynamic_len = dynamic.advance(self.dynamic_state, self.dynamic_len, token)
            if static is not None:
                self.static_state, self.static_len = static.advance(self.static_state, self.static_len, token)
            dynamic.extend(token)

    def _sync(self, tokens: Sequence[int]) -> None:
        """Make the drafter's text equal `tokens`: feed what is new, or start over if it diverged."""
        tokens = [int(token) for token in tokens]
        seen = self.dynamic.text
        if len(tokens) < len(seen) or tokens[: len(seen)] != seen:
            self._restart()
            seen = self.dynamic.text
        self._feed(tokens[len(seen) :])

    def observe(self, event: StepEvent) -> None:
        if self.aux is not None:
            self.aux.observe(event)
            self.merger.observe(event)
        if event.kind == "prefill":
            self._sync(event.prompt_tokens)
        self._feed(event.committed)

    # ------------------------------------------------------------------------------ drafting

    def _draft_length(self, match_len: int, budget: int) -> int:
        longest = budget if self.draft_max is None else min(budget, self.draft_max)
        return min(longest, 1 + int(self.alpha * match_len))

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if len(context) != len(self.dynamic.text):  # called without the events, or they were missed
            self._sync(context)
        own = self._own_draft(budget)
        if self.aux is None:
            return own
        if not self.merger.needs_aux(own, budget) or not self.merger.aux_pays():  # not kept, or not worth its time
            return self.merger.merge([own], budget)
        started = time.perf_counter()
        aux = self.aux.propose(context, budget)
        self.merger.timed_aux(time.perf_counter() - started)
        return self.merger.merge([own, aux], budget)

    def _own_draft(self, budget: int) -> Draft:
        """The automata's chain: the continuation of the longer match (the index's must win by l_bias)."""
        from ..sam.automaton import StaticAutomaton

        l_dynamic, l_static = self.dynamic_len, self.static_len  # static_len stays 0 without an index
        if max(l_dynamic, l_static - self.l_bias) < self.l_threshold:
            return Draft.empty(SOURCE_DYNAMIC)
        automaton: "StaticAutomaton | DynamicAutomaton"
        if self.static is not None and l_static - self.l_bias > l_dynamic:
            source, automaton, state, match_len = SOURCE_STATIC, self.static, self.static_state, l_static
            if self.memory_from is not None and int(self.static.min_endpos[state]) >= self.memory_from:
                source = SOURCE_MEMORY
        else:
            source, automaton, state, match_len = SOURCE_DYNAMIC, self.dynamic, self.dynamic_state, l_dynamic
        if match_len == 0 or budget <= 0:
            return Draft.empty(source)
        length = self._draft_length(match_len, budget)
        if self.frequent and isinstance(automaton, StaticAutomaton):
            tokens = automaton.frequent_continuation(state, length)
        else:
            tokens = automaton.continuation(state, length)
        return Draft(tokens=tokens, source=source, match_len=match_len)


def load_index_for_target(path: str, target: TargetInfo):
    """Load an index and refuse it unless it fits the target's tokenizer (fingerprint, EOS id, vocabulary)."""
    from ..sam.index import load_index

    index = load_index(path)
    if target.fingerprint and index.fingerprint != target.fingerprint:
        raise SpecdecError(
            f"{path}: index built for tokenizer {index.fingerprint}, but the target's tokenizer "
            f"is {target.fingerprint}; rebuild it with `specdec build-index ... --target <this model>`"
        )
    if target.eos_token_ids and index.eos_id not in target.eos_token_ids:
        raise SpecdecError(
            f"{path}: index separates documents with EOS id {index.eos_id}, but the target's EOS "
            f"ids are {list(target.eos_token_ids)}; rebuild it for this model"
        )
    if target.vocab_size and index.vocab_size > target.vocab_size:
        raise SpecdecError(
            f"{path}: index vocabulary has {index.vocab_size} tokens, the target only "
            f"{target.vocab_size}; rebuild it for this model"
        )
    return index


def make_sam_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None,
                     make_aux: Callable[[], Optional[Drafter]] = lambda: None) -> SamDrafter:
    """The `sam` drafter for `make_drafter`: the index in `options.index` (if any) is loaded and checked
    against the target's tokenizer fingerprint, EOS ids and vocabulary size; the answer memory in
    `options.memory` (if any) joins it in one static automaton (memory.py); `make_aux` builds the auxiliary
    drafter `options.aux` names (None: the automata alone)."""
    separators = set(target.eos_token_ids)
    static = None
    index_text = None
    if options.index:
        index = load_index_for_target(options.index, target)
        static = index.automaton
        index_text = static.text
        separators.add(index.eos_id)
        static.separators = frozenset(separators)
    memory_from = None
    if options.memory:
        static, memory_from = _with_memory(options.memory, target, index_text, separators, static)
    return SamDrafter(
        static,
        separators=separators,
        draft_max=draft_length(draft_max),
        l_bias=options.l_bias,
        l_threshold=options.l_threshold,
        aux=make_aux(),
        memory_from=memory_from,
        vocab_size=target.vocab_size,
    )


def _with_memory(directory: str, target: TargetInfo, index_text, separators: set, static):
    """(the static automaton over the index's text and then every remembered answer, the text position where
    the memory begins), or the index alone (and None) when the memory is empty."""
    import warnings

    import numpy as np

    from ..sam.automaton import build_static

    recalled = Memory(directory, target.fingerprint).recall()
    warning = recalled.warning()
    if warning:
        warnings.warn(warning, stacklevel=3)
    if not recalled.answers:
        return static, None
    separator = min(target.eos_token_ids) if target.eos_token_ids else 0
    parts = [] if index_text is None else [np.asarray(index_text, dtype=np.int32)]
    start = 0 if index_text is None else len(index_text)
    for answer in recalled.answers:
        parts.append(np.asarray([*answer, separator], dtype=np.int32))
    text = np.concatenate(parts)
    return build_static(text, max(int(text.max()) + 1, target.vocab_size or 0), separators), start


def check_index(options: DrafterOptions) -> None:
    """A missing, foreign or truncated index fails here, in a millisecond (sam's and aded's check)."""
    if options.index:
        from ..sam.index import read_index_info

        read_index_info(options.index)


def check_sam(options: DrafterOptions) -> None:
    check_index(options)
    if options.memory and not Path(options.memory).expanduser().is_dir():
        raise SpecdecError(f"memory {options.memory}: no such directory (`specdec memory info` shows where the "
                           "memory lives)", setting="memory")


SPEC = DrafterSpec(name="sam", help="suffix automata over the conversation and an optional static index (SAM-Decoding)",
                   build=make_sam_drafter, options=("index", "l_bias", "l_threshold", "aux", "memory"),
                   check=check_sam, takes_aux=True)
