"""Training prompts the target writes itself (Magpie, Xu et al. 2024): its chat template's user turn is opened and
left to it, and what it writes until the turn ends is a prompt from its own users' distribution.

A draft learns the target's answers best from prompts like those its users send; a few hundred hand-made ones are
too few, and out-of-domain text teaches the wrong distribution (docs/measurements.md). An aligned chat model asked
to continue "<|im_start|>user\\n" writes a user's question, in the domain it was aligned on (a coder model writes
coding questions). `user_turn_prefix` finds those opening tokens in the model's own template: the template is
rendered with a marker as the user's text and cut before it, so a system message the template adds by default
stays, as the model saw it in training. `write_prompts` samples turns (temperature 1 and top-p 0.95 by default;
the seed of attempt i is seed + i, so a run repeats): on block weights `ROUND` at a time, one forward a token for
all (plain_many.py: each turn what plain sampling with its seed writes), elsewhere one at a time drafted by prompt
lookup. With `openers` (`--opener`), attempt i's turn begins with opener i mod their number, written into the
user's turn before the model goes on: a coder model asked to continue "Translate" or "Summarize" writes such tasks,
where left to itself it writes coding questions; the opener is part of the prompt kept. It keeps the turns that
ended (the model's end of turn, not the length limit), that are 16 to 4,000 characters long, and that are new
(lower-cased, whitespace collapsed) against the file's rows and the built-in suite, which must stay held out; and
appends each kept one as a JSONL row `{"prompt", "category": "self", "id", "attempt", "target", "fingerprint"}`
(and "opener") that `specdec distill --prompts FILE` reads. A rerun resumes after the last attempt recorded. A file
that is not this command's output for this target is refused, untouched.

Not here: answering the prompts (generate.py), choosing among them (texts/prompts.py), any sampling rule (the
engine's).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..decoding.generation_config import GenerationConfig
from ..errors import SpecdecError
from ..files import check_output_file, lock_output
from ..texts.chat_template import render_template
from ..texts.data_rows import read_text
from ..texts.fingerprint import tokenizer_fingerprint
from ..texts.prompts import load_builtin
from .generate import append_row_json, repair_tail

CATEGORY = "self"
MARKER = "\u2063specdec-user-turn\u2063"  # invisible separators around a word no template writes
MIN_CHARS, MAX_CHARS = 16, 4000
MAX_OPENER_CHARS = 200
ATTEMPTS_PER_PROMPT = 20  # `distill prompts` gives up after this many sampled turns per prompt asked for
SELF_PROMPT_TOKENS = 256  # the longest prompt the target writes itself (`distill prompts -n`'s default)
ROUND = 64  # turns sampled per call on block weights, 16 open at once (decoding/plain_many.py; defaults.py)
ROUND_WIDTH = 16


def user_turn_prefix(tokenizer: Any) -> list[int]:
    """The token ids that open a user turn in the model's chat template (and what the template puts before it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdecError("this model's tokenizer has no chat template: it has no user turn to open")
    text = render_template(tokenizer, [{"role": "user", "content": MARKER}])
    if MARKER not in text:
        raise SpecdecError("the chat template does not show the user's text as given; cannot open a user turn")
    return list(tokenizer(text[: text.index(MARKER)], add_special_tokens=False)["input_ids"])


def check_openers(openers: Sequence[str]) -> tuple[str, ...]:
    """The `--opener` texts, each a turn's first words: not blank, at most MAX_OPENER_CHARS."""
    for opener in openers:
        if not opener.strip() or len(opener) > MAX_OPENER_CHARS:
            raise SpecdecError(f"--opener must be 1 to {MAX_OPENER_CHARS} characters of text, got {opener!r}",
                               setting="opener")
    return tuple(openers)


def normalized(text: str) -> str:
    """What two prompts share when they are the same prompt: lower case, whitespace collapsed."""
    return re.sub(r"\s+", " ", text).strip().lower()


@dataclass
class PromptsProgress:
    kept: int  # prompts in the file
    wanted: int
    attempts: int  # turns sampled in this run
    seconds: float


