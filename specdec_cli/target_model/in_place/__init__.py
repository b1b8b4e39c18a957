"""A GGUF loaded in place: the file checked before any slow work (gguf_check), the cache that holds
its repacked blocks, stored config and tokenizer and proves itself on every load (gguf_cache,
gguf_blocks, stored, native_tokenizer), and the model built on the mapping (gguf_model).
Stands on gguf/ and native/; load/ and verify/ stand on it.
"""
