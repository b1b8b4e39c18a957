"""Constrained decoding: every answer token keeps a grammar (a JSON schema, a Lark grammar, or llama.cpp's GBNF).

Through llguidance (Microsoft's grammar engine: a token mask for a 150 k vocabulary in tens of microseconds, and
a matcher that validates and rolls back token lists, which speculation needs). Plain constrained decoding takes,
at every step, the target's best token among those the grammar allows. The engine keeps that exactly with drafts:
a draft is cut at its first token the grammar forbids (before verification: a forbidden token could never be
accepted), each verified row's logits are masked by the grammar's state after the draft's tokens before it, so
the target's choice at every row is plain constrained decoding's, and the matcher advances by the committed
tokens only. Where the grammar forces what comes next (a schema's keys and punctuation) and the drafter proposes
something else or nothing, the forced tokens are the draft (source "grammar"). When the grammar is complete only
the end-of-answer token is allowed.

`GrammarSpec` is plain data (a request's or a command's grammar, checked once); `Constraint` is one answer's
matcher. llguidance is imported when a grammar is used, never by the CLI's start. This file does not decide
anything about drafting or acceptance (engine.py does); it only says which tokens the grammar allows.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

import torch

from ..errors import SpecdecError

GrammarKind = Literal["json_schema", "lark", "gbnf"]
GRAMMAR_SOURCE = "grammar"  # a draft of the tokens the grammar forces
_TOKENIZERS: dict[int, tuple[Any, Any]] = {}  # id(tokenizer) -> (tokenizer, its llguidance tokenizer)
_TOKENIZERS_LOCK = threading.Lock()


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    text: str  # the schema as JSON text, or the grammar's source

    @staticmethod
    def json_schema(schema: Any) -> "GrammarSpec":
        return GrammarSpec("json_schema", json.dumps(schema))

    def compiled(self) -> str:
        """llguidance's grammar for this spec (a SpecdecError naming `grammar` when it cannot be read); compiled
        once per spec (a request's check and its answer share it)."""
        return _compiled(self.kind, self.text)


@functools.lru_cache(maxsize=64)
def _compiled(kind: GrammarKind, text: str) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        if kind == "json_schema":
            # compact: `{"a":1,"b":[2,3]}`, no runs of whitespace for a model to wander into
            grammar = LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
        elif kind == "gbnf":
            grammar = LLMatcher.grammar_from_lark(gbnf_to_lark(text))
        else:
            grammar = LLMatcher.grammar_from_lark(text)
    except Exception as error:  # the compilers raise on schemas and grammars they cannot read
        raise SpecdecError(f"grammar: {_first_line(error)}", setting="grammar") from None
    problem = LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise SpecdecError(f"grammar: {problem.splitlines()[0]}", setting="grammar")
    return grammar


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def prepare(tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
    """Build llguidance's view of `tokenizer` now (a server does, in the background, so that its first grammar
    request does not wait the second it takes)."""
    _ll_tokenizer(tokenizer, eos_token_ids)


def _ll_tokenizer(tokenizer: Any, eos_token_ids: Sequence[int]) -> Any:
    """llguidance's view of `tokenizer` (built once per tokenizer: about a second for a 150 k vocabulary)."""
    import llguidance.hf

    key = id(tokenizer)
    with _TOKENIZERS_LOCK:  # one build, whoever asks first
        held = _TOKENIZERS.get(key)
        if held is None or held[0] is not tokenizer:
            eos = [int(token) for token in eos_token_ids] or None
            try:
                built = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
            except Exception:  # a tokenizer the engine cannot read whole: from each token's own text instead
                built = _from_token_texts(tokenizer, eos)
            held = _TOKENIZERS[key] = (tokenizer, built)
    return held[1]


class _TokenTexts:
    """A tokenizer as llguidance's TokenizerWrapper reads one: each id's bytes (its text decoded alone; special
    tokens marked with a leading 0xFF, llguidance's convention), its ids, and encoding."""

    def __init__(self, tokenizer: Any) -> None:
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.special_token_ids = sorted(specials)
        self.tokens = [b"\xff" + tokenizer.convert_ids_to_tokens(index).encode() if index in specials
                       else tokenizer.decode([index]).encode() for index in range(len(tokenizer))]

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _from_token_texts(tokenizer: Any, eos: Any) -> Any:
    import llguidance

    try:
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTexts(tokenizer)), eos_token=eos)
    except Exception as error:
        raise SpecdecError(f"grammar: the grammar engine cannot read this tokenizer ({_first_line(error)})",
                           setting="grammar") from None


