"""specdec's drafters as vLLM speculative proposers (vLLM's experimental `custom_class` method).

vLLM (0.32) builds the class with its `VllmConfig`, calls `load_model(model)` once, then, every engine step,
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`: one row per running
request, in batch order, with `token_ids_cpu[row, :num_tokens_no_spec[row]]` the request's tokens (prompt and
output, the newest included). It returns one draft (a list of at most `num_speculative_tokens` ids; empty =
no drafting) per row. vLLM verifies the drafts itself, so what is drafted changes speed, never output.

vLLM hands over batch rows, not request ids, and a request moves between rows as others finish. So
`RequestTracker` keeps one specdec drafter per live sequence and finds it again by its tokens: a sequence is
filed under its length and a hash of its last tokens, and a row takes the filed drafter its tokens extend by
at most one step's growth (preferring the row it held before), or a new one. A drafter not used for
`IDLE_STEPS` steps (its request finished) is dropped, and at most `MAX_SEQUENCES` are kept (the least recently
used go first). Specdec's drafters check their own text against the context they are given and start over
where it differs, so a wrong pairing costs speed only.

A row whose tokens are not all ids of the vocabulary (negative, e.g. a placeholder, or too large) gets no draft
and is not filed: vLLM cannot be told of an error from here, and a drafter must never hang its engine.

Settings reach the class through the environment (vLLM passes only its own config, and its engine runs in a
child process that inherits the environment): `SPECDEC_VLLM_DRAFTER` holds a JSON object,
`{"drafter": "sam", "index": "FILE", "memory": "DIR", "min_match": 3}` (`specdec serve` writes it; all keys
optional; proposer_settings.py writes and reads it). vLLM verifies every drafted token (specdec's own engine
trims drafts by their expected payoff), so only continuations of matches of at least `min_match` tokens are
drafted. The drafters: `sam` (the per-request suffix automaton, a static `--index`, the answer memory read-only),
`sam+pld`, `sam+none` and `pld`; chains only (vLLM verifies chains). The classes to name in
`speculative_config={"method": "custom_class", "model": ...}` are `specdec_cli.vllm.proposer.SamProposer` and
`specdec_cli.vllm.proposer.PldProposer`.

This module does not import vLLM; it needs only numpy and specdec's drafters (torch for an index's checks).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..decoding.draft import Drafter
from ..drafters import TargetInfo, make_drafter
from ..drafters.token_ids import valid_token_ids
from ..texts.fingerprint import tokenizer_fingerprint
from .proposer_settings import PROPOSER_CLASSES, ProposerSettings

TAIL_TOKENS = 16  # a sequence is filed under a hash of its last tokens (and its length)
IDLE_STEPS = 64  # a drafter unused for this many steps belongs to a finished request
MAX_SEQUENCES = 4096  # at most this many drafters are kept


@dataclass
class _Sequence:
    drafter: Drafter
    filed: tuple[int, bytes] = (0, b"")  # (length, hash of the last TAIL_TOKENS tokens) when last seen
    row: int = -1  # the batch row it was last seen in
    last_step: int = 0


@dataclass
class TrackerStats:
    """Counters for tests and measurements: how rows were paired with drafters, and drafting time."""

    steps: int = 0
    rows: int = 0
    reused: int = 0
    created: int = 0
    evicted: int = 0
    draft_seconds: float = 0.0
    per_step_seconds: list[float] = field(default_factory=list)


def _tail(tokens: np.ndarray, length: int) -> tuple[int, bytes]:
    """A sequence's filing key at `length` tokens: the length and a hash of the tokens just before it."""
    tail = np.ascontiguousarray(tokens[max(0, length - TAIL_TOKENS) : length], dtype=np.int64)
    return length, hashlib.blake2b(tail.tobytes(), digest_size=16).digest()


