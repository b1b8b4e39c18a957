"""The llama.cpp reference rows: llama.cpp's own decoding of the same GGUF file on the same prompts.

`llama.cpp` is its plain decoding, `llama.cpp-pld` its prompt lookup decoding (llama-cpp-python's
`LlamaPromptLookupDecoding`, PLD_TOKENS drafted tokens), both through llama-cpp-python (an optional dependency that
pip builds from source: `pip install llama-cpp-python`). They read the GGUF the target was loaded from, with as many
threads as specdec's kernels use, and are timed as the engine's runs are (prompt processing included). llama.cpp
computes with its own kernels and summation order, so its greedy output may differ from specdec's at a near-tie:
identity with the `none` row is reported as measured. Without llama-cpp-python, or for a target that is not a
.gguf file, `unavailable` says why in one line and the bench runs without these rows.
"""

from __future__ import annotations

import time
from typing import Any, Optional

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_PLD = "llama.cpp-pld"
PLD_TOKENS = 10
BATCH_TOKENS = 4096  # prompt tokens llama.cpp takes in one batch (the longest prompt it is given)
INSTALL = "pip install llama-cpp-python (builds llama.cpp from source: 10+ minutes on 2 cores)"


def unavailable(gguf_path: Optional[str]) -> Optional[str]:
    """Why the llama.cpp rows cannot run here (None: they can)."""
    if gguf_path is None:
        return "the target is not a .gguf file"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return f"llama-cpp-python is not installed ({INSTALL})"
    return None


class LlamaCpp:
    """One llama.cpp model (plain, or with prompt lookup drafting) over a GGUF file, made on first use."""

    def __init__(self, gguf_path: str, threads: int, pld: bool):
        self.gguf_path, self.threads, self.pld = gguf_path, threads, pld
        self._llm: Any = None

    def _model(self) -> Any:
        if self._llm is None:
            import llama_cpp

            extra: dict = {}
            if self.pld:
                from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

                extra["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS)
            # n_batch: llama-cpp-python's prompt lookup fails on a prompt longer than one batch (its default, 512).
            self._llm = llama_cpp.Llama(model_path=self.gguf_path, n_threads=self.threads,
                                        n_threads_batch=self.threads, n_ctx=0, n_batch=BATCH_TOKENS, verbose=False,
                                        **extra)
        return self._llm

    def generate(self, prompt_ids: list[int], config: Any) -> tuple:
        """-> (tokens, seconds, ttft, finish_reason, None), timed like the engine's generations."""
        llm = self._model()
        if len(prompt_ids) + config.max_new_tokens > llm.n_ctx() or len(prompt_ids) > BATCH_TOKENS:
            raise ValueError(f"llama.cpp's context ({min(llm.n_ctx(), BATCH_TOKENS)}) is too short for this prompt")
        eos = set(config.eos_token_ids)
        sampling = ({"temp": 0.0, "top_k": 1} if config.greedy else
                    {"temp": config.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0})
        if config.seed is not None and not config.greedy:
            llm.set_seed(config.seed)
        tokens: list[int] = []
        ttft: Optional[float] = None
        started = time.perf_counter()
        for token in llm.generate(list(prompt_ids), reset=True, repeat_penalty=1.0, **sampling):
            if ttft is None:
                ttft = time.perf_counter() - started
            tokens.append(int(token))
            if token in eos or len(tokens) >= config.max_new_tokens:
                break
        seconds = time.perf_counter() - started
        finish = "eos" if tokens and tokens[-1] in eos else "length"
        return tokens, seconds, ttft, finish, None
