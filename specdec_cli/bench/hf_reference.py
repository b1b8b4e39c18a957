"""The reference rows: transformers' own `generate` (`hf`) and its prompt lookup decoding (`hf-pld`), timed
the way the engine's runs are (device synchronised, time to first token from a streamer).

specdec's engine is not involved: these rows show where plain transformers stands on the same prompts.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .methods import HF_PLD_TOKENS


def synchronize(device: Any) -> None:
    """Wait for queued GPU work, so a timer read after it measures the work (no-op on a CPU)."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.synchronize()


def hf_generate(model: Any, tokenizer: Any, prompt_ids: list[int], config: Any, pld: bool):
    """-> (tokens, seconds, ttft, finish_reason, None): one `model.generate` call, timed like the engine's."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    device = next(model.parameters()).device

    class FirstTokenClock(BaseStreamer):
        """generate() puts the prompt first, then new tokens: the second put is the first token."""

        def __init__(self) -> None:
            self.calls = 0
            self.at: Optional[float] = None

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2 and self.at is None:
                self.at = time.perf_counter()

        def end(self) -> None:
            pass

    eos = list(config.eos_token_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    kwargs: dict = dict(max_new_tokens=config.max_new_tokens, min_new_tokens=0, eos_token_id=eos or None,
                        pad_token_id=pad, use_cache=True)
    if config.greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, temperature=config.temperature, top_p=1.0, top_k=0)
        if config.seed is not None:
            torch.manual_seed(config.seed)
    if pld:
        kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    input_ids = torch.tensor([prompt_ids], device=device)  # [1, n]
    clock = FirstTokenClock()
    synchronize(device)
    with torch.inference_mode():
        started = time.perf_counter()
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs)
        tokens = output[0, len(prompt_ids):].tolist()
        synchronize(device)
        seconds = time.perf_counter() - started
    ttft = clock.at - started if clock.at is not None else None
    finish = "eos" if tokens and tokens[-1] in eos else "length"
    return tokens, seconds, ttft, finish, None
