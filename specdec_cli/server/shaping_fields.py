"""The request fields that shape the target's logits before any choice: `logit_bias`, the penalties as OpenAI,
vLLM and llama-server name and count them, and llama-server's DRY; read and checked (a 400 naming the field), for
the generation settings (decoding/run.py `Run.shaped` applies them). requests.py reads the rest of a body.
"""

from __future__ import annotations

from typing import Any, Optional

from ..decoding.dry import DEFAULT_BREAKERS, DryPenalty
from .api_errors import ApiError
from .body_fields import integer, is_int, number

# the penalties, as OpenAI and vLLM count them (presence and frequency the answer's tokens, vLLM's repetition_penalty
# the prompt's too) or, once llama-server's repeat_penalty or repeat_last_n is sent (its /completion always),
# llama.cpp's way: all three over the last repeat_last_n tokens (decoding/penalties.py)
PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty")
LLAMA_LAST_N = 64  # llama-server's repeat_last_n when a request leaves it out
DRY_FIELDS = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers")


def shaping(body: dict) -> dict:
    """The shaping fields of a body, named as CompletionRequest's."""
    return {"logit_bias": _logit_bias(body.get("logit_bias")), **_penalties(body), "dry": _dry(body)}


def _penalties(body: dict) -> dict:
    """The penalties a body sets: OpenAI's presence and frequency penalties and vLLM's `repetition_penalty`, or
    llama-server's `repeat_penalty` over a window of `repeat_last_n` tokens (64 when left out; -1: all, 0: off),
    which then counts presence and frequency too. A 400 for a bad value or for both repetition penalties."""
    read = {name: number(body, name) for name in ("presence_penalty", "frequency_penalty")}
    repetition, repeat = number(body, "repetition_penalty"), number(body, "repeat_penalty")
    last_n = integer(body, "repeat_last_n")
    for name, value in (("repetition_penalty", repetition), ("repeat_penalty", repeat)):
        if value is not None and not value > 0:
            raise ApiError(400, f"'{name}' must be a number > 0 (1 = off), got {value}", param=name)
    if last_n is not None and last_n < -1:
        raise ApiError(400, f"'repeat_last_n' must be >= -1 (-1: the whole context, 0: no penalties), got {last_n}",
                       param="repeat_last_n")
    if repeat is None and last_n is None:
        return {**read, "repetition_penalty": repetition}
    if repetition is not None and repetition != 1:
        raise ApiError(400, "'repetition_penalty' (vLLM's: every token of the prompt and answer) cannot be combined "
                       "with llama-server's 'repeat_penalty' and 'repeat_last_n' (a window of tokens): send one",
                       param="repetition_penalty")
    return {**read, "repetition_penalty": repeat, "penalty_last_n": LLAMA_LAST_N if last_n is None else last_n}


def _dry(body: dict) -> Optional[DryPenalty]:
    """llama-server's DRY fields as one setting (None while `dry_multiplier` is left out or 0); ranges are checked
    with the generation settings (400 naming the field)."""
    multiplier = number(body, "dry_multiplier")
    if not multiplier:
        return None
    breakers = body.get("dry_sequence_breakers")
    breakers = list(DEFAULT_BREAKERS) if breakers is None else breakers
    if not isinstance(breakers, list) or not all(isinstance(breaker, str) for breaker in breakers):
        raise ApiError(400, "'dry_sequence_breakers' must be an array of strings", param="dry_sequence_breakers")
    base, allowed, last_n = number(body, "dry_base"), integer(body, "dry_allowed_length"), \
        integer(body, "dry_penalty_last_n")
    default = DryPenalty(multiplier)
    return DryPenalty(multiplier, default.base if base is None else base,
                      default.allowed_length if allowed is None else allowed,
                      default.last_n if last_n is None else last_n, tuple(breakers))


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias` ({"token id": bias}) or llama-server's ([[token id, bias or false], ...]; false bans:
    -100), each bias in [-100, 100]; () for none (400 on anything else)."""
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list) or not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in pairs):
        raise ApiError(400, "'logit_bias' must map token ids to biases: {\"123\": -100} (or [[123, -100], ...])",
                       param="logit_bias")
    chosen: dict[int, float] = {}
    for token, bias in pairs:
        token = int(token) if isinstance(token, str) and token.isascii() and token.isdigit() and len(token) < 12 \
            else token
        bias = -100.0 if bias is False else bias
        if not is_int(token) or token < 0 or isinstance(bias, bool) or not isinstance(bias, (int, float)) or \
                not -100 <= bias <= 100:
            raise ApiError(400, f"'logit_bias' takes token ids >= 0 with biases in [-100, 100], got {token!r}: "
                           f"{bias!r}", param="logit_bias")
        chosen[int(token)] = float(bias)
    return tuple(chosen.items())
