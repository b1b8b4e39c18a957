"""Finding and loading the target (the top wing): resolving a name or file, the load plan and its ways of
loading (a GGUF in place through in_place/, a GGUF converted for transformers, a Hugging Face model),
the tokenizer, and a loaded model put on block weights (converted_blocks, weights_cache).
Stands on every other wing; no wing imports it.
"""