class RequestTracker:
    """One drafter per live sequence, found again by the sequence's tokens (see the module docstring).

    A sequence is filed under its length and the hash of its last tokens when it was last drafted for. Between
    two steps a request grows by at most `max_growth` tokens (accepted drafts and one more), so a row holding
    `n` tokens is looked up under lengths n, n-1, ..., n - max_growth: first in the row it held last step (the
    usual case), then anywhere. Identical sequences (one prompt sent twice) get a drafter each."""

    def __init__(self, new_drafter: Callable[[], Drafter], max_growth: int, max_sequences: int = MAX_SEQUENCES,
                 idle_steps: int = IDLE_STEPS):
        self.new_drafter = new_drafter
        self.max_growth = max_growth
        self.max_sequences = max_sequences
        self.idle_steps = idle_steps
        self.sequences: "OrderedDict[int, _Sequence]" = OrderedDict()  # least recently used first
        self.filed: dict[tuple[int, bytes], list[int]] = {}
        self.step = 0
        self._next_id = 0
        self.stats = TrackerStats()

    def __len__(self) -> int:
        return len(self.sequences)

    def begin_step(self) -> set[int]:
        """Start an engine step: drop the drafters of finished requests; return the (empty) set of ids taken."""
        self.step += 1
        self.stats.steps += 1
        for seq_id in [seq_id for seq_id, seq in self.sequences.items()
                       if self.step - seq.last_step > self.idle_steps]:
            self._drop(seq_id)
        return set()

    def find(self, row: int, tokens: np.ndarray, taken: set[int]) -> _Sequence:
        """The drafter for batch row `row` holding `tokens` (its whole sequence); filed again at its new length."""
        self.stats.rows += 1
        found: Optional[int] = None
        for length in range(len(tokens), max(0, len(tokens) - self.max_growth) - 1, -1):
            candidates = [seq_id for seq_id in self.filed.get(_tail(tokens, length), ()) if seq_id not in taken]
            if candidates:
                same_row = [seq_id for seq_id in candidates if self.sequences[seq_id].row == row]
                found = (same_row or candidates)[0]
                break
        if found is None:
            found = self._next_id
            self._next_id += 1
            self.sequences[found] = _Sequence(self.new_drafter())
            self.stats.created += 1
            while len(self.sequences) > self.max_sequences:
                self._drop(next(iter(self.sequences)))
        else:
            self.stats.reused += 1
            self._unfile(found)
        seq = self.sequences[found]
        self.sequences.move_to_end(found)
        taken.add(found)
        seq.row, seq.last_step, seq.filed = row, self.step, _tail(tokens, len(tokens))
        self.filed.setdefault(seq.filed, []).append(found)
        return seq

    def _unfile(self, seq_id: int) -> None:
        key = self.sequences[seq_id].filed
        ids = self.filed.get(key, [])
        if seq_id in ids:
            ids.remove(seq_id)
        if not ids:
            self.filed.pop(key, None)

    def _drop(self, seq_id: int) -> None:
        self._unfile(seq_id)
        del self.sequences[seq_id]
        self.stats.evicted += 1


class SpecdecProposer:
    """The vLLM `custom_class` proposer over one of specdec's drafters (subclasses pick the default drafter)."""

    default_drafter = "sam"

    def __init__(self, vllm_config: Any = None, settings: Optional[ProposerSettings] = None,
                 target: Optional[TargetInfo] = None, num_speculative_tokens: Optional[int] = None):
        self.settings = settings or ProposerSettings.from_environment(self.default_drafter)
        self.settings.check()
        spec = getattr(vllm_config, "speculative_config", None)
        self.draft_max = int(num_speculative_tokens or getattr(spec, "num_speculative_tokens", 0)
                             or self.settings.draft_length)
        model_config = getattr(vllm_config, "model_config", None)
        self.max_model_len = int(getattr(model_config, "max_model_len", 0) or 0)
        self.target = target or _target_info(model_config, self.settings)
        options = replace(self.settings.drafter.options, aux="none")
        name = str(self.settings.drafter.name)
        if options.index or options.memory:  # load and check them once; drafters share the automaton
            make_drafter(name, options, self.target, self.draft_max)
        self.tracker = RequestTracker(lambda: make_drafter(name, options, self.target, self.draft_max),
                                      max_growth=self.draft_max + 1)

    def load_model(self, model: Any) -> None:
        """vLLM hands over the target model; retrieval drafters need nothing from it."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        started = time.perf_counter()
        taken = self.tracker.begin_step()
        drafts: list[list[int]] = []
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            budget = min(self.draft_max, self.max_model_len - length - 1) if self.max_model_len else self.draft_max
            if not len(sampled) or budget <= 0:  # vLLM skips drafting for this row (e.g. a prefill chunk)
                drafts.append([])
                continue
            tokens = token_ids_cpu[row, :length]  # [length]: the request's tokens, the newest included
            if not 0 < length <= len(tokens) or not valid_token_ids(tokens, self.target.vocab_size):
                drafts.append([])  # ids no tokenizer makes (vLLM's -1 placeholders...): no draft, nothing learned
                continue
            seq = self.tracker.find(row, tokens, taken)
            draft = seq.drafter.propose(tokens.tolist(), budget)
            useful = draft.is_chain and (draft.match_len >= self.settings.min_match or not draft.match_len)
            drafts.append(list(draft.tokens[:budget]) if useful else [])
        elapsed = time.perf_counter() - started
        self.tracker.stats.draft_seconds += elapsed
        if len(self.tracker.stats.per_step_seconds) < 100_000:
            self.tracker.stats.per_step_seconds.append(elapsed)
        return drafts


class SamProposer(SpecdecProposer):
    """`sam`: suffix automata over each request (and a static index, the answer memory read-only)."""

    default_drafter = "sam"


class PldProposer(SpecdecProposer):
    """`pld`: prompt lookup over each request's own tokens."""

    default_drafter = "pld"


PROPOSERS = {drafter: {"SamProposer": SamProposer, "PldProposer": PldProposer}[name]
             for drafter, name in PROPOSER_CLASSES.items()}


def _target_info(model_config: Any, settings: ProposerSettings) -> TargetInfo:
    """What drafters may know of the target, from vLLM's model config (the tokenizer only for an index's checks)."""
    vocab = int(model_config.get_vocab_size()) if model_config is not None else 0
    eos: tuple[int, ...] = ()
    fingerprint = ""
    if model_config is not None and (settings.drafter.options.index or settings.drafter.options.memory):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        fingerprint = tokenizer_fingerprint(tokenizer)
        eos = (int(tokenizer.eos_token_id),) if tokenizer.eos_token_id is not None else ()
        vocab = max(vocab, len(tokenizer))
    return TargetInfo(vocab_size=vocab, eos_token_ids=eos, fingerprint=fingerprint)