def check_prompts_output(out_path: str, fingerprint: Optional[str] = None) -> tuple[Path, list[dict]]:
    """The -o of `distill prompts`: a new or empty file, or this command's rows (with `fingerprint`: for this
    target's tokenizer), to resume."""
    file = check_output_file(out_path, "output", own_rule=True)
    if not file.exists() or (file.is_file() and file.stat().st_size == 0):
        return file, []
    rows = []
    try:
        if not file.is_file():
            raise ValueError("not a regular file")
        for number, line in enumerate(read_text(file).splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or row.get("category") != CATEGORY or "attempt" not in row:
                raise ValueError(f"line {number} is not one of its rows")
            if fingerprint is not None and row.get("fingerprint") != fingerprint:
                raise ValueError(f"line {number} was written for another tokenizer")
            rows.append(row)
    except (ValueError, SpecdecError) as error:
        raise SpecdecError(f"output {out_path}: not a prompts file of `specdec distill prompts` for this target, so "
                           f"it is left untouched ({error}); choose another -o", setting="output") from None
    return file, rows


def write_prompts(engine: Any, tokenizer: Any, target_spec: str, out_path: str, *, count: int,
                  config: GenerationConfig, on_progress: Optional[Callable[[PromptsProgress], None]] = None,
                  max_attempts: Optional[int] = None, openers: Sequence[str] = ()) -> PromptsProgress:
    """Sample user turns until the file holds `count` kept prompts (or `max_attempts` turns were sampled); attempt
    i's turn begins with openers[i mod their number] when there are openers."""
    from ..decoding import plain_many as batched
    from ..drafters import DrafterOptions, make_drafter, target_info
    from ..target_model.verify.forward import ManyForward

    fingerprint = tokenizer_fingerprint(tokenizer)
    file, rows = check_prompts_output(out_path, fingerprint)
    lock = lock_output(file)  # two runs would write every prompt twice
    try:
        repair_tail(file)
        seen = {normalized(row["prompt"]) for row in rows}
        seen |= {normalized(turn) for prompt in load_builtin() for turn in prompt.turns}  # held out
        attempt = 1 + max((int(row["attempt"]) for row in rows), default=-1)
        prefix = user_turn_prefix(tokenizer)
        opener_ids = [list(tokenizer(opener, add_special_tokens=False)["input_ids"])
                      for opener in check_openers(openers)]

        def opened(number: int) -> list[int]:  # what attempt `number` is given of its turn
            return opener_ids[number % len(opener_ids)] if opener_ids else []

        info = target_info(engine.model, tokenizer)
        drafter = make_drafter("pld", DrafterOptions(), info)
        config = replace(config, eos_token_ids=tuple(info.eos_token_ids))  # the end of the user's turn
        kept, tried, started = len(rows), 0, time.perf_counter()
        many = isinstance(engine.forward, ManyForward)  # block weights: a round of turns a forward
        while kept < count and (max_attempts is None or tried < max_attempts):
            size = ROUND if many else 1
            if max_attempts is not None:
                size = min(size, max_attempts - tried)
            attempts = list(range(attempt, attempt + size))
            seeds = None if config.seed is None else [config.seed + number for number in attempts]
            if many:  # plain sampling of each turn with its own seed, as the engine samples it alone
                answers = sorted(batched.plain_many(engine.forward, [prefix + opened(n) for n in attempts], config,
                                                    width=min(size, ROUND_WIDTH), seeds=seeds),
                                 key=lambda answer: answer.index)
                turns = [(answer.tokens, answer.finish_reason) for answer in answers]
            else:  # one turn, drafted by prompt lookup (the same law)
                seed = None if seeds is None else seeds[0]
                generation = engine.generate(prefix + opened(attempts[0]), drafter, _with_seed(config, seed))
                turns = [(generation.tokens, generation.finish_reason)]
            for number, (tokens, finish_reason) in zip(attempts, turns):
                text = tokenizer.decode(opened(number) + list(tokens), skip_special_tokens=True).strip()
                key = normalized(text)
                if kept < count and finish_reason == "eos" and MIN_CHARS <= len(text) <= MAX_CHARS and \
                        key not in seen:
                    seen.add(key)
                    row = {"prompt": text, "category": CATEGORY, "id": f"self-{number}", "attempt": number,
                           "target": target_spec, "fingerprint": fingerprint}
                    if opener_ids:
                        row["opener"] = openers[number % len(openers)]
                    append_row_json(file, row)
                    kept += 1
            attempt, tried = attempt + size, tried + size
            if on_progress is not None:
                on_progress(PromptsProgress(kept, count, tried, time.perf_counter() - started))
        return PromptsProgress(kept, count, tried, time.perf_counter() - started)
    finally:
        lock.close()


def _with_seed(config: GenerationConfig, seed: Optional[int]) -> GenerationConfig:
    return replace(config, seed=seed)
