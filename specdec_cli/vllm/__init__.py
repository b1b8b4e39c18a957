"""specdec inside vLLM: its drafters as vLLM speculative proposers, vLLM in a child process for batched greedy
answers, and `specdec serve` (vLLM's OpenAI-compatible server).

Importing this package does not import vLLM; only the functions that run it do. `import vllm` in these modules is
vLLM itself (absolute imports), not this package.
"""