class Constraint:
    """One answer's grammar state: what it allows next, after a draft's tokens, and what was committed."""

    def __init__(self, spec: GrammarSpec, tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        from llguidance import LLMatcher

        if tokenizer is None:
            raise SpecdecError("a grammar needs the target's tokenizer", setting="grammar")
        self.matcher = LLMatcher(_ll_tokenizer(tokenizer, eos_token_ids), spec.compiled())
        if self.matcher.is_error():
            raise SpecdecError(f"grammar: {self.matcher.get_error()}", setting="grammar")

    def allowed(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order from the current state, the grammar allows."""
        return int(self.matcher.validate_tokens([int(token) for token in tokens])) if tokens else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (`{"name": "` after `{` in a schema), as the tokenizer writes
        them: a draft that costs nothing to make (verification still decides)."""
        return [int(token) for token in self.matcher.compute_ff_tokens()]

    def masks(self, tokens: Sequence[int], vocab: int) -> torch.Tensor:
        """[len(tokens) + 1, vocab] bool: what the grammar allows now and after each of `tokens` (which it must
        allow: `allowed`), the state left as it was."""
        return torch.stack([self._mask(vocab) for _ in self._states_along(tokens)])

    def greedy_choices(self, logits: torch.Tensor, tokens: Sequence[int], best: Sequence[int]) -> list[int]:
        """Each row's best token the grammar allows, rows [len(tokens) + 1, vocab] scored after the draft `tokens`
        (which it allows) whose own best are `best`: where a row's best is allowed (nearly always, once a model
        follows the format) it stands, checked in microseconds; elsewhere the row's whole mask decides. The state
        is left as it was."""
        choices = []
        for index in self._states_along(tokens):
            if self.matcher.validate_tokens([int(best[index])]) == 1:
                choices.append(int(best[index]))
            else:
                allowed = self._mask(logits.shape[-1]).to(logits.device)
                choices.append(int(logits[index].masked_fill(~allowed, float("-inf")).argmax()))
        return choices

    def _states_along(self, tokens: Sequence[int]) -> Iterator[int]:
        """Yields 0..len(tokens) with the matcher in the state after tokens[:index] (past the grammar's end only
        EOS can follow, so nothing more is consumed); rolled back to where it was once done."""
        consumed = 0
        try:
            for index in range(len(tokens) + 1):
                yield index
                if index < len(tokens) and not self.matcher.is_stopped():
                    if not self.matcher.consume_token(int(tokens[index])):
                        raise SpecdecError(f"grammar: {self.matcher.get_error()}")  # (`allowed` said it may)
                    consumed += 1
        finally:
            if consumed and not self.matcher.rollback(consumed):
                raise SpecdecError(f"grammar: {self.matcher.get_error()}")

    def _mask(self, vocab: int) -> torch.Tensor:
        allowed = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8) > 0  # [words]
        mask = torch.zeros(vocab, dtype=torch.bool)
        width = min(vocab, allowed.shape[0])
        mask[:width] = allowed[:width]
        return mask

    def commit(self, tokens: Sequence[int]) -> None:
        """The answer's new tokens (each one the masks allowed)."""
        for token in tokens:
            if self.matcher.is_stopped():  # the grammar is complete: what follows is the end-of-answer token
                return
            if not self.matcher.consume_token(int(token)):
                raise SpecdecError(f"grammar: {self.matcher.get_error()}")
